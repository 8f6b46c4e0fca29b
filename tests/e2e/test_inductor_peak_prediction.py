"""The plan's predicted step peak against the peak measured under Inductor.

The predicted peak is what the budget constrains, so it must describe the
code Inductor generates, not only the op-by-op graph: Inductor computes a
fused value where the kernel it joins runs (what it reads lives until
then), reuses freed buffers and fuses kernels across the plan's order
unless told not to. Before the memory model and the compile settings took
these into account, a recompute-only plan on the Llama below measured
31.3 MiB against a predicted 19.2 (bench/RESULTS.md).
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

from adacc_compile.measure import measure_peak_bytes
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights
from adacc_test_utils import compile_with_reports

MODELS = {
    "llama": lambda: Llama(LlamaConfig(n_layer=2, d_model=128, n_head=4, seq_len=128, vocab_size=256, ffn_dim=341)),
    "gpt": lambda: GPT(GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=128, vocab_size=256, dropout=0.1)),
}


@pytest.mark.parametrize("budget", [0.5, pytest.param(0.35, marks=pytest.mark.slow)])  # 0.35: 45 s, slow
@pytest.mark.parametrize("name", ["gpt", pytest.param("llama", marks=pytest.mark.slow)])  # llama: 21 s
def test_recompute_plan_peak_under_inductor_is_predicted(name, budget):
    torch.manual_seed(0)
    model = init_weights(MODELS[name]())
    batch = gpt_batch(model.cfg, 4, torch.Generator().manual_seed(0))
    compiled, partitioner = compile_with_reports(
        model, "adacc", {"memory_budget": budget, "codecs": (), "device_profile": "h100"}
    )
    with inductor_config.patch(fallback_random=True):
        compiled(*batch).backward()  # compiles
        model.zero_grad(set_to_none=True)
        measured = measure_peak_bytes(lambda: compiled(*batch).backward())
    predicted = sum(r["summary"]["predicted_peak_bytes"] for r in partitioner.reports)
    assert abs(predicted - measured) <= 0.08 * measured, (predicted, measured)


class _LargeVocabularyLM(torch.nn.Module):
    """One MLP block under a 5000-word output layer: the loss's logits and
    their gradient, and the embedding's gradient table, dominate the step."""

    def __init__(self, vocab: int = 5000, d: int = 64) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.out = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.fc2(torch.nn.functional.gelu(self.fc(self.norm(h))))
        return torch.nn.functional.cross_entropy(self.out(h).flatten(0, 1).float(), labels.flatten())


def test_a_large_vocabulary_step_is_predicted():
    """Inductor inlines the log-probabilities into the gather of the targets,
    fills the embedding's gradient table inside its scatter and writes the
    logits' gradient into the logits: the model once counted all three as
    buffers of their own and predicted 83.7 MiB for a step that peaks at
    45.8 (on an H200, 1081 MB for 731 MB)."""
    torch.manual_seed(0)
    model = _LargeVocabularyLM()
    gen = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(0, 5000, (8, 256), generator=gen) for _ in range(2))
    compiled, partitioner = compile_with_reports(model, "adacc", {"memory_budget": 1.0, "device_profile": "h100"})
    compiled(ids, labels).backward()  # compiles
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: compiled(ids, labels).backward())
    predicted = sum(r["summary"]["predicted_peak_bytes"] for r in partitioner.reports)
    assert abs(predicted - measured) <= 0.03 * measured, (predicted, measured)


# ~60-77 s each: slow, so the default run keeps its 15 minutes; the default run
# checks Inductor's prediction on the recompute plans above and compress-only
# plans' on their split graphs (test_compressed_value_memory).
@pytest.mark.parametrize("views_early", [pytest.param(True, marks=pytest.mark.slow), pytest.param(False, marks=pytest.mark.slow)])
def test_a_compress_only_plan_with_backward_only_views_is_predicted(views_early):
    """A GPT's compress-only plan compresses views only the backward reads
    (the attention probabilities' and the weights' transposes). Taken
    where the forward is done with their bases (the default, with the
    computed backward-only values placed where Inductor computes them), they are
    compressed there and the step is predicted to within 1%; left at the
    forward's end, the model keeps all their compress chains in the
    forward's last kernel group, where Inductor's peak-memory reorder does
    not (predicted 1.47x the measured peak at d_model 128)."""
    import warnings

    torch.manual_seed(0)
    model = init_weights(MODELS["gpt"]())
    batch = gpt_batch(model.cfg, 4, torch.Generator().manual_seed(0))
    options = {
        "memory_budget": 0.4, "accuracy": "aggressive", "allow_recompute": False, "device_profile": "h100",
        "place_backward_only_views_early": views_early,
        # computed values moved early move views too: off in the joint-order case
        "place_backward_only_early": views_early,
    }
    compiled, partitioner = compile_with_reports(model, "adacc", options)
    with inductor_config.patch(fallback_random=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the budget may sit below the compress-only minimum: clamped
        compiled(*batch).backward()  # compiles
        model.zero_grad(set_to_none=True)
        measured = measure_peak_bytes(lambda: compiled(*batch).backward())
    predicted = sum(r["summary"]["predicted_peak_bytes"] for r in partitioner.reports)
    if views_early:
        assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)
    else:  # an upper bound, far above: what the default placement removes
        assert predicted > 1.2 * measured, (predicted, measured)
