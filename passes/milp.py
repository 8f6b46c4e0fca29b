"""The retain / recompute / compress MILP, built and solved with HiGHS.

Variables, for every candidate value v (only the legal ones exist):
``keep[v]``, ``rec[v]``, ``comp[v, c]`` per codec option c, all binary.

* one option at most: ``keep + rec + Σc comp ≤ 1``, and ``= 1`` where a
  backward node reads v;
* recompute needs inputs: ``rec[v] ≤ keep[u] + rec[u] + Σc comp[u, c]`` for
  every candidate input u (graph inputs and parameters are always there),
  the sum over codecs that give u back exactly (a lossy or few-bit payload
  never feeds a recomputation);
* memory: where the problem has a memory model (`peak_model`), every row
  of it (the activation bytes alive at a position of the step, through
  continuous auxiliary variables in [0, 1]) ``≤ budget``; without one (hand-
  made problems), ``Σ keep·bytes + Σ comp·compressed_bytes ≤ budget`` at the
  forward/backward boundary. A ratio budget also caps the boundary bytes
  (``boundary_budget_bytes``);
* objective: time ``Σ keep·t_keep + Σ rec·t_rec + Σ comp·t_codec`` (µs),
  plus tie breaks worth at most 0.1% of the cheapest option that prefer
  fewer saved bytes and a lower modelled peak.

Communication windows (Lynx), when the problem has any:
``ov[v, w]`` for every window w legal for v's recompute, binary;

* ``Σw ov[v, w] ≤ rec[v]`` (only a recomputed value is placed, in one window);
* capacity: ``Σv t_rec[v]·ov[v, w] ≤ d[w]``;
* inputs: a placed value's recomputed candidate inputs are placed too, so
  a window holds exactly the work its capacity counts:
  ``Σw ov[v, w] + rec[u] - Σw ov[u, w] ≤ 1``;
* order: for each candidate input u of v, u may not sit in a window that
  opens after v's: ``Σw o[w]·ov[u, w] - Σw o[w]·ov[v, w] + M·Σw ov[v, w] ≤ M``
  with o[w] the window's opening position and M the largest one;
* overlapped recompute time is not charged: ``ov[v, w]`` costs ``-t_rec[v]``
  plus a tie break (about twice v's byte tie break, so at no memory pressure
  keeping still wins, and later windows, nearer the use, are preferred).

Only this module imports highspy. The model is passed to HiGHS as one
row-wise sparse matrix (fast even for tens of thousands of variables) and
can be written as an ``.lp`` file for inspection.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from . import plan_timing
from .plan_problem import Candidate, Choice, Decision, PlanProblem, PlanSolution

log = logging.getLogger(__name__)

_US = 1e6
TIE_BREAK = 1e-3
"""Weight of the fewer-bytes tie break, relative to the cheapest option."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverOptions:
    time_limit_s: float = 120.0
    """A safety net: where it expires, the plan depends on how fast the
    machine ran the solve, and may differ between processes."""
    node_limit: int = 1000
    """Branch-and-bound nodes HiGHS may explore (``mip_max_nodes``). Unlike
    the time limit it stops the search at the same point in every process
    (one thread, a fixed seed): a 2-layer GPT's mixed plans at 0.39 of the
    default's memory took 20-30 s a solve, and under a 30 s time limit the
    same options planned two different plans in one process, by whether a
    solve finished (bench/RESULTS.md)."""
    mip_rel_gap: float = 1e-4
    threads: int = 1
    lp_path: str | None = None
    """Write the model here (HiGHS ``.lp`` format) before solving."""
    start: dict[str, Choice] | None = None
    """A plan to start from (HiGHS's MIP start): a re-plan starts from the
    plan it replaces (`adaptation`), so the solver begins with an incumbent.
    Candidates it does not name start at 0; HiGHS discards a start that is
    not feasible (the new statistics ruled an option out) and solves from
    scratch. The optimum does not depend on it."""
    start_from: str = "the given plan"
    """What ``start`` is, for the solution's note."""


@dataclass(slots=True)
class _Var:
    candidate: str
    decision: Decision
    codec: str | None
    seconds: float
    nbytes: int
    window: str | None = None
    """Set on an ``ov[v, w]`` variable (communication windows)."""
    feeds_recompute: bool = True
    """False for codecs whose output may not feed a recompute (lossy or
    few-bit: `CompressOption.feeds_recompute`)."""


@dataclass(slots=True)
class _Model:
    vars: list[_Var] = field(default_factory=list)
    continuous: dict[str, int] = field(default_factory=dict)
    """Continuous columns after the binaries (name -> position among them):
    the memory model's auxiliary variables, in [0, 1], and ``peak`` (in units
    of `peak_scale` bytes)."""
    credit: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    """``ov`` variable -> (recompute seconds it hides, bytes for the tie
    break, lateness in [0, 1) for the tie break) (communication windows)."""
    by_candidate: dict[str, list[int]] = field(default_factory=dict)
    rows: list[tuple[float, float, list[int], list[float], str]] = field(default_factory=list)

    def add_var(self, var: _Var) -> int:
        self.vars.append(var)
        index = len(self.vars) - 1
        self.by_candidate.setdefault(var.candidate, []).append(index)
        return index

    def column(self, name: str) -> int:
        """Column of continuous variable ``name`` (added on first use; the
        binaries come first, so they must all exist by then)."""
        if name not in self.continuous:
            self.continuous[name] = len(self.continuous)
        return len(self.vars) + self.continuous[name]


def with_start(options: SolverOptions, solution: PlanSolution, what: str) -> SolverOptions:
    """``options`` starting from ``solution``, a legal plan found before the
    solve (``what`` names it in the note), e.g. the lowest-peak plan for the
    solves at the reachable minimum; a start already given (a re-plan's) is
    kept."""
    if options.start is not None or not solution.choices:
        return options
    return dataclasses.replace(options, start=dict(solution.choices), start_from=what)


def solve_milp(
    problem: PlanProblem,
    options: SolverOptions = SolverOptions(),
    *,
    minimize: str = "time",
    time_cap_s: float | None = None,
) -> PlanSolution:
    """Solves ``problem``.

    Args:
        minimize: "time" (the plan's seconds, the normal objective), "bytes"
            (saved bytes) or "peak" (the modelled activation peak, then time:
            the reachable minimum of a problem with a memory model).
        time_cap_s: with ``minimize="bytes"``, cap the added time (used to
            find the smallest footprint among time-optimal plans).
    """
    if problem.repeat is not None:
        raise ValueError(
            "solve_milp needs the block-reduced problem under depth folding: its representatives "
            "carry the repeated block's copies (structure.reduce_identical_blocks)"
        )
    stuck = [c.name for c in problem.candidates if c.required and not _options(c)]
    if stuck:
        note = f"required values with no legal option: {stuck}"
        return PlanSolution(choices={}, status="infeasible", solver="milp", notes=(note,))
    with plan_timing.timed("build"):
        model = _build(problem, minimize=minimize, time_cap_s=time_cap_s)
        lp = _to_lp(model, minimize, problem)
    plan_timing.count_solve(lp.num_row_, lp.num_col_)
    highs = _quiet_highs()
    highs.setOptionValue("time_limit", float(options.time_limit_s))
    highs.setOptionValue("mip_max_nodes", int(options.node_limit))
    highs.setOptionValue("mip_rel_gap", float(options.mip_rel_gap))
    highs.setOptionValue("threads", int(options.threads))
    highs.setOptionValue("random_seed", 0)
    highs.passModel(lp)
    if options.lp_path:
        highs.writeModel(options.lp_path)
    started = options.start is not None and _set_start(highs, model, options.start)
    start = time.perf_counter()
    with plan_timing.timed("solve"):
        _run(highs)
    seconds = time.perf_counter() - start
    status = highs.getModelStatus()
    info = highs.getInfo()
    plan_timing.count_nodes(info.mip_node_count, info.mip_gap)
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if status == highspy.HighsModelStatus.kOptimal:
        label = "optimal"
    elif status in (highspy.HighsModelStatus.kInfeasible,):
        return PlanSolution(choices={}, status="infeasible", solver="milp", solve_seconds=seconds)
    elif has_solution:
        label = _STOPPED_WITH_A_PLAN.get(status, "feasible")
    else:
        return PlanSolution(
            choices={}, status=highs.modelStatusToString(status), solver="milp", solve_seconds=seconds
        )
    values = np.asarray(highs.getSolution().col_value)
    choices: dict[str, Choice] = {}
    windows: dict[str, str] = {}
    for index, var in enumerate(model.vars):  # the binaries
        if values[index] > 0.5:
            if var.window is not None:
                windows[var.candidate] = var.window
                continue
            choices[var.candidate] = Choice(decision=var.decision, codec=var.codec)
    notes = (f"started from {options.start_from}",) if started else ()
    if label in ("node_limit", "time_limit"):
        limit = f"node limit ({options.node_limit})" if label == "node_limit" else f"time limit ({options.time_limit_s:g} s)"
        notes = (*notes, f"HiGHS stopped at its {limit}, {highs.getInfo().mip_gap:.2%} above its bound on the optimum")
    return PlanSolution(
        choices=choices, status=label, solver="milp", solve_seconds=seconds, windows=windows, notes=notes,
    )


_STOPPED_WITH_A_PLAN = {
    highspy.HighsModelStatus.kTimeLimit: "time_limit",
    highspy.HighsModelStatus.kSolutionLimit: "node_limit",  # HiGHS's status for mip_max_nodes
}


def _set_start(highs: highspy.Highs, model: _Model, start: dict[str, Choice]) -> bool:
    """Passes ``start`` as a MIP start on the binaries (the continuous columns
    are left for HiGHS to complete); True where HiGHS accepted it."""
    index = np.arange(len(model.vars), dtype=np.int32)
    value = np.zeros(len(model.vars), dtype=np.float64)
    for i, var in enumerate(model.vars):
        choice = start.get(var.candidate)
        if var.window is None and choice is not None and (choice.decision, choice.codec) == (var.decision, var.codec):
            value[i] = 1.0
    if not len(index):
        return False
    return highs.setSolution(len(index), index, value) == highspy.HighsStatus.kOk


def _build(problem: PlanProblem, *, minimize: str, time_cap_s: float | None) -> _Model:
    if minimize not in ("time", "bytes", "peak"):
        raise ValueError(f"minimize={minimize!r} must be 'time', 'bytes' or 'peak'")
    model = _Model()
    for cand in problem.candidates:
        for var in _options(cand):
            model.add_var(var)
    names = {c.name for c in problem.candidates}
    for cand in problem.candidates:
        own = model.by_candidate.get(cand.name, [])
        lower = 1.0 if cand.required else 0.0
        if own:
            model.rows.append((lower, 1.0, own, [1.0] * len(own), f"one_{cand.name}"))
        rec = [i for i in own if model.vars[i].decision is Decision.RECOMPUTE]
        for r in rec:
            for inp in dict.fromkeys(cand.inputs):
                if inp not in names:
                    continue
                supply = [
                    i for i in model.by_candidate.get(inp, []) if model.vars[i].feeds_recompute
                ]
                # rec[v] - Σ avail[u] ≤ 0
                model.rows.append(
                    (-np.inf, 0.0, [r, *supply], [1.0] + [-1.0] * len(supply), f"dep_{cand.name}_{inp}")
                )
    held = [i for i, v in enumerate(model.vars) if v.decision is not Decision.RECOMPUTE]
    held_bytes = [float(model.vars[i].nbytes) for i in held]
    if problem.budget_bytes is not None and held and problem.memory is None:
        model.rows.append((-np.inf, float(problem.budget_bytes), held, held_bytes, "budget"))
    if problem.boundary_budget_bytes is not None and held:
        model.rows.append((-np.inf, float(problem.boundary_budget_bytes), held, held_bytes, "boundary"))
    if time_cap_s is not None:
        timed = [i for i, v in enumerate(model.vars) if v.seconds > 0]
        if timed:
            cap = time_cap_s * _US * (1 + 1e-6) + 1e-6
            model.rows.append(
                (-np.inf, cap, timed, [model.vars[i].seconds * _US for i in timed], "time_cap")
            )
    if minimize == "time" and problem.windows:
        _add_windows(model, problem)
    if problem.memory is not None:
        _add_memory(model, problem, peak=minimize in ("peak", "time"))
    return model


def _add_memory(model: _Model, problem: PlanProblem, *, peak: bool) -> None:
    """The memory model's rows (see `peak_model`): auxiliary bounds, and each
    position's bytes ≤ the budget and (``peak``) ≤ the peak column."""
    memory = problem.memory
    assert memory is not None
    decision_column: dict[str, int] = {}
    for index, var in enumerate(model.vars):
        if var.window is not None:
            decision_column[f"ov:{var.candidate}:{var.window}"] = index
            continue
        kind = {Decision.KEEP: "keep", Decision.RECOMPUTE: "rec", Decision.COMPRESS: "comp"}[var.decision]
        key = f"{kind}:{var.candidate}" if var.codec is None else f"comp:{var.candidate}:{var.codec}"
        decision_column[key] = index

    def linear(terms: tuple[tuple[str, float], ...]) -> tuple[list[int], list[float]]:
        cols: dict[int, float] = {}
        for key, coef in terms:
            col = model.column(key) if key.startswith("aux:") else decision_column.get(key)
            if col is not None:  # an option that is not legal is 0
                cols[col] = cols.get(col, 0.0) + coef
        return list(cols), list(cols.values())

    for i in range(len(memory.aux)):
        model.column(f"aux:{i}")
    for i, bounds in enumerate(memory.aux):
        own = model.column(f"aux:{i}")
        for bound in bounds:
            cols, coefs = linear(bound.terms)
            # aux - Σ coef·var ≥ const
            model.rows.append((bound.const, np.inf, [own, *cols], [1.0, *(-c for c in coefs)], f"aux{i}"))
    budget = problem.budget_bytes
    peak_col = model.column("peak") if peak else None
    scale = peak_scale(problem)
    for row in memory.rows:
        cols, coefs = linear(row.terms)
        if budget is not None:
            model.rows.append((-np.inf, float(budget) - row.const, cols, coefs, f"budget_{row.name}"))
        if peak_col is not None:
            model.rows.append(
                (-np.inf, -row.const / scale, [*cols, peak_col], [*(c / scale for c in coefs), -1.0], f"peak_{row.name}")
            )


def peak_scale(problem: PlanProblem) -> float:
    """Bytes per unit of the ``peak`` column: about the largest peak, so that
    the column is O(1) and tie breaks stay small next to it."""
    memory = problem.memory
    assert memory is not None
    largest = max((r.const + sum(c for _, c in r.terms if c > 0) for r in memory.rows), default=1.0)
    return max(largest, 1.0)


def _add_windows(model: _Model, problem: PlanProblem) -> None:
    """The ``ov[v, w]`` variables and their rows (see the module docstring)."""
    windows = {w.name: w for w in problem.windows if w.seconds > 0}
    ov: dict[str, list[int]] = {}
    for cand in problem.candidates:
        legal = [w for w in dict.fromkeys(cand.windows) if w in windows]
        rec = [i for i in model.by_candidate.get(cand.name, []) if model.vars[i].decision is Decision.RECOMPUTE]
        if not legal or not rec:
            continue
        legal.sort(key=lambda w: (windows[w].opens, w))
        for rank, window in enumerate(legal):
            lateness = (len(legal) - rank) / (len(legal) + 1) / max(len(problem.candidates), 1)
            model.vars.append(_Var(cand.name, Decision.RECOMPUTE, None, 0.0, 0, window=window))
            index = len(model.vars) - 1
            model.credit[index] = (cand.recompute_seconds, 2.0 * cand.keep_bytes, lateness)
            ov.setdefault(cand.name, []).append(index)
        cols = ov[cand.name]
        model.rows.append((-np.inf, 0.0, [*cols, rec[0]], [1.0] * len(cols) + [-1.0], f"ov_{cand.name}"))
    for name, window in windows.items():
        cols = [i for idxs in ov.values() for i in idxs if model.vars[i].window == name]
        if cols:
            coefs = [model.credit[i][0] * _US for i in cols]
            model.rows.append((-np.inf, window.seconds * _US, cols, coefs, f"window_{name}"))
    big_m = float(max((w.opens for w in windows.values()), default=0) + 1)
    for cand in problem.candidates:
        mine = ov.get(cand.name)
        if not mine:
            continue
        for inp in dict.fromkeys(cand.inputs):
            theirs = ov.get(inp, [])
            rec_in = [i for i in model.by_candidate.get(inp, []) if model.vars[i].decision is Decision.RECOMPUTE]
            if rec_in:  # Σ ov[v] + rec[u] - Σ ov[u] ≤ 1
                cols = [*mine, rec_in[0], *theirs]
                coefs = [1.0] * len(mine) + [1.0] + [-1.0] * len(theirs)
                model.rows.append((-np.inf, 1.0, cols, coefs, f"ovin_{cand.name}_{inp}"))
            if not theirs:
                continue
            # Σ o·ov[u] - Σ o·ov[v] + M·Σ ov[v] ≤ M
            cols = [*theirs, *mine]
            coefs = [float(windows[model.vars[i].window].opens) for i in theirs] + [
                big_m - float(windows[model.vars[i].window].opens) for i in mine
            ]
            model.rows.append((-np.inf, big_m, cols, coefs, f"order_{cand.name}_{inp}"))


def _options(cand: Candidate) -> list[_Var]:
    out = []
    if cand.can_keep:
        out.append(_Var(cand.name, Decision.KEEP, None, cand.keep_seconds, cand.keep_bytes))
    if cand.can_recompute:
        out.append(_Var(cand.name, Decision.RECOMPUTE, None, cand.recompute_seconds, 0))
    for opt in cand.compress:
        out.append(
            _Var(
                cand.name, Decision.COMPRESS, opt.codec, opt.seconds, opt.nbytes,
                feeds_recompute=opt.feeds_recompute,
            )
        )
    return out


def _to_lp(model: _Model, minimize: str, problem: PlanProblem) -> highspy.HighsLp:
    binaries = len(model.vars)
    n = binaries + len(model.continuous)
    seconds = np.array([v.seconds * _US for v in model.vars], dtype=np.float64)
    nbytes = np.array([float(v.nbytes) for v in model.vars], dtype=np.float64)
    positive = seconds[seconds > 0]
    cheapest = float(positive.min()) if positive.size else 1.0
    total_bytes = float(nbytes.sum()) or 1.0
    cost = np.zeros(n)
    peak = model.continuous.get("peak")
    if minimize == "time":
        cost[:binaries] = seconds + TIE_BREAK * cheapest * nbytes / total_bytes
        for index, (credit, tie_bytes, lateness) in model.credit.items():  # ov[v, w]: recompute in window w
            cost[index] = -credit * _US + 1e-3 * cheapest * (tie_bytes / total_bytes + lateness)
        if peak is not None:  # among equally fast plans, the lower peak
            cost[binaries + peak] = TIE_BREAK * cheapest
    elif minimize == "peak":
        assert peak is not None, "minimize='peak' needs a memory model"
        cost[binaries + peak] = 1.0
        total_seconds = float(seconds.sum()) or 1.0
        cost[:binaries] = TIE_BREAK * seconds / total_seconds  # then the faster plan
    else:
        cost[:binaries] = nbytes / 2**20
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(model.rows)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    upper = np.ones(n)
    if peak is not None:
        upper[binaries + peak] = np.inf
    lp.col_upper_ = upper
    lp.col_names_ = [_var_name(i, v) for i, v in enumerate(model.vars)] + [
        _safe(name) for name in model.continuous
    ]
    lp.row_lower_ = np.array([r[0] for r in model.rows], dtype=np.float64)
    lp.row_upper_ = np.array([r[1] for r in model.rows], dtype=np.float64)
    lp.row_names_ = [_safe(r[4]) + f"_{i}" for i, r in enumerate(model.rows)]
    starts, index, value = [0], [], []
    for _lo, _hi, cols, coefs, _name in model.rows:
        index.extend(cols)
        value.extend(coefs)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(model.rows)
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * binaries + [highspy.HighsVarType.kContinuous] * (
        n - binaries
    )
    lp.sense_ = highspy.ObjSense.kMinimize
    return lp


def _var_name(index: int, var: _Var) -> str:
    suffix = var.decision.value if var.codec is None else f"comp_{var.codec}"
    if var.window is not None:
        suffix = f"ov_{var.window}"
    return _safe(f"{suffix}_{var.candidate}")[:200] + f"_{index}"


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)


def _run(highs: highspy.Highs) -> None:
    """``highs.run()``, once more after rebuilding HiGHS's thread scheduler
    where it refused to start.

    HiGHS keeps one thread scheduler per process, sized by the first solve
    that runs; a later solve asking for another thread count (adacc's
    ``solver_threads``, after any other HiGHS user in the process, such as
    a benchmark's own LP) fails at once, with an error status and no model
    status. Every solve of the plan stage then failed, and the plan fell
    back to recomputing everything (a 4-layer HF Llama after an LP with the
    default threads: 20.6 MiB at a budget of 30.5). The scheduler is
    rebuilt for this thread count (no solve runs in another thread while
    the plan stage does) and the solve tried again."""
    if highs.run() != highspy.HighsStatus.kError or highs.getModelStatus() != highspy.HighsModelStatus.kNotset:
        return
    log.info("adacc: HiGHS refused to start with its thread scheduler as set; rebuilding it and solving again")
    highspy.Highs.resetGlobalScheduler(True)
    highs.run()


_BANNER_SHOWN = False


def _quiet_highs() -> highspy.Highs:
    """A solver that prints nothing. HiGHS writes its banner to the C-level
    stdout from the first ``Highs()`` a process constructs, before any option
    can be set, so that one construction runs with file descriptor 1 pointed
    at /dev/null (Python-level redirection does not reach C ``printf``)."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        highs = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 1)
                highs = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_SHOWN = True
    highs.setOptionValue("output_flag", False)
    return highs


def write_lp(problem: PlanProblem, path: str) -> None:
    """Writes the time-minimising model of ``problem`` to ``path`` (no solve)."""
    model = _build(problem, minimize="time", time_cap_s=None)
    highs = _quiet_highs()
    highs.passModel(_to_lp(model, "time", problem))
    highs.writeModel(path)
