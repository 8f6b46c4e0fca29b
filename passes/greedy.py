"""Greedy planner: the fallback when HiGHS hits its time limit without a
solution, and a baseline in benchmarks.

Starts from the runtime-optimal plan (keep everything the backward reads)
and, while the plan is over the budget (its modelled activation peak, or
its saved bytes for problems without a memory model), applies the single
change with the most saved bytes freed per second added: recompute a kept
value (making its inputs available, recursively, by recompute where legal,
else by keeping them) or compress it with one of its codecs.
"""

from __future__ import annotations

import time

from .plan_problem import (
    Candidate,
    Choice,
    Decision,
    PlanProblem,
    PlanSolution,
    added_seconds,
    saved_bytes,
)


def solve_greedy(problem: PlanProblem) -> PlanSolution:
    start = time.perf_counter()
    by_name = problem.by_name()
    state: dict[str, Choice] = {}
    try:
        for cand in problem.candidates:
            if cand.required:
                _make_available(cand.name, by_name, state, prefer_keep=True)
    except _Stuck as stuck:
        return PlanSolution(
            choices={}, status="infeasible", solver="greedy", notes=(str(stuck),)
        )
    budget = problem.budget_bytes
    while budget is not None and _over_budget(problem, state):
        best, best_score = None, 0.0
        current_bytes, current_time = _bytes(problem, state), _time(problem, state)
        for name, choice in list(state.items()):
            if choice.decision is not Decision.KEEP:
                continue
            for trial in _trials(by_name[name], by_name, state):
                freed = current_bytes - _bytes(problem, trial)
                if freed <= 0:
                    continue
                score = freed / (_time(problem, trial) - current_time + 1e-12)
                if score > best_score:
                    best, best_score = trial, score
        if best is None:
            break
        state = best
    fits = budget is None or not _over_budget(problem, state)
    return PlanSolution(
        choices=dict(state),
        status="greedy" if fits else "infeasible",
        solver="greedy",
        solve_seconds=time.perf_counter() - start,
    )


class _Stuck(Exception):
    pass


def _trials(cand: Candidate, by_name: dict[str, Candidate], state: dict[str, Choice]):
    if cand.can_recompute and not any(_gives_no_value(by_name, state, inp) for inp in cand.inputs):
        trial = dict(state)
        trial[cand.name] = Choice(decision=Decision.RECOMPUTE)
        try:
            for inp in cand.inputs:
                if inp in by_name:
                    _make_available(inp, by_name, trial, prefer_keep=False)
            yield trial
        except _Stuck:
            pass
    needed_as_value = any(
        c.decision is Decision.RECOMPUTE and cand.name in by_name[n].inputs for n, c in state.items()
    )
    for option in cand.compress:
        if needed_as_value and not option.feeds_recompute:
            continue
        trial = dict(state)
        trial[cand.name] = Choice(decision=Decision.COMPRESS, codec=option.codec)
        yield trial


def _gives_no_value(by_name: dict[str, Candidate], state: dict[str, Choice], name: str) -> bool:
    """True when ``name`` is compressed with a codec that may not feed a
    recomputation (lossy or few-bit)."""
    choice = state.get(name)
    if choice is None or choice.decision is not Decision.COMPRESS or name not in by_name:
        return False
    return not next(o.feeds_recompute for o in by_name[name].compress if o.codec == choice.codec)


def _make_available(
    name: str, by_name: dict[str, Candidate], state: dict[str, Choice], *, prefer_keep: bool
) -> None:
    """Gives ``name`` an option (and its inputs, recursively): keep where
    ``prefer_keep`` or where it cannot be recomputed, else recompute; a
    recomputation whose inputs cannot all be made available (e.g. a dropout
    mask's producer, which can be neither kept nor recomputed) falls back to
    keeping ``name``."""
    if name in state:
        return
    cand = by_name[name]
    if cand.can_keep and (prefer_keep or not cand.can_recompute):
        state[name] = Choice(decision=Decision.KEEP)
        return
    if cand.can_recompute and not any(_gives_no_value(by_name, state, i) for i in cand.inputs):
        trial = dict(state)
        trial[name] = Choice(decision=Decision.RECOMPUTE)
        try:
            for inp in cand.inputs:
                if inp in by_name:
                    _make_available(inp, by_name, trial, prefer_keep=prefer_keep)
        except _Stuck:
            pass
        else:
            state.update(trial)
            return
    if not cand.can_keep:
        raise _Stuck(f"{name} can be neither kept nor recomputed from available values")
    state[name] = Choice(decision=Decision.KEEP)


def _over_budget(problem: PlanProblem, state: dict[str, Choice]) -> bool:
    """Above the budget: the modelled activation peak where the problem has a
    memory model (the search itself frees saved bytes, the cheap proxy),
    else the saved bytes."""
    assert problem.budget_bytes is not None
    solution = PlanSolution(choices=state, status="", solver="")
    if problem.memory is not None:
        from .peak_model import decision_values, evaluate

        if evaluate(problem.memory, decision_values(problem, solution))[0] > problem.budget_bytes:
            return True
    total = saved_bytes(problem, solution)
    if problem.boundary_budget_bytes is not None and total > problem.boundary_budget_bytes:
        return True
    return problem.memory is None and total > problem.budget_bytes


def _bytes(problem: PlanProblem, state: dict[str, Choice]) -> int:
    return saved_bytes(problem, PlanSolution(choices=state, status="", solver=""))


def _time(problem: PlanProblem, state: dict[str, Choice]) -> float:
    return added_seconds(problem, PlanSolution(choices=state, status="", solver=""))
