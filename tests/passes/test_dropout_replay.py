"""Dropout's output rewritten as ``input * mask * scale``: the same values
bit for bit, and the planner may then recompute it from the mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile.passes.dropout_replay import replay_dropout_from_masks
from adacc_test_utils import EAGER_REL, assert_same, compile_capturing, loss_and_grads

aten = torch.ops.aten


def _traced(p: float, train: bool = True):
    def f(x):
        out, mask = aten.native_dropout(x, p, train)
        return out.sin() * 2, mask

    return make_fx(f)(torch.randn(4, 33))


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_rewritten_dropout_gives_the_same_bits(p):
    gm = _traced(p)
    torch.manual_seed(3)
    x = torch.randn(64, 257) * 10
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    torch.manual_seed(7)
    expected = gm(x)
    assert replay_dropout_from_masks(gm) == 1
    assert not any(n.target is __import__("operator").getitem and n.args[1] == 0 for n in gm.graph.nodes
                   if n.op == "call_function")
    torch.manual_seed(7)
    actual = gm(x)
    for e, a in zip(expected, actual):
        assert e.dtype == a.dtype and torch.equal(e.isnan(), a.isnan())
        assert torch.equal(e.nan_to_num(), a.nan_to_num())


def test_evaluation_dropout_is_left_alone():
    gm = _traced(0.1, train=False)
    assert replay_dropout_from_masks(gm) == 0


class _AttentionDropout(nn.Module):
    """Softmax probabilities through dropout into a matmul: the value a
    plan could only keep while dropout was one random node."""

    def __init__(self, d: int = 32, blocks: int = 3):
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(blocks))

    def forward(self, x):
        for proj in self.proj:
            h = proj(x)
            probs = F.dropout(torch.softmax(h @ h.transpose(-1, -2), -1), 0.2, self.training)
            x = x + probs @ h
        return x.square().mean()


def test_tight_plan_recomputes_dropout_output_and_gradients_match_eager():
    torch.manual_seed(0)
    model = _AttentionDropout()
    x = torch.randn(4, 16, 32)
    expected = loss_and_grads(model, model, x)
    from adacc_compile.passes.fusion import Realization

    # Planned as for Inductor (where the rewrite applies), run op by op.
    compiled, states = compile_capturing(
        model, {"memory_budget": 0.05, "on_infeasible": "warn"}, mode=Realization.INDUCTOR
    )
    with pytest.warns(UserWarning, match="reachable minimum"):
        actual = loss_and_grads(model, compiled, x)
    assert_same(expected, actual, rel=EAGER_REL)
    (state,) = states
    products = {c.name for c in state.candidates.problem.candidates if c.name.startswith("mul_tensor")}
    recomputed = {n for n, c in state.solution.choices.items() if c.decision.value == "recompute"}
    assert products and products & recomputed, (products, recomputed)
