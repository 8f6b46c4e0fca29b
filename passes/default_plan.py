"""PyTorch's default partitioner's choice, as a legal adacc plan.

Reads: the plan problem and the names of the values PyTorch's min-cut
partitioner would save for the same joint graph
(`compat.default_saved_values`). Writes nothing.

Why: it anchors ratio budgets (1.0 = what the default holds) and it is a
plan adacc can fall back to at that budget, so that at 1.0 adacc is never
worse than the default in memory or estimated time. The default saves a
set of values and recomputes everything else the backward needs from them;
where adacc's rules forbid a recomputation the default would make (a
random op, a value read after the forward mutated its input, a block
boundary), the value is kept instead.
"""

from __future__ import annotations

from typing import Iterable

from .greedy import _make_available, _Stuck
from .plan_problem import Choice, Decision, PlanProblem, PlanSolution


def default_plan(problem: PlanProblem, saved: Iterable[str]) -> PlanSolution | None:
    """The plan that keeps ``saved`` (where keeping is legal) and recomputes
    the rest; None if no legal plan completes it."""
    saved = set(saved)
    by_name = problem.by_name()
    state: dict[str, Choice] = {}
    for cand in problem.candidates:
        if cand.name in saved and cand.can_keep:
            state[cand.name] = Choice(decision=Decision.KEEP)
    try:
        for cand in problem.candidates:
            if cand.required:
                _make_available(cand.name, by_name, state, prefer_keep=False)
    except _Stuck:
        return None
    return PlanSolution(choices=state, status="default", solver="torch_min_cut")
