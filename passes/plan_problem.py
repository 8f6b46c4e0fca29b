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
    compress_scratch: int = 0
    """Bytes the compress allocates beyond the value and its payload while
    it runs (`memory_sim.graph_scratch_bytes` of the codec's eager aten
    form), counted at the value's forward position; 0 under Inductor,
    whose fused kernels hold little more (left to the peak-fit search)."""
    feeds_recompute: bool = True
    """May a recomputation start from the decompressed value? Only where the
    codec gives the value back exactly (`Codec.feeds_recompute`): a lossy
    codec's bound holds for the value itself, not for what is recomputed
    from it, and few-bit codecs give back a derivative, not the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lifetime:
    """Where a candidate lives in the step, in positions of the forward and
    the backward order (`passes.lifetimes` explains the orders)."""

    produced: int
    """Forward position of the node computing it (-1: a graph input)."""
    forward_last_use: int
    """Last forward position reading it (the last position for a forward
    output)."""
    forward_always: bool = True
    """The forward outputs need it: computed in the forward whatever the plan.
    False for values only the backward reads (they run in the forward only
    when saved, or when a saved value is computed from them)."""
    forward_bytes: int = 0
    """Bytes it occupies as a forward temporary (0 when fused away)."""
    backward_bytes: int = 0
    """Bytes a recomputed copy occupies (0 for views and fused values)."""
    reads: tuple[int, ...] = ()
    """Backward positions of the nodes that read it directly, sorted."""
    alias_of: str = ""
    """For a view: the value whose storage it shares (that value stays alive
    while the view does)."""
    late_readers: tuple[tuple[str, int], ...] = ()
    """Candidates only the backward needs that read its storage after
    ``forward_last_use`` (name, forward position): when the plan computes one
    in the forward, the value lives until it."""
    written_bytes: int = 0
    """Bytes it occupies in the forward when the plan compresses it although
    ``forward_bytes`` is 0: Inductor would fuse it into its readers, but a
    codec's reads make it write the value once (`compress_rewrite`), which
    then lives like a forward temporary (to its last forward use, or a late
    reader's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLayout:
    """The positions of one step and what no decision changes."""

    forward_positions: int
    backward_positions: int
    forward_base: tuple[int, ...] = ()
    """Activation bytes alive at each forward position that belong to values
    the backward never reads."""
    forward_layers: tuple[str, ...] = ()
    """Block id of the node at each forward position ("" outside blocks)."""
    backward_base: tuple[int, ...] = ()
    """Bytes the backward's own values (gradients) hold at each backward
    position; empty unless the budget bounds the whole step
    (``budget_scope="step"``): the memory rows and the plan simulator then
    add them."""
    backward_layers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AuxBound:
    """``aux >= const + Σ coef · var`` (one lower bound of an auxiliary
    variable of the memory model; `var` keys as in `MemoryRow`)."""

    const: float
    terms: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """Activation bytes at one position (or an upper bound over a segment of
    positions): ``const + Σ coef · var``. Variable keys: ``keep:<c>``,
    ``rec:<c>``, ``comp:<c>:<codec>`` (a decision of candidate c, 0 or 1),
    ``ov:<c>:<window>`` (c recomputed inside a communication window) and
    ``aux:<i>`` (auxiliary variable i of the model, in [0, 1])."""

    name: str
    const: float
    terms: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryModel:
    """The peak-memory model of a plan problem (built by `peak_model`)."""

    aux: tuple[tuple[AuxBound, ...], ...]
    """Lower bounds of each auxiliary variable; a variable's bounds refer
    only to decisions and to auxiliary variables before it."""
    rows: tuple[MemoryRow, ...]


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
    windows: tuple[str, ...] = ()
    """Communication windows its recomputation may be placed in (Lynx): the
    window opens before this value's first backward use."""
    keep_seconds: float = 0.0
    """Time keeping it costs: writing it in the forward where it would
    otherwise stay fused, and reading it back in the backward."""
    lifetime: Lifetime | None = None
    """Where it lives in the step (None: hand-made problems without a
    memory model; the budget then caps the saved bytes only)."""


# --- communication windows (Lynx) ---------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CommWindow:
    """Time while a backward collective is in flight (issue .. wait)."""

    name: str
    """The collective's issue node."""
    seconds: float
    """Capacity: communication time minus compute already inside the window."""
    opens: int = 0
    """Position of the issue node in the backward order (windows are compared
    by it: a recompute feeding one in window w may not sit in a later one)."""


# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockRepeat:
    """One block of the problem stands for ``copies`` more identical blocks
    right after itself (depth folding, `depth_fold`): every copy takes the
    block's decisions, holds what the block holds from its forward to its
    backward, and costs what it costs."""

    block: str
    copies: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanProblem:
    candidates: tuple[Candidate, ...]
    """In topological order."""
    budget_bytes: int | None = None
    """Cap on the activation peak of the step where the problem has a
    `memory` model, else on the bytes held at the forward/backward boundary;
    None = no cap."""
    boundary_budget_bytes: int | None = None
    """An additional cap on the bytes held at the boundary (ratio budgets:
    the same ratio of what PyTorch's default partitioner saves)."""
    windows: tuple[CommWindow, ...] = ()
    """Communication windows recomputation may hide in (empty: none)."""
    layout: StepLayout | None = None
    memory: MemoryModel | None = None
    """Rows bounding the activation memory at every position of the step."""
    repeat: BlockRepeat | None = None
    """A block standing for more copies of itself (None: what is traced is
    the whole step). Solvers see a reduced problem whose representatives
    carry the copies' bytes and seconds already (`structure`)."""

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
    """"optimal", "time_limit", "node_limit" (HiGHS stopped at a limit with
    a plan), "feasible", "greedy", "heuristic", "infeasible"."""
    solver: str
    solve_seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    windows: dict[str, str] = field(default_factory=dict)
    """Recomputed candidate -> the window it runs in (absent: on demand)."""

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


def held_bytes(cand: Candidate, choice: Choice | None) -> int:
    """Bytes ``cand`` holds at the forward/backward boundary under ``choice``."""
    if choice is None:
        return 0
    if choice.decision is Decision.KEEP:
        return cand.keep_bytes
    if choice.decision is Decision.COMPRESS:
        return next(o.nbytes for o in cand.compress if o.codec == choice.codec)
    return 0


def choice_seconds(cand: Candidate, choice: Choice | None) -> float:
    """Time ``choice`` costs for ``cand`` (the MILP's objective term)."""
    if choice is None:
        return 0.0
    if choice.decision is Decision.KEEP:
        return cand.keep_seconds
    if choice.decision is Decision.RECOMPUTE:
        return cand.recompute_seconds
    if choice.decision is Decision.COMPRESS:
        return next(o.seconds for o in cand.compress if o.codec == choice.codec)
    return 0.0


def repeated_held_bytes(problem: PlanProblem, solution: PlanSolution) -> int:
    """What one copy of the repeated block holds between its forward and its
    backward (0 without a `BlockRepeat`)."""
    if problem.repeat is None:
        return 0
    block = problem.repeat.block
    return sum(held_bytes(c, solution.choices.get(c.name)) for c in problem.candidates if c.block == block)


def saved_bytes(problem: PlanProblem, solution: PlanSolution) -> int:
    """Bytes held at the forward/backward boundary under ``solution`` (the
    repeated block's copies included)."""
    total = sum(held_bytes(c, solution.choices.get(c.name)) for c in problem.candidates)
    if problem.repeat is not None:
        total += problem.repeat.copies * repeated_held_bytes(problem, solution)
    return total


def block_copies(problem: PlanProblem, cand: Candidate) -> int:
    """How many more copies of ``cand`` the step holds: the repeated block's
    copies for its values (depth folding), else 0."""
    repeat = problem.repeat
    return repeat.copies if repeat is not None and cand.block == repeat.block else 0


def added_seconds(problem: PlanProblem, solution: PlanSolution) -> float:
    """Estimated time of the plan's choices (the MILP's objective): keeping
    (writes and reads), recomputation, codecs; the repeated block's copies
    included."""
    return sum(
        choice_seconds(cand, solution.choices.get(cand.name)) * (1 + block_copies(problem, cand))
        for cand in problem.candidates
    )


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
                if inp not in by_name:
                    continue
                if solution.decision(inp) is Decision.NONE:
                    errors.append(f"{cand.name}: recomputed but input {inp} is unavailable")
                elif not _feeds_recompute(by_name[inp], solution.choices[inp]):
                    errors.append(
                        f"{cand.name}: recomputed from {inp}, whose codec may not feed a recompute"
                    )
    if problem.memory is not None and problem.budget_bytes is not None:
        from .peak_model import decision_values, evaluate

        peak, where = evaluate(problem.memory, decision_values(problem, solution))
        if peak > problem.budget_bytes * (1 + 1e-9):
            errors.append(f"modelled activation peak {peak:.0f} bytes (at {where}) > budget {problem.budget_bytes}")
    elif problem.budget_bytes is not None and saved_bytes(problem, solution) > problem.budget_bytes:
        errors.append(
            f"saved {saved_bytes(problem, solution)} bytes > budget {problem.budget_bytes}"
        )
    boundary = problem.boundary_budget_bytes
    if boundary is not None and saved_bytes(problem, solution) > boundary:
        errors.append(f"saved {saved_bytes(problem, solution)} bytes > boundary budget {boundary}")
    errors += check_windows(problem, solution)
    return errors


# --- communication windows (Lynx) ---------------------------------


def overlapped_seconds(problem: PlanProblem, solution: PlanSolution) -> float:
    """Recompute time hidden in communication windows (not on the critical path)."""
    by_name = problem.by_name()
    return sum(by_name[name].recompute_seconds for name in solution.windows if name in by_name)


def exposed_seconds(problem: PlanProblem, solution: PlanSolution) -> float:
    """`added_seconds` minus what the windows hide: the MILP's objective."""
    return added_seconds(problem, solution) - overlapped_seconds(problem, solution)


def check_windows(problem: PlanProblem, solution: PlanSolution) -> list[str]:
    """Violations of the window rules: only recomputed values, only legal
    windows, capacity respected; a placed value's recomputed inputs are
    placed too (what runs in a window is then exactly what its capacity
    counts), in the same or an earlier window."""
    if not solution.windows:
        return []
    errors = []
    by_name = problem.by_name()
    windows = {w.name: w for w in problem.windows}
    load: dict[str, float] = {}
    for name, window in solution.windows.items():
        cand = by_name.get(name)
        if cand is None or window not in windows:
            errors.append(f"{name}: unknown candidate or window {window}")
            continue
        if solution.decision(name) is not Decision.RECOMPUTE:
            errors.append(f"{name}: placed in window {window} but not recomputed")
        if window not in cand.windows:
            errors.append(f"{name}: window {window} is not legal for it")
        load[window] = load.get(window, 0.0) + cand.recompute_seconds
        for inp in cand.inputs:
            other = solution.windows.get(inp)
            if other in windows and windows[other].opens > windows[window].opens:
                errors.append(f"{name}: input {inp} is placed in a later window ({other})")
            elif inp in by_name and other is None and solution.decision(inp) is Decision.RECOMPUTE:
                errors.append(f"{name}: input {inp} is recomputed on demand, outside any window")
    for window, seconds in load.items():
        capacity = windows[window].seconds
        if seconds > capacity * (1 + 1e-6) + 1e-12:
            errors.append(f"window {window}: {seconds:.3g} s of recompute > capacity {capacity:.3g} s")
    return errors


def _feeds_recompute(cand: Candidate, choice: Choice) -> bool:
    if choice.decision is not Decision.COMPRESS:
        return True
    return next(o.feeds_recompute for o in cand.compress if o.codec == choice.codec)
