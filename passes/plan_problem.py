"""The planning problem as plain data: no FX, no highspy.

The candidates pass extracts a `PlanProblem` from the annotated graph; a
policy (MILP, greedy, recompute-all, keep-all) turns it into a
`PlanSolution`; the rewrite maps the solution back onto the graph. Keeping
the problem free of graph objects makes every solver testable on hand-made
problems with a known optimum (STYLE.md point 4).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Decision(str, enum.Enum):
    KEEP = "keep"
    """Saved at full precision between forward and backward."""
    RECOMPUTE = "recompute"
    """Recomputed in the backward from available values."""
    COMPRESS = "compress"
    """Saved through a codec; decompressed before its first backward use."""
    NONE = "none"
    """Not needed by the backward under this plan."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressOption:
    codec: str
    nbytes: int
    """Exact payload bytes (`Codec.compressed_nbytes`)."""
    seconds: float
    """Compress + decompress time."""
    error: float = 0.0
    """Declared relative error (0 for lossless codecs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One forward value the backward may need, with its legal options."""

    name: str
    keep_bytes: int
    """Bytes held if kept (a view is charged its base's storage)."""
    recompute_seconds: float
    inputs: tuple[str, ...] = ()
    """Candidates this value is computed from (graph inputs are omitted: they
    are always available)."""
    required: bool = False
    """Read directly by a backward node: some option must be chosen."""
    can_keep: bool = True
    can_recompute: bool = True
    compress: tuple[CompressOption, ...] = ()
    block: str = ""
    """Repeated-block id (e.g. "layers.3"), empty outside blocks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanProblem:
    candidates: tuple[Candidate, ...]
    """In topological order."""
    budget_bytes: int | None = None
    """Cap on bytes held at the forward/backward boundary; None = no cap."""

    def by_name(self) -> dict[str, Candidate]:
        return {c.name: c for c in self.candidates}


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    decision: Decision
    codec: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanSolution:
    choices: dict[str, Choice]
    status: str
    """"optimal", "time_limit", "greedy", "heuristic", "infeasible"."""
    solver: str
    solve_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def decision(self, name: str) -> Decision:
        choice = self.choices.get(name)
        return choice.decision if choice else Decision.NONE


class InfeasibleBudgetError(ValueError):
    """The budget is below what recomputing everything legal reaches."""

    def __init__(self, budget_bytes: int, minimum_bytes: int):
        self.budget_bytes = budget_bytes
        self.minimum_bytes = minimum_bytes
        super().__init__(
            f"memory budget {budget_bytes / 2**20:.2f} MiB is below the reachable minimum "
            f"{minimum_bytes / 2**20:.2f} MiB ({minimum_bytes} bytes) for this graph; raise the "
            f"budget or pass on_infeasible='warn' to use the minimum-memory plan"
        )


def saved_bytes(problem: PlanProblem, solution: PlanSolution) -> int:
    """Bytes held at the forward/backward boundary under ``solution``."""
    total = 0
    for cand in problem.candidates:
        choice = solution.choices.get(cand.name)
        if choice is None:
            continue
        if choice.decision is Decision.KEEP:
            total += cand.keep_bytes
        elif choice.decision is Decision.COMPRESS:
            total += next(o.nbytes for o in cand.compress if o.codec == choice.codec)
    return total


def added_seconds(problem: PlanProblem, solution: PlanSolution) -> float:
    """Estimated time the plan adds: recomputation plus codec time."""
    total = 0.0
    for cand in problem.candidates:
        choice = solution.choices.get(cand.name)
        if choice is None:
            continue
        if choice.decision is Decision.RECOMPUTE:
            total += cand.recompute_seconds
        elif choice.decision is Decision.COMPRESS:
            total += next(o.seconds for o in cand.compress if o.codec == choice.codec)
    return total


def check_solution(problem: PlanProblem, solution: PlanSolution) -> list[str]:
    """Violations of the plan's rules (empty when the solution is legal)."""
    errors = []
    by_name = problem.by_name()
    for cand in problem.candidates:
        d = solution.decision(cand.name)
        if cand.required and d is Decision.NONE:
            errors.append(f"{cand.name}: required by the backward but has no option")
        if d is Decision.KEEP and not cand.can_keep:
            errors.append(f"{cand.name}: kept but cannot be kept")
        if d is Decision.RECOMPUTE:
            if not cand.can_recompute:
                errors.append(f"{cand.name}: recomputed but not recomputable")
            for inp in cand.inputs:
                if inp in by_name and solution.decision(inp) is Decision.NONE:
                    errors.append(f"{cand.name}: recomputed but input {inp} is unavailable")
    if problem.budget_bytes is not None and saved_bytes(problem, solution) > problem.budget_bytes:
        errors.append(
            f"saved {saved_bytes(problem, solution)} bytes > budget {problem.budget_bytes}"
        )
    return errors
