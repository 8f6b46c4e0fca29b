"""PyTorch's default partitioner's choice as an adacc plan: what it saves
is kept (the ratio anchor and the fallback at budget 1.0), including where
it saves a view that adacc keeps through the viewed value."""

from __future__ import annotations

import torch

aten = torch.ops.aten

from adacc_compile import compat
from adacc_compile.passes.default_plan import default_plan
from adacc_compile.passes.plan_problem import Candidate, Decision, Lifetime, PlanProblem


def _cand(name: str, *, inputs=(), required=False, can_keep=True, alias_of="", seconds=1e-3) -> Candidate:
    lifetime = Lifetime(produced=0, forward_last_use=0, alias_of=alias_of, reads=(0,) if required else ())
    return Candidate(name=name, keep_bytes=64, recompute_seconds=seconds, inputs=tuple(inputs),
                     required=required, can_keep=can_keep, lifetime=lifetime)


def _attention_like() -> PlanProblem:
    """scores = q @ k (a matmul), probs = softmax(scores), and the backward
    reading a transpose of probs (a view adacc recomputes, never keeps)."""
    return PlanProblem(candidates=(
        _cand("scores", seconds=4e-3),
        _cand("probs", inputs=("scores",), seconds=1e-3),
        _cand("probs_t", inputs=("probs",), required=True, can_keep=False, alias_of="probs", seconds=0.0),
    ))


def test_a_saved_view_keeps_the_value_it_views():
    plan = default_plan(_attention_like(), ["probs_t"])
    assert plan is not None
    assert plan.decision("probs") is Decision.KEEP
    assert plan.decision("probs_t") is Decision.RECOMPUTE  # the view, for free
    assert plan.decision("scores") is Decision.NONE  # no matmul recomputed


def test_a_saved_view_of_a_view_keeps_the_storage_owner():
    problem = PlanProblem(candidates=(
        *_attention_like().candidates,
        _cand("probs_tt", inputs=("probs_t",), required=True, can_keep=False, alias_of="probs_t", seconds=0.0),
    ))
    plan = default_plan(problem, ["probs_tt"])
    assert plan is not None and plan.decision("probs") is Decision.KEEP
    assert plan.decision("scores") is Decision.NONE


def test_what_is_not_saved_is_recomputed_from_what_is():
    plan = default_plan(_attention_like(), ["scores"])
    assert plan is not None
    assert plan.decision("scores") is Decision.KEEP
    assert plan.decision("probs") is Decision.RECOMPUTE


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        probs = (q @ k.transpose(-1, -2)).softmax(-1)
        return (probs @ v).sum()


def test_pytorchs_choice_on_attention_recomputes_no_matmul():
    """On a real joint graph PyTorch saves transposes of the attention
    inputs and probabilities; as an adacc plan (the pipeline's anchor) that
    recomputes no matmul, as PyTorch's min cut never does."""
    from adacc_test_utils import compile_capturing

    model = _Attention()
    compiled, states = compile_capturing(model, {"memory_budget": 1.0})
    compiled(torch.randn(2, 16, 32, requires_grad=True)).backward()
    (state,) = states
    plan = state.default_plan
    assert plan is not None
    saved = {n.name for n in compat.default_saved_values(state.joint, state.info)}
    assert any(n.startswith(("transpose", "permute", "t_", "detach")) for n in saved), saved  # the premise
    matmuls = {aten.mm.default, aten.bmm.default, aten.addmm.default}
    nodes = {n.name: n for n in state.joint.graph.nodes}
    recomputed = [n for n, c in plan.choices.items() if c.decision is Decision.RECOMPUTE]
    assert not [n for n in recomputed if nodes[n].target in matmuls], recomputed
