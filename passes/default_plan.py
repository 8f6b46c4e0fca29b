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
from .plan_problem import Candidate, Choice, Decision, PlanProblem, PlanSolution, block_copies


def default_plan(problem: PlanProblem, saved: Iterable[str]) -> PlanSolution | None:
    """The plan that keeps ``saved`` (where keeping is legal) and recomputes
    the rest; None if no legal plan completes it.

    PyTorch often saves a view (the transposes its matmul backward reads,
    a ``detach`` of a softmax output) where adacc keeps the viewed value and
    recomputes the view for free: a saved view that cannot be kept keeps
    the value whose storage it shares instead (the same bytes). Read as
    "not kept", it would have the default recompute attention scores and
    the matmuls feeding them, which PyTorch never does."""
    by_name = problem.by_name()
    kept = {name for name in (_storage_owner(s, by_name) for s in saved) if name is not None}
    state: dict[str, Choice] = {}
    for cand in problem.candidates:
        if cand.name in kept:
            state[cand.name] = Choice(decision=Decision.KEEP)
    try:
        for cand in problem.candidates:
            if cand.required:
                _make_available(cand.name, by_name, state, prefer_keep=False)
    except _Stuck:
        return None
    return PlanSolution(choices=state, status="default", solver="torch_min_cut")


def _storage_owner(name: str, by_name: dict[str, Candidate]) -> str | None:
    """``name`` where it can be kept, else the keepable value its storage
    belongs to (following views), else None."""
    seen: set[str] = set()
    while name in by_name and name not in seen:
        seen.add(name)
        cand = by_name[name]
        if cand.can_keep:
            return name
        if cand.lifetime is None or not cand.lifetime.alias_of:
            return None
        name = cand.lifetime.alias_of
    return None


def counted_saved_bytes(problem: PlanProblem, sizes: dict[str, int]) -> int:
    """What PyTorch counts its choice as saving: ``sizes`` (saved node ->
    its own tensor bytes; a view at its own size, not its base's), for the
    candidates of ``problem``, the repeated block's copies included (they
    save what the block saves)."""
    return sum(sizes[c.name] * (1 + block_copies(problem, c)) for c in problem.candidates if c.name in sizes)
