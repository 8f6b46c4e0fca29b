"""Recompute ahead in one process: a GPT stage compiled through
`RecomputeAheadBackend`, two micro-batches, the first one's recomputation
run before its backward is called. Gradients equal eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adacc_compile.pipelining.backward_split import split_backward
from adacc_examples.gpt_stages import gpt_stages
from adacc_compile.pipelining.recompute_ahead import RecomputeAheadBackend
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import EAGER_REL, relative_error


def _loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@pytest.mark.slow  # ~10 s of compiling; the 2-rank pipeline test covers the same path by default
def test_prologue_ahead_then_backward_matches_eager():
    cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64)
    model = init_weights(GPT(cfg), seed=0)
    idx, targets = gpt_batch(cfg, 4, torch.Generator().manual_seed(0))
    (model(idx, targets)).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    (stage,) = gpt_stages(model, [])
    backend = RecomputeAheadBackend({"memory_budget": 0.8, "device_profile": "h100", "accuracy": "lossless"})
    compiled = torch.compile(stage, backend=backend)
    losses = [_loss(compiled(i), t) / 2 for i, t in zip(idx.chunk(2), targets.chunk(2))]
    assert backend.recompute_ahead() > 0  # micro-batch 0's prologue results are held
    losses[0].backward()
    assert backend.held_bytes == 0  # the backward took them
    losses[1].backward()  # on demand: the plan's original backward graph
    assert [(e.microbatch, e.ahead) for e in backend.events] == [(0, True)]
    (summary,) = backend.reports
    assert summary["summary"]["decisions"]["recompute"] > 0
    (split,) = backend.split_summary()
    assert split["prologue_nodes"] > 0
    for name, param in model.named_parameters():
        assert relative_error(param.grad, expected[name]) <= EAGER_REL, name


def test_split_backward_prologue_reads_no_tangent():
    """A hand-built backward: ``y = saved.cos()`` needs no gradient (the
    prologue), ``out = tangent * y`` does (the epilogue)."""
    import torch.fx as fx

    graph = fx.Graph()
    saved = graph.placeholder("saved")
    tangent = graph.placeholder("tangents_1")
    y = graph.call_function(torch.ops.aten.cos.default, (saved,))
    out = graph.call_function(torch.ops.aten.mul.Tensor, (tangent, y))
    graph.output((out,))
    split = split_backward(fx.GraphModule(torch.nn.Module(), graph))
    assert split is not None and split.num_saved == 1 and split.held == ["cos_default"]
    assert [n.name for n in split.prologue.graph.nodes] == ["saved", "cos_default", "output"]
    epilogue_ops = [n.target for n in split.epilogue.graph.nodes if n.op == "call_function"]
    assert epilogue_ops == [torch.ops.aten.mul.Tensor]
    s, t = torch.randn(3), torch.randn(3)
    (ahead,) = split.prologue(s)
    torch.testing.assert_close(split.epilogue(s, t, ahead)[0], t * s.cos())


def test_split_backward_cap_takes_first_needed_values_only():
    """Two independent recomputations; the backward needs ``b`` first. A
    cap of one value's bytes runs ``b`` ahead and leaves ``a`` in place."""
    import torch.fx as fx
    from torch._subclasses import FakeTensorMode

    graph = fx.Graph()
    saved = graph.placeholder("saved")
    tangent = graph.placeholder("tangents_1")
    a = graph.call_function(torch.ops.aten.cos.default, (saved,))
    b = graph.call_function(torch.ops.aten.sin.default, (saved,))
    first = graph.call_function(torch.ops.aten.mul.Tensor, (tangent, b))
    second = graph.call_function(torch.ops.aten.mul.Tensor, (first, a))
    graph.output((second,))
    with FakeTensorMode():
        for node in (saved, tangent, a, b, first, second):
            node.meta["val"] = torch.empty(4)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    capped = split_backward(gm, max_ahead_bytes=16)
    assert capped is not None and capped.held == ["sin_default"] and capped.held_bytes == 16
    assert capped.independent_nodes == 2 and capped.prologue_nodes == 1
    s, t = torch.randn(4), torch.randn(4)
    (ahead,) = capped.prologue(s)
    torch.testing.assert_close(capped.epilogue(s, t, ahead)[0], t * s.sin() * s.cos())
    uncapped = split_backward(gm)
    assert uncapped is not None and sorted(uncapped.held) == ["cos_default", "sin_default"]
