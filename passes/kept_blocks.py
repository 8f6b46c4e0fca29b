"""Full checkpointing with its last blocks kept.

Where the budget sits at or near full activation checkpointing's peak, the
MILP's rows cannot reach it: they over-count a block recomputed in one
burst (`peak_model`: an input of a value recomputed early stays counted to
that value's first read), and the plan search then falls back to full
checkpointing's own plan (`policies.full_ac_policy`). That plan recomputes
every block, the last one too; but the last block's backward runs first,
right after the loss, where a recomputation of it would hold its values at
once anyway: keeping them costs little or no peak and saves that block's
whole recomputation. auto_perf_maxing-style planners find exactly this plan
at full AC's peak (`bench/apm_policy.py`, after torchtitan's, keeps the
last block whole there).

This module builds those plans: full AC's with values of its last blocks
decided as the keep-everything plan does them, the last block's first. The
plan search (`plan_search`) keeps as many as the room the budget leaves
allows, by the plan simulator, in a few bisections (`most_kept`), and
checks the result on the split graphs, going on with the room they measure
(`plan_search._last_blocks_kept`). On a 4-layer HF Llama (d_model 256) at
full AC's measured peak (24.4 MiB), 35 values fit by the plan simulator,
32 of them the last block's, and the step measured 21.1 MiB; with the room
the split graphs measured, 42 values and 24.3 MiB (`bench/gpu_step.py
--sizes cpu4`, 2026-12-08; its step time did not move beyond the noise).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from .plan_problem import PlanProblem, PlanSolution, check_solution


def blocks_in_forward_order(problem: PlanProblem) -> list[str]:
    """The problem's block ids, ordered by the forward position of their
    first value (values only the backward reads, such as a gradient's zeros,
    sit late in the joint graph's order and are left out)."""
    first: dict[str, int] = {}
    for position, cand in enumerate(problem.candidates):
        if not cand.block or (cand.lifetime is not None and not cand.lifetime.forward_always):
            continue
        produced = cand.lifetime.produced if cand.lifetime is not None else position
        first[cand.block] = min(first.get(cand.block, produced), produced)
    return sorted(first, key=lambda block: (first[block], block))


def keep_order(problem: PlanProblem, base: PlanSolution, keep_all: PlanSolution) -> list[str]:
    """The values ``keep_all`` decides otherwise than ``base``, in the order
    the plan search keeps them: the last block's first (nearly free), then
    those of every other block; in each part, the most recomputation time
    saved per byte first."""
    order = blocks_in_forward_order(problem)
    rank = {block: 0 if block == order[-1] else 1 for block in order}
    differing = [
        cand for cand in problem.candidates
        if cand.block in rank and cand.name in keep_all.choices
        and keep_all.choices[cand.name] != base.choices.get(cand.name)
    ]
    differing.sort(key=lambda c: (rank[c.block], -c.recompute_seconds / max(c.keep_bytes, 1), c.name))
    return [cand.name for cand in differing]


def with_kept(base: PlanSolution, keep_all: PlanSolution, names: Sequence[str]) -> PlanSolution:
    """``base`` with ``names`` decided as ``keep_all`` decides them."""
    choices = dict(base.choices)
    for name in names:
        choices[name] = keep_all.choices[name]
    return dataclasses.replace(base, choices=choices)


SKIPS = 3
"""Values passed over (each one too large for what room is left) before the
search stops: each pass is one more bisection."""


def most_kept(
    problem: PlanProblem,
    base: PlanSolution,
    keep_all: PlanSolution,
    fits: Callable[[PlanSolution], bool],
) -> tuple[PlanSolution, int]:
    """A plan with as much of `keep_order` kept as is legal and ``fits``,
    and how many values it keeps (``base`` and 0 where none fits).

    The longest prefix that fits is found by bisection (keeping a value
    instead of recomputing it hardly ever lowers the peak, and the caller
    checks the plan it gets); the value that ends it is passed over and the
    rest searched the same way, at most `SKIPS` times, so the search costs
    a few bisections, not a simulation per value."""
    order = keep_order(problem, base, keep_all)
    unbudgeted = dataclasses.replace(problem, budget_bytes=None, boundary_budget_bytes=None)
    best, kept = base, 0
    for _ in range(SKIPS + 1):
        low, high, found = 1, len(order), 0
        while low <= high:
            middle = (low + high) // 2
            plan = with_kept(best, keep_all, order[:middle])
            if check_solution(unbudgeted, plan) or not fits(plan):
                high = middle - 1
            else:
                found, low = middle, middle + 1
        if found:
            best, kept = with_kept(best, keep_all, order[:found]), kept + found
        order = order[found + 1:]
        if not order:
            break
    return best, kept
