"""Turning the user's budget into bytes, and knowing what is reachable.

A ratio budget is relative to what the runtime-optimal plan saves, so that
1.0 means "no memory pressure" on any model. Two auxiliary solves give the
anchors: the smallest footprint among time-optimal plans (the baseline) and
the smallest footprint of any legal plan (the reachable minimum). A budget
below the minimum is an error or, by default, a warning and the
minimum-memory plan: training still runs and the user is told the number.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from adacc_compile.config import MemoryBudget

from .milp import SolverOptions, solve_milp
from .plan_problem import InfeasibleBudgetError, PlanProblem, added_seconds, saved_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetResolution:
    budget_bytes: int
    """The cap the planner uses."""
    requested_bytes: int
    """What the user's budget resolves to (may be below the minimum)."""
    baseline_saved_bytes: int
    """Saved bytes of the runtime-optimal plan (smallest such footprint)."""
    minimum_bytes: int
    """Smallest footprint any legal plan reaches."""
    clamped: bool = False


def resolve_budget(
    problem: PlanProblem, budget: MemoryBudget, options: SolverOptions, *, on_infeasible: str
) -> BudgetResolution:
    unconstrained = dataclasses.replace(problem, budget_bytes=None)
    fastest = solve_milp(unconstrained, options)
    if fastest.status == "infeasible":
        raise ValueError(f"adacc: no legal plan exists for this graph: {fastest.notes}")
    best_time = added_seconds(problem, fastest)
    lean_fastest = solve_milp(unconstrained, options, minimize="bytes", time_cap_s=best_time)
    baseline = saved_bytes(problem, lean_fastest if lean_fastest.choices else fastest)
    minimum = saved_bytes(problem, solve_milp(unconstrained, options, minimize="bytes"))
    requested = budget.resolve(baseline)
    if requested >= minimum:
        return BudgetResolution(
            budget_bytes=requested,
            requested_bytes=requested,
            baseline_saved_bytes=baseline,
            minimum_bytes=minimum,
        )
    error = InfeasibleBudgetError(requested, minimum)
    if on_infeasible == "error":
        raise error
    warnings.warn(
        f"adacc: {error.args[0].split(';')[0]}; using the minimum-memory plan "
        f"({minimum} bytes) instead",
        stacklevel=2,
    )
    return BudgetResolution(
        budget_bytes=minimum,
        requested_bytes=requested,
        baseline_saved_bytes=baseline,
        minimum_bytes=minimum,
        clamped=True,
    )
