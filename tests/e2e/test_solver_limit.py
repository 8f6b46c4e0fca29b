"""A solver that stops at its time limit before any plan still plans: the
plan that recomputes everything it may, legal and exact, checked against
the budget like any plan (a warning gives any excess), in at most two HiGHS
solves per graph (the budget's fastest plan, then the plan itself: a
corrective re-solve under the same limit would stop again)."""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_test_utils import EAGER_REL, assert_same, build, compile_with_reports, loss_and_grads


@pytest.mark.parametrize("budget", [0.5, 1.0])
def test_a_time_limit_without_a_plan_still_plans_exactly_in_two_solves(budget):
    model, batch = build("llama")
    expected = loss_and_grads(model, model, *batch)
    torch._dynamo.reset()
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": budget, "device_profile": "h100", "solver_time_limit_s": 1e-6}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = loss_and_grads(model, compiled, *batch)
    messages = [str(w.message) for w in caught if "adacc" in str(w.message)]
    summary = partitioner.reports[-1]["summary"]
    assert any("no plan" in m and "recomputes everything" in m for m in messages), messages
    assert summary["planning"]["solves"] <= 2, summary["planning"]
    assert summary["fits_budget"] or any("over the budget" in m for m in messages), (summary, messages)
    assert_same(expected, actual, rel=EAGER_REL)
