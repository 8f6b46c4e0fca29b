"""Decision policies, registered by name.

A policy turns a `PlanProblem` into a `PlanSolution`; it never touches the
graph. Registering the baselines next to the MILP gives tests hand-made
decisions and gives `bench/` its baselines for free (STYLE.md point 3).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Callable

from .greedy import _make_available, _Stuck, solve_greedy
from .milp import SolverOptions, solve_milp
from .plan_problem import Choice, Decision, PlanProblem, PlanSolution

Policy = Callable[[PlanProblem, SolverOptions], PlanSolution]

log = logging.getLogger(__name__)


def milp_policy(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """HiGHS. Where it stops without a plan (its time limit before any
    incumbent), the plan that recomputes everything it may: legal, the
    least memory a plan of one pass holds, and found in one pass over the
    candidates, where the greedy search it replaced re-evaluated the whole
    peak model once per trial move (over 25 minutes on a 32-layer Llama).
    The plan search then checks it against the budget like any plan, and
    warns where it is over. Greedy remains for a problem where recomputing
    everything is not legal."""
    solution = solve_milp(problem, options)
    if solution.status in ("optimal", "time_limit", "node_limit", "feasible", "infeasible"):
        if solution.status == "time_limit":
            warnings.warn(
                f"adacc: HiGHS hit its {options.time_limit_s:g} s time limit; using its best "
                f"plan so far, which another process may not reach (raise solver_time_limit_s, "
                f"or lower solver_node_limit, {options.node_limit}, to stop at the same point in every process)",
                stacklevel=2,
            )
        elif solution.status == "node_limit":
            log.info("adacc: %s; using its best plan (solver_node_limit)", solution.notes[-1])
        return solution
    stopped = (
        f"adacc: HiGHS stopped with status {solution.status!r} and no plan after "
        f"{solution.solve_seconds:.1f} s (solver_time_limit_s={options.time_limit_s:g})"
    )
    everything = recompute_all_policy(problem, options)
    if everything.choices or not problem.candidates:
        warnings.warn(f"{stopped}; using the plan that recomputes everything it may", stacklevel=2)
        return dataclasses.replace(everything, notes=(*everything.notes, f"milp status {solution.status}"))
    warnings.warn(f"{stopped}; falling back to the greedy planner", stacklevel=2)
    fallback = solve_greedy(problem)
    return dataclasses.replace(fallback, notes=(*fallback.notes, f"milp status {solution.status}"))


def greedy_policy(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """Greedy; where its one-change-at-a-time search stops above a budget
    that a legal plan reaches (e.g. the reachable minimum the budget was
    clamped to), the MILP's plan is used instead, with a warning."""
    solution = solve_greedy(problem)
    if solution.status != "infeasible":
        return solution
    fallback = solve_milp(problem, options)
    if fallback.status == "infeasible":
        return solution
    warnings.warn(
        f"adacc: the greedy planner found no plan within {problem.budget_bytes} bytes; using the "
        f"MILP's plan (status {fallback.status})",
        stacklevel=2,
    )
    return dataclasses.replace(fallback, notes=(*fallback.notes, "greedy over budget"))


def keep_all_policy(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """Save everything the backward reads (no recomputation, ignores the budget)."""
    solution = solve_greedy(dataclasses.replace(problem, budget_bytes=None))
    return dataclasses.replace(solution, solver="keep_all", status="heuristic")


def recompute_all_policy(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """Recompute every value that may legally be recomputed (full activation
    checkpointing at op granularity); keep only what cannot be recomputed."""
    return _recomputing_the_rest(problem, {}, solver="recompute_all")


def _recomputing_the_rest(problem: PlanProblem, kept: dict[str, Choice], *, solver: str) -> PlanSolution:
    """``kept`` plus, for every value the backward reads, a recomputation
    from what is available (kept where it cannot be recomputed)."""
    by_name = problem.by_name()
    state = dict(kept)
    try:
        for cand in problem.candidates:
            if cand.required:
                _make_available(cand.name, by_name, state, prefer_keep=False)
    except _Stuck as stuck:
        return PlanSolution(choices={}, status="infeasible", solver=solver, notes=(str(stuck),))
    return PlanSolution(choices=state, status="heuristic", solver=solver)


def full_ac_policy(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """Full activation checkpointing per block, as Hugging Face's
    ``gradient_checkpointing_enable`` or `torch.utils.checkpoint` around each
    layer runs it: each block keeps what other parts of the step read from
    it (its output, the next block's input) and recomputes in its backward
    everything else that backward reads; values outside the blocks (the
    embedding, the head, the loss) are kept where the backward reads them.
    The baseline `tests/e2e/test_full_ac_plan.py` prices against full AC's
    measured step, and a planner of its own (``planner="full_ac"``). A graph
    without blocks (a loss after a graph break) keeps what its backward
    reads."""
    by_name = problem.by_name()
    read_across = {
        i for c in problem.candidates for i in c.inputs if i in by_name and by_name[i].block != c.block
    }
    kept = {
        cand.name: Choice(decision=Decision.KEEP)
        for cand in problem.candidates
        if cand.can_keep and ((not cand.block and cand.required) or (cand.block and cand.name in read_across))
    }
    return _recomputing_the_rest(problem, kept, solver="full_ac")


POLICIES: dict[str, Policy] = {
    "milp": milp_policy,
    "greedy": greedy_policy,
    "keep_all": keep_all_policy,
    "recompute_all": recompute_all_policy,
    "full_ac": full_ac_policy,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; valid planners: {sorted(POLICIES)}") from None
