"""The adacc pipeline: ordered stages over one joint graph, and their runner.

    prepare   PyTorch's own joint-graph clean-ups (dead code, must-save tags)
    classify  which nodes are forward and which backward
    annotate  bytes, FLOPs, runtime, op class, layer per node
    candidates  the plan problem: forward values the backward may need
    calibrate codecs measured on the real activations of the compiled batch
    windows   backward communication windows and what may hide in them (issue 5)
    structure identical blocks folded into one (Lynx HEU)
    budget    the budget in bytes; baseline and reachable minimum
    plan      policy (MILP) -> decisions; split, insert codecs, simulate;
              tighten until the simulated activation peak fits
    verify    invariants of the fw/bw split
    schedule  recomputation moved into its windows, order pinned (issue 5)
    agree     plan hash, checked across ranks when distributed (issue 5)
    report    summary, plan table, dumps, structured logs

Each stage is a plain function ``stage(state) -> None`` that fills fields of
`PartitionState`; the runner times every stage, lints the graphs a stage
produced, and lets callers skip optional stages by name.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.fx as fx

from adacc_compile import compat
from adacc_compile.config import AdaccConfig
from adacc_compile.overlap import OverlapState, agree_stage, schedule_stage, windows_stage
from adacc_compile.passes.annotate import annotate
from adacc_compile.passes.budget import BudgetResolution, resolve_budget
from adacc_compile.passes.calibrate import (
    Calibration,
    calibrate_candidates,
    calibrated_candidates,
    not_calibrated,
)
from adacc_compile.passes.candidates import CandidateSet, find_candidates
from adacc_compile.passes.codec_options import allowed_codecs, make_compress_options
from adacc_compile.passes.compress_rewrite import apply_compression
from adacc_compile.passes.device_profile import DeviceProfile, profile_by_name
from adacc_compile.passes.memory_sim import MemoryTimeline, simulate_step
from adacc_compile.passes.milp import SolverOptions
from adacc_compile.passes.plan_problem import PlanProblem, PlanSolution, added_seconds, check_solution
from adacc_compile.passes.policies import get_policy
from adacc_compile.passes.rewrite import saved_values_for, split_joint_graph
from adacc_compile.passes.structure import BlockReduction, no_reduction, reduce_identical_blocks
from adacc_compile.passes.verify import verify_split

log = logging.getLogger(__name__)

OPTIONAL_STAGES = frozenset({"calibrate", "verify", "report"})


@dataclass(slots=True, kw_only=True)
class PartitionState:
    """Everything the stages produce for one joint graph."""

    joint: fx.GraphModule
    config: AdaccConfig
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] = field(default_factory=list)
    graph_index: int = 0
    real_inputs: list[Any] | None = None
    """Real values of the graph's primal inputs, when the backend has them
    (calibration); dropped once calibrated."""
    calibration: Calibration | None = None
    info: compat.JointGraphInfo | None = None
    profile: DeviceProfile | None = None
    candidates: CandidateSet | None = None
    reduction: BlockReduction | None = None
    budget: BudgetResolution | None = None
    solution: PlanSolution | None = None
    saved_values: list[fx.Node] = field(default_factory=list)
    fw_module: fx.GraphModule | None = None
    bw_module: fx.GraphModule | None = None
    timeline: MemoryTimeline | None = None
    replans: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    overlap: OverlapState | None = None
    """Communication windows, placement and plan hash (issue 5)."""

    @property
    def solver_options(self) -> SolverOptions:
        return SolverOptions(
            time_limit_s=self.config.solver_time_limit_s,
            mip_rel_gap=self.config.mip_rel_gap,
            threads=self.config.solver_threads,
        )

    @property
    def forward_names(self) -> set[str]:
        assert self.info is not None
        return {n.name for n in self.info.forward_nodes}


def prepare(state: PartitionState) -> None:
    state.joint = compat.prepare_joint_graph(state.joint)


def classify(state: PartitionState) -> None:
    state.info = compat.classify_joint_graph(
        state.joint, state.static_lifetime_input_indices, state.num_fwd_outputs
    )


def annotate_stage(state: PartitionState) -> None:
    assert state.info is not None
    state.profile = profile_by_name(state.config.device_profile)
    annotate(state.joint, state.profile, state.info.backward_nodes)


def candidates_stage(state: PartitionState) -> None:
    assert state.info is not None and state.profile is not None
    codecs = allowed_codecs(state.config.accuracy, state.config.codecs)
    options = make_compress_options(codecs, state.profile, state.info.backward_nodes)
    state.candidates = find_candidates(
        state.joint, state.info, options, allow_recompute=state.config.allow_recompute
    )


def calibrate_stage(state: PartitionState) -> None:
    assert state.candidates is not None and state.info is not None
    if not state.config.calibrate_codecs:
        state.calibration = not_calibrated("off (calibrate_codecs=False)")
    else:
        state.calibration = calibrate_candidates(
            state.joint, state.info, state.candidates, state.real_inputs
        )
    state.real_inputs = None
    state.candidates = calibrated_candidates(state.candidates, state.calibration)


def structure_stage(state: PartitionState) -> None:
    """Identical blocks share one set of decisions (Lynx HEU); off with
    ``block_reuse=False`` and where communication windows are in play
    (windows are per block, which the reduction does not model yet)."""
    assert state.candidates is not None
    problem = state.candidates.problem
    if state.config.block_reuse and not problem.windows:
        state.reduction = reduce_identical_blocks(problem, state.candidates.nodes)
    else:
        state.reduction = no_reduction(problem)


def budget_stage(state: PartitionState) -> None:
    assert state.reduction is not None
    state.budget = resolve_budget(
        state.reduction.problem,
        state.config.memory_budget,
        state.solver_options,
        on_infeasible=state.config.on_infeasible,
    )


@dataclass(frozen=True, slots=True)
class PlanAttempt:
    """One solve at one boundary cap, split, rewritten and simulated."""

    cap: int
    solution: PlanSolution
    saved: list[fx.Node]
    fw: fx.GraphModule
    bw: fx.GraphModule
    timeline: MemoryTimeline

    @property
    def peak(self) -> int:
        return self.timeline.activation_peak_bytes


def _without_costly_recompute(problem: PlanProblem) -> PlanProblem:
    """The problem with only free recomputations (views) legal: the plan-level
    twin of ``allow_recompute=False`` in the candidates pass."""
    return dataclasses.replace(problem, candidates=tuple(
        dataclasses.replace(c, can_recompute=c.can_recompute and c.recompute_seconds == 0.0)
        for c in problem.candidates
    ))


def _attempt(state: PartitionState, cap: int, *, recompute: bool = True) -> PlanAttempt | None:
    """``recompute=False``: only free recomputations (views) stay legal."""
    assert state.candidates is not None and state.info is not None and state.reduction is not None
    problem = dataclasses.replace(state.reduction.problem, budget_bytes=cap)
    if not recompute:
        problem = _without_costly_recompute(problem)
    solution = get_policy(state.config.planner)(problem, state.solver_options)
    if solution.status == "infeasible":
        return None
    solution = state.reduction.expand(solution)
    errors = check_solution(state.candidates.problem, solution)
    if errors:
        raise RuntimeError(f"adacc planner {solution.solver} produced an illegal plan: {errors}")
    saved = saved_values_for(state.joint, state.info, state.candidates, solution)
    fw, bw = split_joint_graph(state.joint, state.info, saved, num_fwd_outputs=state.num_fwd_outputs)
    fw, bw = apply_compression(fw, bw, solution, num_fwd_outputs=state.num_fwd_outputs)
    timeline = simulate_step(fw, bw, num_fwd_outputs=state.num_fwd_outputs, forward_names=state.forward_names)
    return PlanAttempt(cap, solution, saved, fw, bw, timeline)


#: Where the tightening loop finds no plan that fits, boundary caps at these
#: multiples of the budget are tried as well (each costs one solve, split and
#: simulation; only on this path). A cap at or above the lowest peak found so
#: far is skipped: a plan's activation peak includes its saved bytes.
NO_FIT_CAP_FACTORS = (0.75, 0.5, 1.5, 2.0, 4.0, 8.0)


def _probe_caps(state: PartitionState, target: int, attempts: list[PlanAttempt]) -> list[PlanAttempt]:
    assert state.budget is not None and state.reduction is not None
    tried = {a.cap for a in attempts}
    best_peak = min(a.peak for a in attempts)
    out = []
    for factor in NO_FIT_CAP_FACTORS:
        cap = int(target * factor)
        in_range = state.budget.minimum_bytes <= cap <= state.budget.baseline_saved_bytes
        if not in_range or cap >= best_peak or cap in tried:
            continue
        tried.add(cap)
        attempt = _attempt(state, cap)
        if attempt is not None:
            out.append(attempt)
            best_peak = min(best_peak, attempt.peak)
    if state.config.allow_recompute and any(c.compress for c in state.reduction.problem.candidates):
        # Compression holds no working memory in the backward, recomputation
        # does: at the budget, a plan that compresses instead of recomputing
        # may fit where every mixed plan overshoots.
        attempt = _attempt(state, target, recompute=False)
        if attempt is not None:
            out.append(attempt)
    return out


def plan_stage(state: PartitionState) -> None:
    """Solve, split, simulate; while the simulated activation peak exceeds
    the budget, lower the boundary cap by the excess and solve again.

    The MILP caps the bytes saved at the forward/backward boundary; the
    working memory of recomputation in the backward is only seen here, by
    simulation, and it is not monotone in the cap: a tighter cap can make the
    MILP recompute long chains from the inputs, which the backward then holds
    all at once (Llama d256, recompute-only: cap 8.9 MiB -> 19.7 MiB peak,
    cap 5.1 MiB -> 49.4 MiB). So where no cap down to the reachable minimum
    fits, caps from half to 8x the budget (`NO_FIT_CAP_FACTORS`) are tried
    too, and (where codecs are on) a plan that compresses instead of
    recomputing: the cheapest that fits is used, else the lowest simulated
    peak (with a warning)."""
    assert state.budget is not None
    target = state.budget.budget_bytes
    floor = state.budget.minimum_bytes
    fixed = state.config.planner in ("keep_all", "recompute_all")
    cap = target
    attempts: list[PlanAttempt] = []
    for _ in range(state.config.max_replans + 1):
        attempt = _attempt(state, cap)
        if attempt is None:
            break
        attempts.append(attempt)
        excess = attempt.peak - target
        if excess <= 0 or fixed:
            break
        new_cap = min(cap - excess, attempt.timeline.saved_bytes - excess)
        if new_cap < floor:
            new_cap = floor if cap > floor else new_cap  # one last try at the floor
        if new_cap < floor or new_cap >= cap:
            break
        cap = new_cap
    if attempts and not fixed and all(a.peak > target for a in attempts):
        attempts += _probe_caps(state, target, attempts)
    if not attempts:
        raise RuntimeError(
            f"adacc: planner {state.config.planner!r} found no plan within "
            f"{target} bytes (reachable minimum {state.budget.minimum_bytes})"
        )
    state.replans = len(attempts) - 1
    assert state.candidates is not None
    fitting = [a for a in attempts if a.peak <= target]
    # Of the plans that fit (the loop stops at its first; probes may add
    # more), the cheapest; if none fits, the lowest simulated peak.
    problem = state.candidates.problem
    best = (
        min(fitting, key=lambda a: (added_seconds(problem, a.solution), -a.cap))
        if fitting
        else min(attempts, key=lambda a: (a.peak, -a.cap))
    )
    state.solution, state.saved_values = best.solution, best.saved
    state.fw_module, state.bw_module, state.timeline = best.fw, best.bw, best.timeline
    if best.peak > target and not fixed:
        warnings.warn(
            f"adacc: no plan reaches the budget {target} bytes: recomputation needs working "
            f"memory in the backward on top of the saved values. Using the plan with the lowest "
            f"simulated activation peak, {best.peak} bytes ({best.timeline.saved_bytes} bytes saved "
            f"at the forward/backward boundary), after {state.replans} re-plan(s)",
            stacklevel=2,
        )


def verify_stage(state: PartitionState) -> None:
    assert state.fw_module is not None and state.bw_module is not None
    assert state.candidates is not None and state.solution is not None
    verify_split(
        state.fw_module,
        state.bw_module,
        candidates=state.candidates,
        solution=state.solution,
        forward_names=state.forward_names,
        num_fwd_outputs=state.num_fwd_outputs,
    )


def report_stage(state: PartitionState) -> None:
    from adacc_compile.report import publish

    publish(state)


STAGES: tuple[tuple[str, Callable[[PartitionState], None]], ...] = (
    ("prepare", prepare),
    ("classify", classify),
    ("annotate", annotate_stage),
    ("candidates", candidates_stage),
    ("calibrate", calibrate_stage),
    ("windows", windows_stage),
    ("structure", structure_stage),
    ("budget", budget_stage),
    ("plan", plan_stage),
    ("verify", verify_stage),
    ("schedule", schedule_stage),
    ("agree", agree_stage),
    ("report", report_stage),
)


def run_pipeline(state: PartitionState, skip: frozenset[str] = frozenset()) -> PartitionState:
    """Runs `STAGES` in order; only `OPTIONAL_STAGES` may be skipped."""
    bad = skip - OPTIONAL_STAGES
    if bad:
        raise ValueError(f"cannot skip stage(s) {sorted(bad)}; optional: {sorted(OPTIONAL_STAGES)}")
    with compat.lazy_graph_modules():
        for name, stage in STAGES:
            if name in skip:
                continue
            start = time.perf_counter()
            stage(state)
            state.stage_seconds[name] = time.perf_counter() - start
            for gm in (state.fw_module, state.bw_module) if name == "plan" else ():
                assert gm is not None
                gm.graph.lint()
            log.debug("adacc stage %s took %.3f s", name, state.stage_seconds[name])
    return state
