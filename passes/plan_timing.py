"""Where planning time goes: HiGHS model building, solves, the fw/bw split
and the memory simulation, and how many solves a graph took.

The planner's parts run deep inside the budget and plan stages (a solve in
`milp`, a split and a simulation in `plan_search`); a `PlanTiming` made
active for one pipeline run (`recording`) collects them without threading
a record through every call. Nothing records where none is active (the
CLI's preview solves, unit tests of the MILP).
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Iterator

PARTS = ("build", "solve", "split", "simulate")


@dataclass(slots=True)
class PlanTiming:
    """Seconds per part of planning, summed over one graph's pipeline run."""

    build_s: float = 0.0
    """Building the MILP (`peak_model` rows into HiGHS's matrix)."""
    solve_s: float = 0.0
    """HiGHS's own run time, every solve."""
    split_s: float = 0.0
    """Splitting plans into forward and backward graphs (PyTorch's
    extraction) and inserting their codecs."""
    simulate_s: float = 0.0
    """Simulating the split graphs' memory (`memory_sim`)."""
    solves: int = 0
    """HiGHS solves, every stage (the budget's fastest plan included)."""
    splits: int = 0
    rows: int = 0
    """Rows of the largest MILP solved."""
    columns: int = 0
    """Columns of the largest MILP solved."""
    nodes: list[int] = field(default_factory=list)
    """Branch-and-bound nodes HiGHS explored, one entry per solve: 1 (or 0)
    where it proved the optimum at the root, where the formulation's LP
    relaxation with HiGHS's cuts was tight enough."""
    gaps: list[float] = field(default_factory=list)
    """The relative gap each solve stopped at: at most ``mip_rel_gap``
    where it finished, more where a node or time limit stopped it, -1
    where it had no plan to measure a gap from."""

    def add_model(self, rows: int, columns: int) -> None:
        self.rows, self.columns = max(self.rows, rows), max(self.columns, columns)

    def summary(self) -> dict[str, float | int]:
        return asdict(self)


_ACTIVE: ContextVar[PlanTiming | None] = ContextVar("adacc_plan_timing", default=None)


@contextlib.contextmanager
def recording(timing: PlanTiming) -> Iterator[PlanTiming]:
    """Makes ``timing`` the record the planner's parts add to."""
    token = _ACTIVE.set(timing)
    try:
        yield timing
    finally:
        _ACTIVE.reset(token)


def count_solve(rows: int, columns: int) -> None:
    """One HiGHS solve of a model this size, on the active record."""
    timing = _ACTIVE.get()
    if timing is not None:
        timing.solves += 1
        timing.add_model(rows, columns)


def count_nodes(nodes: int, gap: float) -> None:
    """How far one solve searched: its branch-and-bound nodes and the gap
    it stopped at."""
    timing = _ACTIVE.get()
    if timing is not None:
        timing.nodes.append(max(int(nodes), 0))
        timing.gaps.append(float(gap) if gap == gap and gap != float("inf") else -1.0)


def count_split() -> None:
    """One split of a plan into forward and backward graphs."""
    timing = _ACTIVE.get()
    if timing is not None:
        timing.splits += 1


@contextlib.contextmanager
def timed(part: str) -> Iterator[None]:
    """Adds the block's wall time to ``part`` of the active record."""
    if part not in PARTS:
        raise ValueError(f"unknown planning part {part!r}; parts: {PARTS}")
    timing = _ACTIVE.get()
    start = time.perf_counter()
    try:
        yield
    finally:
        if timing is not None:
            field = f"{part}_s"
            setattr(timing, field, getattr(timing, field) + time.perf_counter() - start)
