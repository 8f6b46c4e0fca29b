"""Plan determinism: same graph + options -> the same plan, byte for byte,
and the plan problem survives the JSON trip ranks share it through."""

from __future__ import annotations

import dataclasses

import torch

from adacc_examples.models import MLP, init_weights
from adacc_compile.passes.plan_problem import (
    Candidate,
    Choice,
    CommWindow,
    CompressOption,
    Decision,
    PlanProblem,
    PlanSolution,
)
from adacc_compile.plan_agreement import plan_fingerprint, problem_from_json, problem_to_json
from adacc_test_utils import compile_with_reports, loss_and_grads

OPTIONS = {"memory_budget": 0.3, "device_profile": "h100"}


def _plan_of_fresh_compile():
    torch._dynamo.reset()
    model = init_weights(MLP(d_in=8, d_hidden=32, depth=3))
    batch = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.randn(4))
    compiled, partitioner = compile_with_reports(model, "adacc_eager", OPTIONS)
    loss_and_grads(model, compiled, *batch)
    return partitioner.reports[-1]["summary"]


def test_same_graph_and_options_give_the_same_plan_hash():
    first, second = _plan_of_fresh_compile(), _plan_of_fresh_compile()
    assert first["decisions"]["recompute"] > 0
    assert len(first["plan_hash"]) == 64
    assert first["plan_hash"] == second["plan_hash"]
    assert first["plan_hash_checked_ranks"] == []  # not distributed: nothing to compare


def test_fingerprint_sees_decisions_windows_and_order():
    problem = PlanProblem(candidates=(Candidate(name="a", keep_bytes=4, recompute_seconds=1e-6, required=True),))
    keep = PlanSolution(choices={"a": Choice(decision=Decision.KEEP)}, status="x", solver="x")
    rec = PlanSolution(choices={"a": Choice(decision=Decision.RECOMPUTE)}, status="x", solver="x")
    gm = torch.fx.symbolic_trace(lambda x: x.relu().sin())
    text, digest = plan_fingerprint(problem, keep, {}, [gm])
    assert plan_fingerprint(problem, keep, {}, [gm]) == (text, digest)
    assert plan_fingerprint(problem, rec, {}, [gm])[1] != digest
    assert plan_fingerprint(problem, rec, {"a": "w"}, [gm])[1] != plan_fingerprint(problem, rec, {}, [gm])[1]
    other = torch.fx.symbolic_trace(lambda x: x.sin().relu())
    assert plan_fingerprint(problem, keep, {}, [other])[1] != digest


def test_problem_json_round_trip():
    problem = PlanProblem(
        candidates=(
            Candidate(name="a", keep_bytes=4, recompute_seconds=1e-6, windows=("w",)),
            Candidate(
                name="b",
                keep_bytes=8,
                recompute_seconds=0.1 + 0.2,  # not exactly representable: must survive as is
                inputs=("a",),
                required=True,
                compress=(CompressOption(codec="bitmask", nbytes=1, seconds=3e-7),),
                block="layers.0",
            ),
        ),
        budget_bytes=12,
        windows=(CommWindow(name="w", seconds=2.5e-5, opens=7),),
    )
    assert problem_from_json(problem_to_json(problem)) == problem
    assert problem_from_json(problem_to_json(dataclasses.replace(problem, budget_bytes=None))).budget_bytes is None
