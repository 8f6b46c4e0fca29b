"""Pipeline stages for recomputation inside communication windows (Lynx).

    windows   find the backward's (issue, wait) windows, estimate their
              capacity, tell the planner which recomputations fit where;
              with torch.distributed, take the lowest rank's plan problem
              (measured costs differ between ranks)
    schedule  move the planned recomputations into their windows and pin the
              order; re-simulate memory, un-placing recomputations (largest
              first) if moving them up would break the budget
    agree     plan hash; with torch.distributed initialised, compare it with
              the peer ranks' hashes (clear error on mismatch, never a hang)

Each is ``stage(state) -> None`` over `PartitionState`, like the others in
`adacc_compile.stage_runner`; what they produce lives in one `OverlapState`
under ``state.overlap``. Graphs without backward collectives pass through
untouched (their plan hash is still computed).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adacc_compile import compat_distributed
from adacc_compile.passes.comm_model import LinkProfile, calibrate_link, default_link, link_by_name
from adacc_compile.passes.schedule import recomputes_in_windows, schedule_recompute
from adacc_compile.passes.windows import (
    CollectiveWindow,
    attach_windows,
    fill_windows,
    find_windows,
    first_backward_use,
    issue_kind,
)
from adacc_compile.plan_agreement import (
    PlanMismatchError,
    check_agreement,
    collective_groups,
    plan_fingerprint,
    share_problem,
)

if TYPE_CHECKING:
    from adacc_compile.state import PartitionState

_MAX_UNPLACE_ROUNDS = 8


@dataclass(slots=True, kw_only=True)
class OverlapState:
    """What the window stages found and decided for one joint graph."""

    groups: tuple[str, ...] = ()
    """Process groups used by the graph's collectives."""
    link: LinkProfile | None = None
    windows: tuple[CollectiveWindow, ...] = ()
    planned: dict[str, str] = field(default_factory=dict)
    """Planner's placement: recomputed value -> window."""
    placed: dict[str, str] = field(default_factory=dict)
    """Placement in the final backward graph."""
    unplaced_for_memory: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)
    inside: dict[str, list[str]] = field(default_factory=dict)
    """Window -> recomputed nodes between its issue and its wait (final graph)."""
    overlapped_seconds: float = 0.0
    pins: int = 0
    plan_hash: str = ""
    plan_canonical: str = ""
    checked_ranks: tuple[int, ...] = ()


def windows_stage(state: "PartitionState") -> None:
    assert state.info is not None and state.candidates is not None
    overlap = state.overlap = OverlapState(groups=tuple(collective_groups(state.joint)))
    problem = state.candidates.problem
    # The backward's operations in order: the positions the memory model
    # uses (`lifetimes.step_orders`), so a window's opening is comparable.
    order = [n for n in state.joint.graph.nodes if n.op == "call_function" and n in state.info.backward_nodes]
    if any(issue_kind(n) is not None for n in order):
        overlap.link = resolve_link(state.config.comm_profile, overlap.groups)
        overlap.windows = find_windows(order, overlap.link, group_size=compat_distributed.group_size)
        first_use = first_backward_use(order, [c.name for c in problem.candidates])
        problem = attach_windows(problem, overlap.windows, first_use)
    if overlap.groups and compat_distributed.dist_ready():
        # Measured costs differ between ranks: all plan the lowest rank's problem.
        problem = share_problem(problem, overlap.groups, state.config.plan_check_timeout_s)
    state.candidates = dataclasses.replace(state.candidates, problem=problem)


def schedule_stage(state: "PartitionState") -> None:
    assert state.candidates is not None and state.solution is not None
    assert state.fw_module is not None and state.bw_module is not None
    assert state.budget is not None and state.timeline is not None
    overlap = state.overlap = state.overlap or OverlapState()
    problem, solution = state.candidates.problem, state.solution
    if not problem.windows:
        return
    if solution.windows or solution.solver == "milp":
        overlap.planned = dict(solution.windows)
    else:
        overlap.planned = fill_windows(problem, solution)
    if not overlap.planned or not state.config.overlap_recompute:
        return
    readers: dict[str, set[str]] = {}
    for cand in problem.candidates:
        for inp in cand.inputs:
            readers.setdefault(inp, set()).add(cand.name)
    # Moving recomputation up lengthens lifetimes: never past the budget (or
    # the on-demand peak, where that already exceeds it). Over the limit, the
    # placed values alive across the peak (and what is computed from them)
    # go back to on demand, and the schedule is redone.
    limit = max(state.budget.budget_bytes, state.budget.peak_of(state.timeline))
    placement, unplaced = dict(overlap.planned), []
    assert state.split_context is not None
    for round_ in range(_MAX_UNPLACE_ROUNDS + 1):
        result = schedule_recompute(state.bw_module, placement)
        timeline = state.split_context.simulate(state.fw_module, result.module)  # as the plan stage did
        if state.budget.peak_of(timeline) <= limit or not placement:
            break
        victims = _alive_across_peak(result.module, timeline, result.placed, step=state.budget.scope == "step")
        if not victims or round_ == _MAX_UNPLACE_ROUNDS - 1:
            victims = set(placement)
        victims = _with_readers(victims, readers) & set(placement)
        unplaced.extend(sorted(victims))
        placement = {k: v for k, v in placement.items() if k not in victims}
    result.module.graph.lint()
    state.bw_module, state.timeline = result.module, timeline
    overlap.placed, overlap.skipped, overlap.pins = result.placed, result.skipped, result.pins
    overlap.unplaced_for_memory = tuple(unplaced)
    overlap.inside = recomputes_in_windows(result.module, state.forward_names)
    overlap.overlapped_seconds = _hidden_seconds(state, overlap)


def agree_stage(state: "PartitionState") -> None:
    assert state.candidates is not None and state.solution is not None
    assert state.fw_module is not None and state.bw_module is not None
    overlap = state.overlap = state.overlap or OverlapState(groups=tuple(collective_groups(state.joint)))
    overlap.plan_canonical, overlap.plan_hash = plan_fingerprint(
        state.candidates.problem, state.solution, overlap.placed, [state.fw_module, state.bw_module]
    )
    if overlap.groups and compat_distributed.dist_ready():
        try:
            overlap.checked_ranks = check_agreement(
                overlap.plan_hash, overlap.groups, state.config.plan_check_timeout_s
            )
        except PlanMismatchError as error:
            if state.config.dump_dir:  # what this rank planned, to diff across ranks
                import torch.distributed as dist

                path = os.path.join(state.config.dump_dir, f"plan_mismatch_rank{dist.get_rank()}.json")
                os.makedirs(state.config.dump_dir, exist_ok=True)
                with open(path, "w") as f:
                    f.write(overlap.plan_canonical)
                raise PlanMismatchError(f"{error} (this rank's plan: {path})") from error
            raise


def resolve_link(name: str, groups: tuple[str, ...]) -> LinkProfile:
    key = name.lower()
    if key == "auto":
        return default_link(compat_distributed.group_backend(groups[0]) if groups else None)
    if key == "calibrate":
        if not groups or compat_distributed.resolve_group(groups[0]) is None:
            return default_link(None)
        return _calibrated_link(groups[0], compat_distributed.group_size(groups[0]), compat_distributed.group_backend(groups[0]))
    return link_by_name(key)


@functools.lru_cache(maxsize=None)
def _calibrated_link(group_name: str, _size: int, _backend: str | None) -> LinkProfile:
    """Measured once per process and group (a collective on every rank of it,
    reached by all ranks at the same compile), so that recompiles plan with
    the same numbers."""
    return calibrate_link(compat_distributed.resolve_group(group_name))


def _alive_across_peak(module: Any, timeline: Any, placed: dict[str, str], *, step: bool = False) -> set[str]:
    """Placed values computed before the backward's activation peak (with
    ``step``, its peak of all bytes) and read after it."""
    events = [e for e in timeline.events if e.phase == "backward"]
    if not events:
        return set()
    peak = max(events, key=lambda e: e.live_bytes if step else e.activation_bytes)
    position = {n.name: i for i, n in enumerate(module.graph.nodes)}
    at = position.get(peak.node, len(position))
    nodes = {n.name: n for n in module.graph.nodes}
    return {
        name
        for name in placed
        if name in nodes
        and position[name] <= at
        and any(position[u.name] > at for u in nodes[name].users)
    }


def _with_readers(names: set[str], readers: dict[str, set[str]]) -> set[str]:
    """``names`` and every candidate computed from them, transitively."""
    out, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in out:
            out.add(name)
            stack.extend(readers.get(name, ()))
    return out


def _hidden_seconds(state: "PartitionState", overlap: OverlapState) -> float:
    """Per window, the recompute time now inside it, capped by its capacity."""
    seconds = {c.name: c.recompute_seconds for c in state.candidates.problem.candidates}  # type: ignore[union-attr]
    capacity = {w.name: w.seconds for w in overlap.windows}
    total = 0.0
    for window, names in overlap.inside.items():
        inside = sum(seconds.get(n, 0.0) for n in names)
        total += min(inside, capacity.get(window, 0.0))
    return total
