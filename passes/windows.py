"""Windows pass: the communication windows of the backward, and which
recomputations may hide in each (Lynx).

Reads: ``node.meta["adacc"]`` (annotate pass: runtime, op class, bytes), the
backward nodes in execution order. Writes: nothing on the graph; returns
`CollectiveWindow` records and a `PlanProblem` with ``windows`` filled in.

A collective in a compiled graph is an *issue* node
(``_c10d_functional.all_reduce`` and friends) whose result is read through
``wait_tensor``. Between the issue and the first node that reads a waited
result, the link is busy and the compute units are not (unless other
independent compute already sits there): that span is the window. Its
capacity is the collective's estimated time (`comm_model`) minus the compute
already inside it.

A recomputation of candidate v may go into window w when w opens before v's
first backward use (directly, or through a value recomputed from v): its
inputs are saved values or other recomputations, which the schedule pass
moves along, so they always exist by then.

The backward order is the autograd-engine order that
``reordering_to_mimic_autograd_engine`` gives the extracted backward, which
keeps the joint graph's order of backward nodes; positions computed on the
joint graph therefore hold in the backward graph.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch.fx as fx

from .annotate import META_KEY, tensor_bytes
from .comm_model import LinkProfile, collective_seconds
from .op_class import op_name
from .plan_problem import CommWindow, Decision, PlanProblem, PlanSolution

# _c10d_functional issue ops -> the cost model's collective kind.
ISSUE_KINDS: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
_NAMESPACES = ("_c10d_functional", "c10d_functional")

GroupSizeFn = Callable[[str], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveWindow:
    """One backward collective and the time it leaves for recomputation."""

    name: str
    """The issue node."""
    kind: str
    """"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"."""
    group_name: str
    group_size: int
    nbytes: int
    """Bytes the cost model charges (gathered output for all-gather)."""
    waits: tuple[str, ...]
    """The ``wait_tensor`` nodes of this collective."""
    opens: int
    """Position of the issue node in the backward order."""
    closes: int
    """Position of the first node that reads a waited result."""
    comm_seconds: float
    independent_seconds: float
    """Compute already between ``opens`` and ``closes`` (not waits or collectives)."""

    @property
    def seconds(self) -> float:
        """Capacity left for recomputation."""
        return max(self.comm_seconds - self.independent_seconds, 0.0)

    def as_problem_window(self) -> CommWindow:
        return CommWindow(name=self.name, seconds=self.seconds, opens=self.opens)

    def to_json(self) -> dict[str, object]:
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "waits": list(self.waits),
            "seconds": self.seconds,
        }


def issue_kind(node: fx.Node) -> str | None:
    """The collective kind of an issue node, None for anything else."""
    if node.op != "call_function":
        return None
    namespace, _, short = op_name(node).rpartition(".")
    if namespace not in _NAMESPACES:
        return None
    return ISSUE_KINDS.get(short)


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and op_name(node).rpartition(".")[2] == "wait_tensor"


def find_windows(
    order: Sequence[fx.Node],
    link: LinkProfile,
    group_size: GroupSizeFn,
) -> tuple[CollectiveWindow, ...]:
    """The windows among ``order`` (backward nodes in execution order).

    Args:
        order: the nodes whose collectives count (e.g. the joint graph's
            backward nodes, or every node of an extracted backward graph).
        link: the communication cost model.
        group_size: group name -> number of ranks (used where the op does
            not carry its group size).
    """
    position = {node: index for index, node in enumerate(order)}
    windows = []
    for node in order:
        kind = issue_kind(node)
        if kind is None:
            continue
        waits = _waits_of(node)
        readers = [u for w in waits for u in w.users if u in position]
        closes = min((position[u] for u in readers), default=len(order))
        opens = position[node]
        skip = set(waits)
        independent = sum(
            _runtime(n)
            for n in order[opens + 1 : closes]
            if n not in skip and issue_kind(n) is None and not is_wait(n)
        )
        group = _group_name(node)
        size = _group_size_arg(node, kind) or group_size(group)
        nbytes = _comm_bytes(node, kind)
        windows.append(
            CollectiveWindow(
                name=node.name,
                kind=kind,
                group_name=group,
                group_size=size,
                nbytes=nbytes,
                waits=tuple(w.name for w in waits),
                opens=opens,
                closes=closes,
                comm_seconds=collective_seconds(kind, nbytes, size, link),
                independent_seconds=independent,
            )
        )
    return tuple(windows)


def attach_windows(
    problem: PlanProblem,
    windows: Iterable[CollectiveWindow],
    first_use: dict[str, int],
) -> PlanProblem:
    """``problem`` with its windows, and each candidate's legal windows.

    Args:
        first_use: candidate name -> position (in the same backward order as
            the windows) of the first backward node reading it directly;
            absent when only other candidates read it.
    """
    usable = tuple(w for w in windows if w.seconds > 0)
    if not usable:
        return problem
    need = needed_by(problem, first_use)
    candidates = []
    for cand in problem.candidates:
        legal = ()
        if cand.can_recompute:
            legal = tuple(w.name for w in usable if w.opens < need.get(cand.name, -1))
        candidates.append(dataclasses.replace(cand, windows=legal))
    return dataclasses.replace(
        problem,
        candidates=tuple(candidates),
        windows=tuple(w.as_problem_window() for w in usable),
    )


def needed_by(problem: PlanProblem, first_use: dict[str, int]) -> dict[str, int]:
    """Latest position by which each candidate must exist if every reader that
    may be recomputed is recomputed on demand: its own first backward use, or
    the earliest such position of a recomputable candidate computed from it.

    Conservative (a reader that ends up kept does not need its inputs), which
    keeps the MILP's accounting exact: an on-demand recomputation never runs
    before this position, because the recomputed inputs of a recomputation
    placed in a window must be placed too.
    """
    need = dict(first_use)
    names = {c.name for c in problem.candidates}
    for cand in reversed(problem.candidates):  # readers come after their inputs
        mine = need.get(cand.name)
        if mine is None or not cand.can_recompute:
            continue
        for inp in cand.inputs:
            if inp in names:
                need[inp] = min(need.get(inp, mine), mine)
    return need


def first_backward_use(order: Sequence[fx.Node], names: Iterable[str]) -> dict[str, int]:
    """Position of the first node in ``order`` that reads each named node."""
    wanted = set(names)
    first: dict[str, int] = {}
    for index, node in enumerate(order):
        for arg in node.all_input_nodes:
            if arg.name in wanted and arg.name not in first:
                first[arg.name] = index
    return first


def fill_windows(problem: PlanProblem, solution: PlanSolution) -> dict[str, str]:
    """Window placement for a plan made without the MILP (greedy,
    recompute-all): readers first, each recompute in the latest legal window
    with room that opens no later than its readers' windows."""
    windows = {w.name: w for w in problem.windows if w.seconds > 0}
    if not windows:
        return {}
    left = {name: w.seconds for name, w in windows.items()}
    readers: dict[str, list[str]] = {}
    for cand in problem.candidates:
        for inp in cand.inputs:
            readers.setdefault(inp, []).append(cand.name)
    placed: dict[str, str] = {}
    for cand in reversed(problem.candidates):
        if solution.decision(cand.name) is not Decision.RECOMPUTE:
            continue
        bound = min(
            (windows[placed[r]].opens for r in readers.get(cand.name, ()) if r in placed),
            default=None,
        )
        legal = sorted(
            (w for w in cand.windows if w in windows),
            key=lambda w: (windows[w].opens, w),
            reverse=True,
        )
        for window in legal:
            if bound is not None and windows[window].opens > bound:
                continue
            if left[window] >= cand.recompute_seconds:
                placed[cand.name] = window
                left[window] -= cand.recompute_seconds
                break
    # A placement whose recomputed inputs stayed outside every window is
    # dropped (the MILP's rule: a window holds exactly what it counts).
    by_name = problem.by_name()
    changed = True
    while changed:
        changed = False
        for name in list(placed):
            if any(
                inp in by_name and inp not in placed and solution.decision(inp) is Decision.RECOMPUTE
                for inp in by_name[name].inputs
            ):
                del placed[name]
                changed = True
    return dict(sorted(placed.items()))


def _waits_of(issue: fx.Node) -> list[fx.Node]:
    waits = []
    stack = list(issue.users)
    while stack:
        user = stack.pop(0)
        if is_wait(user):
            waits.append(user)
        elif getattr(user.target, "__name__", "") == "getitem":
            stack.extend(user.users)
    return waits


def _runtime(node: fx.Node) -> float:
    ann = node.meta.get(META_KEY)
    return ann.runtime_s if ann is not None else 0.0


def _group_name(node: fx.Node) -> str:
    value = node.kwargs.get("group_name", node.args[-1] if node.args else "")
    return str(value)


def _group_size_arg(node: fx.Node, kind: str) -> int | None:
    if kind in ("all_gather", "reduce_scatter"):
        value = node.kwargs.get("group_size")
        if value is None:
            value = node.args[-2] if len(node.args) >= 2 else None
        return int(value) if isinstance(value, int) else None
    return None


def _comm_bytes(node: fx.Node, kind: str) -> int:
    if kind == "all_gather":
        return tensor_bytes(node.meta.get("val"))
    first = node.args[0] if node.args else None
    values = first if isinstance(first, (list, tuple)) else [first]
    return sum(tensor_bytes(v.meta.get("val")) for v in values if isinstance(v, fx.Node))
