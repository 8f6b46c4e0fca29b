"""A drift that new codec parameters fix is fixed without recompiling.

fp8 with a calibrated scale, then one layer norm's weight 1e4x (the
catastrophic drift of `test_adaptation`): the stale scale saturates the
codes, the check at the next step boundary fires at once, new scales
measured on that call's inputs bring every compressed value back within
its bound, and they are copied into the compiled graph's constants. The
graph compiled once; the plan version records the swap; the gradients of
the next step agree with eager's within the codec's bound again (they do
not with the stale scale). Under Inductor too: its 1-element constants
would otherwise be inlined into the generated code, where no copy reaches
them."""

from __future__ import annotations

import copy

import pytest
import torch

from adacc_compile.adaptation import graphs_of
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import compile_with_reports

CFG = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=64, dropout=0.0)
FP8 = {
    "memory_budget": 0.5, "accuracy": "aggressive", "codecs": ("fp8_e5m2",), "allow_recompute": False,
    "device_profile": "h100", "adapt": True, "adapt_every": 3, "adapt_patience": 2,
}
BOUND = 0.06  # fp8_e5m2's declared relative error


def blow_up(model: GPT) -> None:
    with torch.no_grad():
        model.blocks[1].ln_2.weight.mul_(1e4)


def _gradient_error(model: GPT, compiled, batch) -> float:
    """Relative error of the whole gradient of one compiled step against
    an eager step of a copy with the same weights."""
    reference = copy.deepcopy(model)
    reference(*batch).backward()
    compiled(*batch).backward()
    want = torch.cat([p.grad.flatten() for p in reference.parameters()])
    got = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    return ((got - want).norm() / want.norm()).item()


def _run(backend: str, options: dict):
    torch.manual_seed(0)
    model = init_weights(GPT(CFG))
    compiled, partitioner = compile_with_reports(model, backend, options)
    generator = torch.Generator().manual_seed(0)
    batches = [gpt_batch(CFG, 2, generator) for _ in range(4)]
    for step in range(5):  # calls 1-5; the check at call 6 sees the drift
        compiled(*batches[step % 4]).backward()
        model.zero_grad()
    blow_up(model)
    error = _gradient_error(model, compiled, batches[0])  # call 6: the check runs before the step
    return model, partitioner, error


@pytest.mark.parametrize("backend", ["adacc_eager", pytest.param("adacc", marks=pytest.mark.slow)])
def test_stale_scales_are_recalibrated_in_place_without_a_recompile(backend):
    model, partitioner, error = _run(backend, FP8)
    graph = graphs_of(model)[0]
    fired = [c for c in graph.checks if c.drifts]
    assert [(c.step, c.action) for c in fired] == [(6, "recalibrate")], [(c.step, c.drifts) for c in graph.checks]
    assert graph.compiles == 1 and len(partitioner.reports) == 1
    swap = graph.versions[1]
    assert swap.trigger == "drift" and not swap.recompiled and swap.step == 6
    assert swap.changed and set(swap.changed.values()) == {"parameters recalibrated"}
    assert any("error" in r for r in swap.reasons), swap.reasons
    assert error <= BOUND, error


def test_without_the_swap_the_stale_scales_break_the_gradients():
    """The same run checking too late to act: what the swap prevents."""
    _, _, error = _run("adacc_eager", {**FP8, "adapt_every": 1000})
    assert error > 5 * BOUND, error
