"""Relaxing a ratio budget's boundary share (`plan_search._relax_boundary`)
when HiGHS stops without a plan: the search must go on with a legal plan
within the peak budget, never with an empty plan (a 2-layer GPT with codecs
at 0.3 raised "produced an illegal plan" once the least-bytes solve hit its
time limit)."""

from __future__ import annotations

import dataclasses

import pytest

from adacc_compile.passes import peak_model, plan_search
from adacc_compile.passes.budget import BudgetResolution, lowest_peak_plan, modelled_peak
from adacc_compile.passes.milp import SolverOptions
from adacc_compile.passes.plan_problem import (
    Candidate,
    Lifetime,
    PlanProblem,
    PlanSolution,
    StepLayout,
    check_solution,
    saved_bytes,
)

N = 4


def chain_problem() -> PlanProblem:
    """v0 -> v1 -> ... -> v3, each read once by the backward (in reverse);
    v0 cannot be recomputed, so every plan saves at least its 100 bytes."""
    cands = tuple(
        Candidate(
            name=f"v{i}", keep_bytes=100, recompute_seconds=1e-6 * (i + 1), keep_seconds=1e-8,
            inputs=(f"v{i - 1}",) if i else (), required=True, can_keep=True, can_recompute=i > 0,
            lifetime=Lifetime(
                produced=i, forward_last_use=min(i + 1, N - 1), forward_always=True,
                forward_bytes=100, backward_bytes=100, reads=(N - 1 - i,),
            ),
        )
        for i in range(N)
    )
    layout = StepLayout(
        forward_positions=N, backward_positions=N, forward_base=(0,) * N,
        forward_layers=("",) * N, backward_layers=("",) * N,
    )
    bare = PlanProblem(candidates=cands, layout=layout)
    return dataclasses.replace(bare, memory=peak_model.build_memory_model(bare))


def budget_of(peak: int, boundary: int) -> BudgetResolution:
    return BudgetResolution(
        budget_bytes=peak, boundary_bytes=boundary, requested_bytes=peak, default_peak_bytes=10 * peak,
        default_saved_bytes=10 * boundary, fastest_seconds=0.0, fastest_peak_bytes=10 * peak, minimum_bytes=None,
    )


@pytest.fixture
def least_bytes_solve_times_out(monkeypatch):
    """HiGHS stops on its time limit without a plan, not even its start,
    wherever it looks for the fewest saved bytes."""
    solve = plan_search.solve_milp

    def stopped(problem, options=SolverOptions(), *, minimize="time", **kw):
        if minimize == "bytes":
            return PlanSolution(choices={}, status="Time limit reached", solver="milp")
        return solve(problem, options, minimize=minimize, **kw)

    monkeypatch.setattr(plan_search, "solve_milp", stopped)


def test_a_least_bytes_solve_without_a_plan_still_gives_a_legal_plan_within_the_peak(least_bytes_solve_times_out):
    problem = chain_problem()
    keep_all_peak = 400
    budget = budget_of(peak=keep_all_peak, boundary=1)  # no plan saves 1 byte: v0 alone is 100
    lowest = lowest_peak_plan(problem, SolverOptions())
    assert modelled_peak(problem, lowest) <= budget.budget_bytes  # the peak is in reach: the search relaxes
    relaxed, solution, notes = plan_search._relax_boundary(problem, budget, "milp", SolverOptions(), lowest)
    assert solution.choices, solution.status
    assert relaxed.budget_bytes == budget.budget_bytes  # the peak budget stands
    capped = dataclasses.replace(problem, budget_bytes=relaxed.budget_bytes, boundary_budget_bytes=relaxed.boundary_bytes)
    assert check_solution(capped, solution) == []
    assert modelled_peak(problem, solution) <= budget.budget_bytes
    assert budget.boundary_bytes < saved_bytes(problem, solution) <= relaxed.boundary_bytes
    assert any("boundary cap is the least" in note for note in notes)
