"""Schedule pass: run recomputation inside communication windows (Lynx).

Reads: the extracted backward graph (recomputed values keep their forward
names), a placement ``candidate -> window`` (window = the collective's issue
node). Writes: a new backward GraphModule (the input is not modified).

For each window, in graph order, the placed recomputations and every
ancestor of them not yet computed (other recomputations, decompressions,
views of saved values) move to right after the issue node; the collective's
``wait_tensor`` moves to right before the first node that reads its result.
The window then runs::

    issue ─► recompute subgraph ─► compute already independent ─► wait ─► reader

Moving work *earlier* is legal exactly when it does not depend on the
backward's tangents or on a collective; placements that would need such a
node are skipped and reported. Finally the order is pinned (``pin=True``) so
a compiler keeps it: the window's first recomputations depend on the issue
node and the wait depends on the last ones, through Inductor's control
dependencies (`adacc_compile.compat_inductor.pin_order`); in eager execution the same
graph simply runs in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch.fx as fx

from adacc_compile import compat, compat_inductor

from .op_class import is_view_op
from .windows import is_wait, issue_kind


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleResult:
    module: fx.GraphModule
    placed: dict[str, str] = field(default_factory=dict)
    """Recomputed value -> window it now runs in."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Placement that could not be honoured -> why."""
    pins: int = 0
    """Control dependencies added."""


def schedule_recompute(
    bw_module: fx.GraphModule,
    placement: Mapping[str, str],
    *,
    pin: bool = True,
) -> ScheduleResult:
    """Moves each placed recomputation into its window (module docstring)."""
    order = list(bw_module.graph.nodes)
    by_name = {n.name: n for n in order}
    tainted = _tangent_or_comm_dependent(order)
    skipped: dict[str, str] = {}
    by_window: dict[str, list[fx.Node]] = {}
    for name, window in sorted(placement.items()):
        node, issue = by_name.get(name), by_name.get(window)
        if node is None or issue is None or issue_kind(issue) is None:
            skipped[name] = f"{'window ' + window if node is not None else name} not in the backward graph"
            continue
        by_window.setdefault(window, []).append(node)
    moved_by_window: dict[str, list[fx.Node]] = {}
    for issue in [n for n in order if n.name in by_window]:
        position = {n: i for i, n in enumerate(order)}
        start = position[issue]
        moved: set[fx.Node] = set()
        for node in sorted(by_window[issue.name], key=position.__getitem__):
            if position[node] < start:
                skipped[node.name] = "already computed before the window opens"
                continue
            closure = _pending_ancestors(node, position, start)
            blocker = next(
                (n for n in sorted(closure, key=position.__getitem__) if n in tainted or not _movable(n)),
                None,
            )
            if blocker is not None:
                skipped[node.name] = f"needs {blocker.name}, which cannot run before the window"
                continue
            moved |= closure
        if not moved:
            continue
        inside = sorted(moved, key=position.__getitem__)
        rest = [n for n in order[start + 1 :] if n not in moved]
        order = order[: start + 1] + inside + rest
        order = _sink_waits(order, issue)
        moved_by_window[issue.name] = inside
    module = _rebuild(bw_module, order)
    names = {n.name: n for n in module.graph.nodes}
    moved_names = {w: {n.name for n in nodes} for w, nodes in moved_by_window.items()}
    placed = {
        name: window
        for name, window in sorted(placement.items())
        if name not in skipped and name in moved_names.get(window, ())
    }
    pins = 0
    if pin and moved_by_window:
        deps = _pin_map(names, moved_by_window)
        if compat_inductor.pin_order(module, deps):
            pins = sum(len(v) for v in deps.values())
    return ScheduleResult(module=module, placed=placed, skipped=skipped, pins=pins)


def recomputes_in_windows(
    bw_module: fx.GraphModule, forward_names: Iterable[str]
) -> dict[str, list[str]]:
    """Window (issue node) -> the recomputed nodes between it and its first
    ``wait_tensor``, in graph order. Works on pinned graphs too (pinned nodes
    keep their names)."""
    forward = set(forward_names)
    out: dict[str, list[str]] = {}
    current: dict[str, list[str]] = {}
    waits_of: dict[str, set[str]] = {}
    for node in bw_module.graph.nodes:
        if issue_kind(node) is not None:
            current[node.name] = []
            waits_of[node.name] = {w.name for w in _waits(node)}
            continue
        closed = [issue for issue, waits in waits_of.items() if node.name in waits and issue in current]
        for issue in closed:
            out[issue] = current.pop(issue)
        if node.op == "call_function" and node.name in forward:
            for names in current.values():
                names.append(node.name)
    return {k: v for k, v in out.items() if v}


# --------------------------------------------------------------------------


def _tangent_or_comm_dependent(order: list[fx.Node]) -> set[fx.Node]:
    tainted: set[fx.Node] = set()
    for node in order:
        if (
            compat.is_tangent(node)
            or issue_kind(node) is not None
            or is_wait(node)
            or any(a in tainted for a in node.all_input_nodes)
        ):
            tainted.add(node)
    return tainted


def _movable(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    schema = getattr(node.target, "_schema", None)
    return not (schema is not None and schema.is_mutable)


def _pending_ancestors(node: fx.Node, position: dict[fx.Node, int], start: int) -> set[fx.Node]:
    """``node`` and its ancestors that come after ``start`` (not yet computed)."""
    closure: set[fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in closure or position[current] <= start:
            continue
        closure.add(current)
        stack.extend(current.all_input_nodes)
    return closure


def _waits(issue: fx.Node) -> list[fx.Node]:
    waits, stack = [], list(issue.users)
    while stack:
        user = stack.pop(0)
        if is_wait(user) or _pinned_wait(user):
            waits.append(user)
        elif getattr(user.target, "__name__", "") == "getitem":
            stack.extend(user.users)
    return waits


def _sink_waits(order: list[fx.Node], issue: fx.Node) -> list[fx.Node]:
    """Each wait of ``issue`` moves to right before its first reader."""
    for wait in _waits(issue):
        position = {n: i for i, n in enumerate(order)}
        readers = [position[u] for u in wait.users if u in position]
        if not readers:
            continue
        order = [n for n in order if n is not wait]
        first = min(readers) - 1  # one node was removed before it
        order.insert(first, wait)
    return order


def _rebuild(gm: fx.GraphModule, order: list[fx.Node]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in order:
        env[node] = graph.node_copy(node, lambda n: env[n])
    out = fx.GraphModule(gm, graph)
    out.graph.lint()
    return out


def _pin_map(
    names: dict[str, fx.Node], moved_by_window: dict[str, list[fx.Node]]
) -> dict[fx.Node, list[fx.Node]]:
    """First recomputations of each window after its issue node; its waits
    after the window's last recomputations. Views and getitems are free and
    are not pinned themselves."""
    entries: dict[fx.Node, list[fx.Node]] = {}
    waits: dict[fx.Node, list[fx.Node]] = {}
    for issue_name, moved in moved_by_window.items():
        issue = names[issue_name]
        inside = {names[n.name] for n in moved}
        after_compute: dict[fx.Node, bool] = {}  # has a moved non-view ancestor
        for node in (names[n.name] for n in moved):
            after_compute[node] = any(
                a in inside and (not is_view_op(a) or after_compute.get(a, False))
                for a in node.all_input_nodes
            )
            if not is_view_op(node) and _single_tensor(node) and not after_compute[node]:
                entries[node] = [issue]
        sinks = [
            names[n.name]
            for n in moved
            if not is_view_op(names[n.name])
            and _single_tensor(names[n.name])
            and not any(u in inside for u in names[n.name].users)
        ]
        if not sinks:
            sinks = [names[n.name] for n in moved if not any(u in inside for u in names[n.name].users)]
        for wait in _waits(issue):
            waits[wait] = sinks
    return {**entries, **waits}


def _single_tensor(node: fx.Node) -> bool:
    import torch

    val = node.meta.get("val")
    if val is None:  # no meta: judge by how it is read
        return not any(getattr(u.target, "__name__", "") == "getitem" for u in node.users)
    return isinstance(val, torch.Tensor)


def _pinned_wait(node: fx.Node) -> bool:
    """A ``wait_tensor`` wrapped by `compat_inductor.pin_order`."""
    target = compat_inductor.pinned_target(node)
    return target is not None and "wait_tensor" in str(target)
