"""Peak model: the activation memory of a plan at every position of the
step, as linear expressions in the decisions, and the plan simulator it is
checked against.

Reads: a `PlanProblem` whose candidates carry `Lifetime`s and whose
`StepLayout` gives the positions. Writes nothing; `build_memory_model`
returns a `MemoryModel` (plain rows for the MILP), `evaluate` the model's
peak for a solution, `simulate` the exact peak under the extractor's
semantics.

The backward runs its nodes in a fixed order (`lifetimes`); what a plan
changes is which values are alive between them:

* a kept value is alive from the boundary to its last need;
* a recomputed value from its first need to its last need (its bytes:
  `Lifetime.backward_bytes`, 0 when fused into its readers or a view);
* a compressed value's payload until its first direct read (or, with none,
  its last possible need), and the decompressed value from its first need
  to its last;

where a value is *needed* at the positions of the backward nodes that read
it, and, through every recomputed value computed from it, at that value's
recomputation, which happens at its first need. Needs propagate from users
to inputs, so they are auxiliary variables: ``need[v, s] >= need[u, s] +
rec[u] - 1`` for a recomputable user ``u`` of ``v`` at positions up to u's
first direct read (after it, u exists already), and ``f[v, s]`` / ``g[v, s]``
(needed at or before / at or after s) are their running maxima. A product
of a decision and these is bounded below by the usual ``x + y - 1``. Every
bound pushes an auxiliary variable up only where the plan needs it, and the
memory rows push them down, so the model's peak is an upper bound on the
simulated one; it over-estimates where a value is needed early through one
user and read directly later (it is then counted alive in between, and a
compressed value's payload with it).

No bound or row subtracts an auxiliary variable, and that is what makes
the bound hold for the MILP's plans too: the solver may raise any of them
(they are continuous, bounded below only), which only adds bytes. The
payload once was counted until the first need, as ``comp - f[v, s - 1]``:
the MILP raised that "needed before" flag where the decompressed value it
then counts a position early fell on a row with slack, and its plans
simulated over the budget (a Llama-style plan at 14.3 MB: 0.46 MB more than
its own model said; `tests/passes/test_peak_model.py`).

The plan simulator goes one step further: a recomputed value needed at a
position only as an input of other values recomputed there (an
*intermediate* of that position's recomputation) is not alive through the
whole recomputation, whose nodes run in forward order, each freed after
its last reader; it counts, at that position, the largest set of
intermediates whose forward intervals overlap (`maximal_overlaps`). Full
checkpointing's plan recomputes a whole block at the block's first
backward node: counting every intermediate at once priced it 1.24x what
its split graphs hold (4-layer Llama, d_model 128). The rows cannot do the
same soundly: they do not know where a value is recomputed, only the span
where it may be (need variables are ranges), so an input of a value
recomputed early stays counted to that value's first read.

The forward holds every value the plan saves from its node to the end
(a compressed one also its codec's scratch at its node,
`CompressOption.compress_scratch`);
values only the backward reads run in the forward only when saved, or when
a saved value is computed from them (``fc[v]``). A value Inductor would fuse
away is written once when compressed (``Lifetime.written_bytes``) and then
lives like any forward temporary.

Where the budget bounds the whole step (``budget_scope="step"``), the
layout also carries the backward's own bytes at each position (gradients,
`lifetimes.backward_base`): constants of the backward rows, and of the
simulation.

Positions are grouped into segments (`segment_positions`); a row bounds the
bytes alive anywhere in its segment. One position per segment is exact; the
blocks of a class of identical blocks other than its representative each
form one segment (the representative, processed first in the backward,
holds every other block's saved values and is where the peak lies), which
keeps the model small at 32 layers while staying an upper bound.

Under depth folding (``problem.repeat``, `depth_fold`) one block stands for
copies of itself: the rows and the simulation add what the copies hold
(``copies`` x the block's kept bytes and payloads, on the representative's
variables) at every position from the block's forward to its backward
(`repeat_span`).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from .plan_problem import (
    AuxBound,
    Candidate,
    Decision,
    Lifetime,
    MemoryModel,
    MemoryRow,
    PlanProblem,
    PlanSolution,
    StepLayout,
    repeated_held_bytes,
)

MAX_SEGMENTS = 600
"""Per phase: wider segments beyond this (the model stays an upper bound)."""


# --------------------------------------------------------------------------
# segments
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segments:
    """Position -> segment index, for one phase."""

    of: tuple[int, ...]
    count: int


def segment_positions(layers: tuple[str, ...], coarse: frozenset[str], limit: int = MAX_SEGMENTS) -> Segments:
    """Each run of a coarse block's positions forms one segment (with the
    nodes outside any block between two of its positions, such as the
    residual adds that interleave with its backward); every other position
    is a segment of its own, widened evenly if there would be more than
    ``limit``.

    A block can have more than one run: the values only the backward reads
    that the forward computes at its end (`early_placement`) sit after the
    loss region, one short run per block. The positions between two runs
    belong to other blocks or to none; folding them into the block's
    segment dropped the forward's last rows, the logits', with the coarse
    block's (HF Llama, 5 layers: a plan modelled at 5,012,992 bytes held
    5,078,528 by the exact rows)."""
    owner = list(layers)
    start = 0
    for layer, run in itertools.groupby(layers):
        end = start + len(list(run))
        if layer == "" and 0 < start and end < len(layers):
            before, after = layers[start - 1], layers[end]
            if before == after and before in coarse:
                owner[start:end] = [before] * (end - start)
        start = end
    runs = sum(1 for i, layer in enumerate(owner) if layer in coarse and (i == 0 or owner[i - 1] != layer))
    fine = sum(1 for layer in owner if layer not in coarse)
    width = max(1, -(-fine // max(limit - runs, 1)))
    of: list[int] = []
    count = 0
    run = 0
    previous = None
    for layer in owner:
        if layer in coarse:
            if layer != previous:
                count += 1
            run = 0
        else:
            if run % width == 0 or previous in coarse:
                count += 1
                run = 0
            run += 1
        of.append(count - 1)
        previous = layer
    return Segments(tuple(of), count)


# --------------------------------------------------------------------------
# static need ranges
# --------------------------------------------------------------------------


def _users(problem: PlanProblem) -> dict[str, list[Candidate]]:
    users: dict[str, list[Candidate]] = defaultdict(list)
    for cand in problem.candidates:
        for inp in dict.fromkeys(cand.inputs):
            users[inp].append(cand)
    return users


def need_segments(problem: PlanProblem, bw: Segments) -> dict[str, frozenset[int]]:
    """Segments where each candidate may be needed, under any plan."""
    users = _users(problem)
    out: dict[str, frozenset[int]] = {}
    for cand in reversed(problem.candidates):
        lt = cand.lifetime
        direct = {bw.of[p] for p in lt.reads} if lt else set()
        need = set(direct)
        for user in users.get(cand.name, ()):
            if not user.can_recompute or user.name not in out:
                continue
            need |= _until_first_read(out[user.name], user, bw, cand.name)
        out[cand.name] = frozenset(need)
    return out


def _until_first_read(need: frozenset[int], user: Candidate, bw: Segments, of: str = "") -> set[int]:
    """The segments of ``need`` where a recomputed ``user`` needs its input
    ``of``: up to the user's first direct read (after it, the user exists
    already and needs none of its inputs), or all of them when the user is
    a view of ``of`` (it shares that storage for as long as it lives)."""
    reads = user.lifetime.reads if user.lifetime else ()
    if not reads or (of and user.lifetime is not None and user.lifetime.alias_of == of):
        return set(need)
    first = bw.of[reads[0]]
    return {s for s in need if s <= first}


# --------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------


class _Ranges:
    """Linear terms added over ranges of segments, summed per key with
    difference arrays (a kept value is held from the boundary to its first
    need: adding it segment by segment costs values x segments)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.diff: dict[str, list[float]] = {}

    def add(self, key: str, lo: int, hi: int, coef: float) -> None:
        if hi < lo or not coef:
            return
        diff = self.diff.get(key)
        if diff is None:
            diff = self.diff[key] = [0.0] * (self.count + 1)
        diff[lo] += coef
        diff[hi + 1] -= coef

    def flush(self, rows: list[dict[str, float]]) -> None:
        for key, diff in self.diff.items():
            running = 0.0
            for s in range(self.count):
                running += diff[s]
                if abs(running) > 1e-9:
                    rows[s][key] += running


class _Builder:
    def __init__(self) -> None:
        self.aux: list[tuple[AuxBound, ...]] = []
        self._products: dict[tuple[str, ...], str] = {}

    def new(self, bounds: Iterable[AuxBound]) -> str:
        self.aux.append(tuple(bounds))
        return f"aux:{len(self.aux) - 1}"

    def product(self, variables: tuple[str, ...]) -> str:
        """An auxiliary variable >= the product of binary-valued ``variables``."""
        key = tuple(sorted(variables))
        if key not in self._products:
            terms = tuple((v, 1.0) for v in key)
            self._products[key] = self.new([AuxBound(const=-(len(terms) - 1.0), terms=terms)])
        return self._products[key]


def _key(kind: str, name: str, rep_of: dict[str, str], codec: str | None = None) -> str:
    name = rep_of.get(name, name)
    return f"{kind}:{name}" if codec is None else f"{kind}:{name}:{codec}"


def build_memory_model(
    problem: PlanProblem,
    *,
    coarse_blocks: frozenset[str] = frozenset(),
    rep_of: dict[str, str] | None = None,
    limit: int = MAX_SEGMENTS,
) -> MemoryModel:
    """Rows bounding the activation bytes of every segment of the step.

    ``rep_of`` maps candidates folded by block reuse to the representative
    whose decision they share (variable keys name the representative)."""
    layout = problem.layout
    assert layout is not None, "build_memory_model needs a StepLayout"
    rep_of = rep_of or {}
    fw = segment_positions(layout.forward_layers, coarse_blocks, limit)
    bw = segment_positions(layout.backward_layers, coarse_blocks, limit)
    needs = need_segments(problem, bw)
    users = _users(problem)
    capped = {c.name: _until_first_read(needs[c.name], c, bw) for c in problem.candidates if c.lifetime}
    whole = {c.name: set(needs[c.name]) for c in problem.candidates if c.lifetime}
    b = _Builder()
    need_var: dict[tuple[str, int], str | float] = {}
    rows_bw: list[dict[str, float]] = [defaultdict(float) for _ in range(bw.count)]
    ranges = _Ranges(bw.count)
    for cand in reversed(problem.candidates):
        lt = cand.lifetime
        if lt is None:
            continue
        direct = sorted({bw.of[p] for p in lt.reads})
        span = sorted(needs[cand.name])
        # Need variables are only made where something reads them: before
        # the first direct read (when the value itself may be recomputed or
        # decompressed, or its inputs recomputed for it), after the last
        # (when it outlives its reads), and in between only for a view user
        # that shares its storage throughout.
        shares = any(
            u.can_recompute and u.lifetime is not None and u.lifetime.alias_of == cand.name
            for u in users.get(cand.name, ())
        )
        early = cand.can_recompute or bool(cand.compress)
        for s in span:
            if s in direct:
                need_var[(cand.name, s)] = 1.0
                continue
            if direct and (
                (direct[0] < s < direct[-1] and not shares) or (s < direct[0] and not early and not shares)
            ):
                continue
            bounds = []
            for user in users.get(cand.name, ()):
                if not user.can_recompute or user.lifetime is None:
                    continue
                views_it = user.lifetime.alias_of == cand.name
                if s not in (whole if views_it else capped).get(user.name, ()):
                    continue
                un = need_var.get((user.name, s), 0.0)
                rec = _key("rec", user.name, rep_of)
                if un == 1.0:
                    bounds.append(AuxBound(const=0.0, terms=((rec, 1.0),)))
                elif un:
                    bounds.append(AuxBound(const=-1.0, terms=((str(un), 1.0), (rec, 1.0))))
            need_var[(cand.name, s)] = b.new(bounds) if bounds else 0.0
        _add_backward_terms(b, cand, span, direct, need_var, rows_bw, ranges, rep_of)
    if problem.windows:
        _add_window_terms(b, problem, bw, needs, ranges, rep_of)
    rows_fw = _forward_rows(b, problem, fw, users, rep_of)
    if problem.repeat is not None:
        _add_repeat_terms(problem, fw, bw, rows_fw, ranges, rep_of)
    ranges.flush(rows_bw)
    bw_consts = [0.0] * bw.count  # the backward's own bytes (gradients), where the budget is the step's
    for position, nbytes in enumerate(layout.backward_base):
        s = bw.of[position]
        bw_consts[s] = max(bw_consts[s], float(nbytes))
    dominated_fw = dominated_segments(layout.forward_layers, fw, coarse_blocks)
    dominated_bw = dominated_segments(layout.backward_layers, bw, coarse_blocks)
    rows = _merge(
        [("fw", i, r) for i, r in enumerate(rows_fw) if i not in dominated_fw]
        + [("bw", i, (bw_consts[i], r)) for i, r in enumerate(rows_bw) if i not in dominated_bw]
    )
    return _prune_aux(b.aux, rows)


def dominated_segments(layers: tuple[str, ...], segments: Segments, coarse: frozenset[str]) -> frozenset[int]:
    """Segments of coarse blocks: rows that the exact blocks' rows bound.

    A coarse block is a member of a class of identical blocks sharing
    decisions, other than its first and last (`stages.structure_stage`;
    the block last in the forward decides apart and is exact), with the
    representative's decisions. The representative is the last of those
    blocks in the forward, the first of them differentiated: its forward holds the
    saved values of every earlier block, and its backward too, beside the
    block's working set, so a middle block's forward and backward, with
    fewer blocks' saved values and the same working set, hold no more.
    Under a step budget the backward's gradients grow as the saved values
    shrink: a block's backward row is linear in its index (k blocks' saved
    values, the other blocks' gradients), largest at one of the two ends,
    and the first block in the forward, the last differentiated, is the
    other end, also exact. A coarse row would only add an over-count, and
    rows that grow with depth."""
    if not coarse:
        return frozenset()
    return frozenset(segments.of[position] for position, layer in enumerate(layers) if layer in coarse)


def _prune_aux(aux: list[tuple[AuxBound, ...]], rows: list[MemoryRow]) -> MemoryModel:
    """The model without the auxiliary variables no row reaches (directly or
    through other variables' bounds), renumbered in their order (a
    variable's bounds refer only to variables before it)."""

    def aux_refs(terms: Iterable[tuple[str, float]]) -> list[int]:
        return [int(key[4:]) for key, _ in terms if key.startswith("aux:")]

    live = [False] * len(aux)
    stack = [i for row in rows for i in aux_refs(row.terms)]
    while stack:
        i = stack.pop()
        if live[i]:
            continue
        live[i] = True
        stack.extend(j for bound in aux[i] for j in aux_refs(bound.terms))
    index: dict[int, int] = {}
    for i, alive in enumerate(live):
        if alive:
            index[i] = len(index)

    def renumber(terms: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
        return tuple((f"aux:{index[int(k[4:])]}" if k.startswith("aux:") else k, v) for k, v in terms)

    kept_aux = tuple(
        tuple(AuxBound(const=bound.const, terms=renumber(bound.terms)) for bound in aux[i])
        for i, alive in enumerate(live) if alive
    )
    kept_rows = tuple(MemoryRow(name=row.name, const=row.const, terms=renumber(row.terms)) for row in rows)
    return MemoryModel(aux=kept_aux, rows=kept_rows)


def _add_backward_terms(
    b: _Builder,
    cand: Candidate,
    span: list[int],
    direct: list[int],
    need_var: dict[tuple[str, int], str | float],
    rows: list[dict[str, float]],
    ranges: _Ranges,
    rep_of: dict[str, str],
) -> None:
    lt = cand.lifetime
    assert lt is not None
    if not span:
        return
    lo, hi = span[0], span[-1]
    first_direct = direct[0] if direct else None
    last_direct = direct[-1] if direct else None

    def need(s: int) -> str | float:
        return need_var.get((cand.name, s), 0.0)

    # f[s]: needed at or before s, for s in [lo, hi]; 1 from the first read.
    f: dict[int, str | float] = {}
    running: str | float = 0.0
    for s in range(lo, hi + 1):
        if first_direct is not None and s >= first_direct:
            running = 1.0
        else:
            running = _max_of(b, running, need(s))
        f[s] = running
    # g[s]: needed at or after s, for s in [lo, hi]; 1 up to the last read.
    g: dict[int, str | float] = {}
    running = 0.0
    for s in range(hi, lo - 1, -1):
        if last_direct is not None and s <= last_direct:
            running = 1.0
        else:
            running = _max_of(b, running, need(s))
        g[s] = running
    keep = _key("keep", cand.name, rep_of) if cand.can_keep else None
    rec = _key("rec", cand.name, rep_of) if cand.can_recompute else None
    comps = [(_key("comp", cand.name, rep_of, o.codec), o.nbytes) for o in cand.compress]
    # Before the first possible need a kept value, or a compressed value's
    # payload, is held from the boundary: linear (a value kept but never
    # needed would not be saved; counting it only costs the MILP memory).
    if keep is not None:
        ranges.add(keep, 0, lo - 1, cand.keep_bytes)
    # A payload up to its first direct read (or the span's end), even where
    # a recomputation needs the value sooner and the decompress frees it
    # there: bytes · comp · (1 - needed before s) would subtract a "needed"
    # flag, which the MILP can raise at will where that costs only slack
    # (see the module docstring).
    payload_end = first_direct if first_direct is not None else hi
    for comp, nbytes in comps:
        ranges.add(comp, 0, payload_end, nbytes)
    for s in range(lo, hi + 1):
        gs, fs = g[s], f[s]
        if keep is not None and cand.keep_bytes:
            if gs == 1.0:
                ranges.add(keep, s, s, cand.keep_bytes)
            else:
                _add_product(b, rows[s], cand.keep_bytes, [keep], [gs])
        if rec is not None and lt.backward_bytes:
            _add_product(b, rows[s], lt.backward_bytes, [rec], [fs, gs])
        for comp, _ in comps:
            if cand.keep_bytes:
                _add_product(b, rows[s], cand.keep_bytes, [comp], [fs, gs])


def burst_interval(lt: Lifetime) -> tuple[int, int]:
    """Forward positions from a value's node to its last forward reader,
    late readers (run only when something computed from them is saved or
    recomputed) included: the value's lifetime within a recomputation of
    the forward's nodes, which runs them in forward order."""
    end = max([lt.produced, lt.forward_last_use, *(p for _, p in lt.late_readers)])
    return lt.produced, end


def maximal_overlaps(intervals: list[tuple[int, int]]) -> list[list[int]]:
    """Indices of ``intervals`` (closed) in each maximal set that share a
    point: every point's set of intervals is a subset of one of them."""
    sets: list[frozenset[int]] = []
    for end in sorted({hi for _, hi in intervals}):
        sets.append(frozenset(i for i, (lo, hi) in enumerate(intervals) if lo <= end <= hi))
    unique = set(sets)
    return [sorted(a) for a in sorted(unique, key=sorted) if not any(a < other for other in unique)]


def window_bytes(cand: Candidate) -> int:
    """Bytes ``cand`` occupies when recomputed inside a communication
    window: a value fused into its readers on demand is materialised there
    (it runs long before them); a view shares its base's storage, which its
    base's own terms count."""
    lt = cand.lifetime
    if lt is None or lt.alias_of:
        return 0
    return max(lt.backward_bytes, cand.keep_bytes)


def _add_window_terms(
    b: _Builder,
    problem: PlanProblem,
    bw: Segments,
    needs: dict[str, frozenset[int]],
    ranges: _Ranges,
    rep_of: dict[str, str],
) -> None:
    """A recomputation placed in window w (``ov:<v>:<w>``) runs when w
    opens, not at its first need: the value is alive from there, and so is
    the decompressed copy of every compressed input it reads (the schedule
    moves the decompression with it). Recomputed inputs must sit in a window
    no later than v's (`milp`), so their own terms cover them.

    Over ``[opens, last possible need]`` the value holds `window_bytes`; the
    on-demand term (``rec``) counts ``backward_bytes`` from its first need,
    so the window term adds ``window_bytes - backward_bytes`` there, and
    ``backward_bytes`` more before the first direct read (an upper bound:
    exact unless a recomputed reader needs the value before that)."""
    opens = {w.name: w.opens for w in problem.windows}
    by_name = problem.by_name()
    for cand in problem.candidates:
        lt = cand.lifetime
        span = needs.get(cand.name)
        if lt is None or not cand.windows or not span:
            continue
        nbytes = window_bytes(cand)
        hi = max(span)
        first_read = bw.of[lt.reads[0]] if lt.reads else hi + 1
        for window in cand.windows:
            if window not in opens:
                continue
            ov = _key("ov", cand.name, rep_of, window)
            start = bw.of[min(opens[window], len(bw.of) - 1)]
            ranges.add(ov, start, hi, nbytes - lt.backward_bytes)
            ranges.add(ov, start, first_read - 1, lt.backward_bytes)
            for inp in dict.fromkeys(cand.inputs):
                source = by_name.get(inp)
                if source is None or not source.compress or not source.keep_bytes:
                    continue
                for option in source.compress:
                    both = b.product((ov, _key("comp", inp, rep_of, option.codec)))
                    ranges.add(both, start, first_read - 1, source.keep_bytes)


def repeat_span(layout: StepLayout, block: str) -> tuple[int, int]:
    """Where the copies of a repeated ``block`` hold their values: forward
    positions from the block's first on, backward positions up to its last
    (the copies run right after it in the forward, so right before it in
    the backward). Returns (first forward position, last backward one)."""
    forward = [p for p, layer in enumerate(layout.forward_layers) if layer == block]
    backward = [p for p, layer in enumerate(layout.backward_layers) if layer == block]
    if not forward or not backward:
        raise ValueError(f"repeated block {block!r} has no forward or no backward position")
    return forward[0], backward[-1]


def _add_repeat_terms(
    problem: PlanProblem,
    fw: Segments,
    bw: Segments,
    rows_fw: list[tuple[float, dict[str, float]]],
    ranges: _Ranges,
    rep_of: dict[str, str],
) -> None:
    """The repeated block's copies: ``copies`` x what the block holds (kept
    bytes, compressed payloads) over `repeat_span`. A copy's own working set
    is the block's, so the rows at the block itself bound the copies' too."""
    repeat = problem.repeat
    assert repeat is not None and problem.layout is not None
    first_fw, last_bw = repeat_span(problem.layout, repeat.block)
    terms: dict[str, float] = defaultdict(float)
    for cand in problem.candidates:
        if cand.block != repeat.block or cand.lifetime is None:
            continue
        if cand.can_keep and cand.keep_bytes:
            terms[_key("keep", cand.name, rep_of)] += repeat.copies * cand.keep_bytes
        for option in cand.compress:
            if option.nbytes:
                terms[_key("comp", cand.name, rep_of, option.codec)] += repeat.copies * option.nbytes
    for key, coef in terms.items():
        ranges.add(key, 0, bw.of[last_bw], coef)
        for s in range(fw.of[first_fw], fw.count):
            rows_fw[s][1][key] += coef


def _max_of(b: _Builder, x: str | float, y: str | float) -> str | float:
    """An auxiliary variable >= both (constants fold)."""
    if x == 1.0 or y == 1.0:
        return 1.0
    if x == 0.0:
        return y
    if y == 0.0 or x == y:
        return x
    return b.new([AuxBound(const=0.0, terms=((str(x), 1.0),)), AuxBound(const=0.0, terms=((str(y), 1.0),))])


def _add_product(b: _Builder, row: dict[str, float], nbytes: float, decisions: list[str], factors: list[str | float]) -> None:
    """row += nbytes * decision * Π factors (factors in [0, 1])."""
    if any(f == 0.0 for f in factors):
        return
    variables = [str(f) for f in factors if f != 1.0]
    if not variables:
        for d in decisions:
            row[d] += nbytes
        return
    row[b.product((*decisions, *variables))] += nbytes


def _forward_rows(
    b: _Builder, problem: PlanProblem, fw: Segments, users: dict[str, list[Candidate]], rep_of: dict[str, str]
) -> list[tuple[float, dict[str, float]]]:
    layout = problem.layout
    assert layout is not None
    consts = [0.0] * fw.count
    for position, nbytes in enumerate(layout.forward_base):
        s = fw.of[position]
        consts[s] = max(consts[s], float(nbytes))
    # Plan-independent forward temporaries of candidates, per position, then
    # the segment maximum (a segment's const is its peak position's bytes).
    extra = [0.0] * (len(layout.forward_base) + 1)
    rows: list[dict[str, float]] = [defaultdict(float) for _ in range(fw.count)]
    ranges = _Ranges(fw.count)
    computed: dict[str, str | float] = {}
    last_segment = fw.count - 1
    for cand in reversed(problem.candidates):
        lt = cand.lifetime
        if lt is None or lt.produced < 0:
            continue
        p, end = fw.of[lt.produced], fw.of[lt.forward_last_use]
        keep = _key("keep", cand.name, rep_of) if cand.can_keep else None
        comps = [(_key("comp", cand.name, rep_of, o.codec), o.nbytes) for o in cand.compress]
        if lt.forward_always:
            extra[lt.produced] += lt.forward_bytes  # a difference array, summed below
            extra[lt.forward_last_use + 1] -= lt.forward_bytes
            held_from = end + 1 if lt.forward_bytes else p
            if lt.forward_bytes:
                _late_reader_terms(rows, lt, fw, computed, lt.forward_bytes, _unless_kept(b, keep))
        else:
            bounds = [AuxBound(const=0.0, terms=((keep, 1.0),))] if keep else []
            bounds += [AuxBound(const=0.0, terms=((c, 1.0),)) for c, _ in comps]
            for user in users.get(cand.name, ()):
                mark = computed.get(user.name)
                if isinstance(mark, str):
                    bounds.append(AuxBound(const=0.0, terms=((mark, 1.0),)))
            computed[cand.name] = b.new(bounds) if bounds else 0.0
            if lt.forward_bytes and isinstance(computed[cand.name], str):
                for s in range(p, end + 1):
                    rows[s][computed[cand.name]] += lt.forward_bytes
                # A late reader computed in the forward computes this value
                # too, and keeps its storage alive until it runs.
                _late_reader_terms(rows, lt, fw, computed, lt.forward_bytes, _unless_kept(b, keep))
            held_from = end + 1 if lt.forward_bytes else p
        if keep and cand.keep_bytes:
            ranges.add(keep, held_from, last_segment, cand.keep_bytes)
        for (comp, nbytes), option in zip(comps, cand.compress):
            ranges.add(comp, p, last_segment, nbytes)
            if option.compress_scratch:  # while the compress runs, right after the value
                ranges.add(comp, p, p, option.compress_scratch)
            if lt.written_bytes:
                _written_terms(b, rows, ranges, lt, fw, computed, comp)
    ranges.flush(rows)
    running = 0.0
    for position in range(len(layout.forward_base)):
        running += extra[position]
        s = fw.of[position]
        consts[s] = max(consts[s], float(layout.forward_base[position]) + running)
    return [(consts[s], rows[s]) for s in range(fw.count)]


def _written_terms(
    b: _Builder,
    rows: list[dict[str, float]],
    ranges: _Ranges,
    lt: Lifetime,
    fw: Segments,
    computed: dict[str, str | float],
    comp: str,
) -> None:
    """A value written only because the plan compresses it (`Lifetime.written_bytes`)
    lives from its node to its last forward use, and on to each late
    reader the plan computes in the forward: rows += comp · bytes, then
    comp · fc[r] · bytes over each extension."""
    ranges.add(comp, fw.of[lt.produced], fw.of[lt.forward_last_use], lt.written_bytes)
    _late_reader_terms(rows, lt, fw, computed, lt.written_bytes, lambda mark: b.product((comp, mark)))


def _unless_kept(b: _Builder, keep: str | None) -> Callable[[str], str]:
    """fc[r] -> fc[r] · (1 - keep): a kept value is counted by its keep term
    from its last forward use on."""
    if keep is None:
        return lambda mark: mark
    return lambda mark: b.new([AuxBound(const=0.0, terms=((mark, 1.0), (keep, -1.0)))])


def _late_reader_terms(
    rows: list[dict[str, float]],
    lt: Lifetime,
    fw: Segments,
    computed: dict[str, str | float],
    nbytes: float,
    gate: Callable[[str], str],
) -> None:
    """A storage read later by a value the plan may compute in the forward
    lives until that reader, if it is computed there: rows += gate(fc[r]) ·
    bytes from the segment after the last forward use to the reader's."""
    start = fw.of[lt.forward_last_use] + 1
    for name, position in lt.late_readers:
        mark = computed.get(name)
        if not isinstance(mark, str):
            continue
        mark = gate(mark)
        for s in range(start, fw.of[position] + 1):
            rows[s][mark] += nbytes


def _merge(rows: list[tuple[str, int, tuple[float, dict[str, float]]]]) -> list[MemoryRow]:
    """Rows with the same terms keep the largest constant."""
    best: dict[tuple, tuple[str, float]] = {}
    for phase, index, (const, terms) in rows:
        key = tuple(sorted((k, v) for k, v in terms.items() if v))
        name = f"{phase}{index}"
        if key not in best or const > best[key][1]:
            best[key] = (name, const)
    return [MemoryRow(name=name, const=const, terms=key) for key, (name, const) in best.items()]


# --------------------------------------------------------------------------
# evaluation and simulation
# --------------------------------------------------------------------------


def decision_values(problem: PlanProblem, solution: PlanSolution, rep_of: dict[str, str] | None = None) -> dict[str, float]:
    """Decision variable key -> 0/1 for ``solution`` (on the model's keys)."""
    values: dict[str, float] = {}
    for cand in problem.candidates:
        choice = solution.choices.get(cand.name)
        if choice is None:
            continue
        name = (rep_of or {}).get(cand.name, cand.name)
        if choice.decision is Decision.KEEP:
            values[f"keep:{name}"] = 1.0
        elif choice.decision is Decision.RECOMPUTE:
            values[f"rec:{name}"] = 1.0
        elif choice.decision is Decision.COMPRESS:
            values[f"comp:{name}:{choice.codec}"] = 1.0
    for cand_name, window in solution.windows.items():
        values[f"ov:{(rep_of or {}).get(cand_name, cand_name)}:{window}"] = 1.0
    return values


def evaluate(model: MemoryModel, values: dict[str, float]) -> tuple[float, str]:
    """The model's peak for fixed decisions (auxiliary variables at their
    smallest feasible values) and the row where it lies."""
    aux = [0.0] * len(model.aux)

    def value(key: str) -> float:
        if key.startswith("aux:"):
            return aux[int(key[4:])]
        return values.get(key, 0.0)

    for i, bounds in enumerate(model.aux):
        best = 0.0
        for bound in bounds:
            best = max(best, bound.const + sum(c * value(k) for k, c in bound.terms))
        aux[i] = min(best, 1.0)
    peak, where = 0.0, ""
    for row in model.rows:
        total = row.const + sum(c * value(k) for k, c in row.terms)
        if total > peak:
            peak, where = total, row.name
    return peak, where


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedPeak:
    peak_bytes: int
    forward_peak_bytes: int
    backward_peak_bytes: int
    saved_bytes: int
    where: str
    """"forward <position>" or "backward <position>"."""


def simulate(problem: PlanProblem, solution: PlanSolution) -> SimulatedPeak:
    """Activation bytes of the step under ``solution``, position by position,
    with the extractor's semantics: each recomputation at its first need (or
    when its communication window opens, if placed in one), every value
    freed after its last need, a value needed only to recompute others at
    one position freed within that recomputation (see the module
    docstring)."""
    layout = problem.layout
    assert layout is not None
    by_name = problem.by_name()
    users = _users(problem)
    decision = {c.name: solution.decision(c.name) for c in problem.candidates}
    codec = {n: ch.codec for n, ch in solution.choices.items()}
    opens = {w.name: w.opens for w in problem.windows}
    placed = {n: opens[w] for n, w in solution.windows.items() if w in opens and decision.get(n) is Decision.RECOMPUTE}
    first_need: dict[str, int] = {}
    last_need: dict[str, int] = {}
    for cand in reversed(problem.candidates):
        lt = cand.lifetime
        needs = list(lt.reads) if lt else []
        for user in users.get(cand.name, ()):
            if decision.get(user.name) is Decision.RECOMPUTE and user.name in first_need:
                needs.append(first_need[user.name])
                if user.lifetime is not None and user.lifetime.alias_of == cand.name:
                    needs.append(last_need[user.name])  # a view keeps its base alive
        if needs and cand.name in placed:
            needs.append(placed[cand.name])  # recomputed when its window opens
        if needs and decision[cand.name] is not Decision.NONE:
            first_need[cand.name], last_need[cand.name] = min(needs), max(needs)
    bw = _Spans(list(layout.backward_base) or [0] * layout.backward_positions)
    bursts: dict[int, list[tuple[tuple[int, int], int]]] = defaultdict(list)
    saved = 0
    for cand in problem.candidates:
        d, lt = decision[cand.name], cand.lifetime
        if lt is None or d is Decision.NONE:
            continue
        if d is Decision.KEEP:
            saved += cand.keep_bytes
        if d is Decision.COMPRESS:
            saved += next(o.nbytes for o in cand.compress if o.codec == codec[cand.name])
        if cand.name not in first_need:
            continue
        lo, hi = first_need[cand.name], last_need[cand.name]
        if d is Decision.KEEP:
            bw.add(0, hi, cand.keep_bytes)
        elif d is Decision.RECOMPUTE:
            if lo == hi and lo not in lt.reads and cand.name not in placed:  # an intermediate at lo
                bursts[lo].append((burst_interval(lt), lt.backward_bytes))
            else:
                bw.add(lo, hi, window_bytes(cand) if cand.name in placed else lt.backward_bytes)
        else:
            payload = next(o.nbytes for o in cand.compress if o.codec == codec[cand.name])
            bw.add(0, lo, payload)
            bw.add(lo, hi, cand.keep_bytes)
    for position, members in bursts.items():
        intervals = [interval for interval, _ in members]
        bw.add(position, position, max(sum(members[i][1] for i in chosen) for chosen in maximal_overlaps(intervals)))
    fw = _Spans([float(x) for x in layout.forward_base] or [0.0] * layout.forward_positions)
    last = layout.forward_positions - 1
    in_forward: dict[str, bool] = {}
    for cand in reversed(problem.candidates):
        lt = cand.lifetime
        if lt is None or lt.produced < 0:
            continue
        d = decision[cand.name]
        held = d in (Decision.KEEP, Decision.COMPRESS)
        computed = lt.forward_always or held or any(in_forward.get(u.name) for u in users.get(cand.name, ()))
        in_forward[cand.name] = computed
        if not computed:
            continue
        temp_end = lt.forward_last_use if lt.forward_bytes else lt.produced - 1
        if lt.forward_bytes:
            temp_end = max([temp_end, *(p for name, p in lt.late_readers if in_forward.get(name))])
        fw.add(lt.produced, temp_end, lt.forward_bytes)
        if d is Decision.KEEP:
            fw.add(temp_end + 1, last, cand.keep_bytes)
        elif d is Decision.COMPRESS:
            option = next(o for o in cand.compress if o.codec == codec[cand.name])
            fw.add(lt.produced, last, option.nbytes)
            fw.add(lt.produced, lt.produced, option.compress_scratch)
            if lt.written_bytes:  # written for the codec, alive like a temporary
                written_end = max([lt.forward_last_use, *(p for name, p in lt.late_readers if in_forward.get(name))])
                fw.add(lt.produced, written_end, lt.written_bytes)
    if problem.repeat is not None:
        first_fw, last_bw = repeat_span(layout, problem.repeat.block)
        held = problem.repeat.copies * repeated_held_bytes(problem, solution)
        fw.add(first_fw, last, held)
        bw.add(0, last_bw, held)
        saved += held
    fw, bw = fw.totals(), bw.totals()
    fw_peak = max(fw, default=0.0)
    bw_peak = max(bw, default=0)
    if fw_peak >= bw_peak:
        where = f"forward {fw.index(fw_peak)}" if fw else "forward"
    else:
        where = f"backward {bw.index(bw_peak)}"
    del by_name
    return SimulatedPeak(
        peak_bytes=int(max(fw_peak, bw_peak)),
        forward_peak_bytes=int(fw_peak),
        backward_peak_bytes=int(bw_peak),
        saved_bytes=saved,
        where=where,
    )


class _Spans:
    """Bytes added over ranges of positions, summed once at the end (a
    difference array): a plan's simulation adds tens of thousands of spans
    over thousands of positions (a 32-layer GPT-2: 18,000 spans, 0.7 s
    added element by element). A range is clipped to the positions; byte
    counts are whole numbers, so the sums are exact in any order."""

    def __init__(self, base: list) -> None:
        self.base = base
        self.diff = [0] * (len(base) + 1)

    def add(self, lo: int, hi: int, nbytes: float) -> None:
        lo, hi = max(lo, 0), min(hi, len(self.base) - 1)
        if nbytes and lo <= hi:
            self.diff[lo] += nbytes
            self.diff[hi + 1] -= nbytes

    def totals(self) -> list:
        return [b + d for b, d in zip(self.base, itertools.accumulate(self.diff))]
