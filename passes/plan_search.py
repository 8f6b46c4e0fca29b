"""Plan search: decide under the budget, split, simulate, and move the
model's cap until the simulated peak meets the budget.

Reads: the joint graph and its split (`compat.JointGraphInfo`), the
candidates (full problem, with its memory model), the block reduction (the
problem the policy solves), the resolved budget and PyTorch's default plan.
Writes nothing on the joint graph; returns a `PlanOutcome` with the chosen
solution and the forward/backward graphs made from it.

The MILP's memory rows bound the activation peak at every position of the
step (`peak_model`; with ``budget_scope="step"`` also the backward's own
bytes), a linear model; the chosen plan is split once and the split graphs
simulated (`memory_sim`, which follows the generated code). Where that
simulated peak (`BudgetResolution.peak_of`) is over the budget, or under it by more than
`PEAK_FIT_TOLERANCE`, the model's cap moves by the difference and the MILP
is solved again (at most ``peak_fit_solves`` times, each a split and a
simulation): the budget bounds what the step holds, not what the model
says, both ways. A budget out of every plan's reach (clamped to the
reachable minimum) is not re-solved: the lowest plan is what it gets.
Where no plan meets both caps of a ratio budget but
plans within its peak exist, the boundary cap is relaxed to the least any
of them holds (`_relax_boundary`); only a peak out of reach is clamped to
the reachable minimum. At the budget the default partitioner's own plan is
also a candidate: where it fits and is cheaper by the cost model, it is
used, so a ratio of 1.0 is never worse than the default. Where no MILP plan
fits and full checkpointing's plan holds less (`_full_ac_if_lower`), that
plan is used with as much of its last blocks kept as the budget leaves room
for (`kept_blocks`).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch
import torch.fx as fx

from adacc_compile import compat, compat_inductor

from .budget import BudgetResolution, clamp_to_minimum, lowest_peak_plan, modelled_peak, out_of_reach_warning
from .candidates import CandidateSet
from .compress_rewrite import apply_compression, replaced_ops
from .depth_fold import DepthFold
from .device_profile import DeviceProfile
from .fusion import Realization
from .kept_blocks import most_kept
from .memory_sim import MemoryTimeline, simulate_step
from .milp import SolverOptions, solve_milp, with_start
from . import plan_timing
from .peak_model import SimulatedPeak, simulate
from .plan_problem import PlanProblem, PlanSolution, added_seconds, check_solution, saved_bytes
from .policies import get_policy
from .rewrite import saved_values_for, split_joint_graph
from .structure import BlockReduction

log = logging.getLogger(__name__)

FIXED_PLANNERS = ("keep_all", "recompute_all", "full_ac")

PEAK_FIT_TOLERANCE = 0.03
"""A simulated activation peak this far under the budget (as a share of
it) is close enough: no further solve to raise the model's cap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitContext:
    """What splitting a plan into forward and backward graphs needs."""

    joint: fx.GraphModule
    info: compat.JointGraphInfo
    num_fwd_outputs: int
    mode: Realization
    charged_inputs: frozenset[str]
    fold: DepthFold | None = None
    """Depth folding: the split graphs' timeline is extended to the deep
    step's (`depth_fold`)."""
    codec_parameters: Mapping[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    """(value, codec) -> parameters calibration measured for that option
    (`Calibration.codec_parameters`); the compress rewrite makes them
    constants of the forward graph."""
    profile: DeviceProfile | None = None
    """The plan's cost model: which form of a codec the rewrite inserts
    (`codec_form.graph_form`)."""
    forward_extra_bytes: int = 0
    """Alive through the forward besides its own bytes (`memory_sim.simulate_step`)."""
    backward_extra_bytes: int = 0
    """Alive through the backward besides its own bytes (`memory_sim.simulate_step`)."""

    @property
    def forward_names(self) -> set[str]:
        return {n.name for n in self.info.forward_nodes}

    def simulate(self, fw: fx.GraphModule, bw: fx.GraphModule) -> MemoryTimeline:
        """The step of split graphs ``fw`` and ``bw`` as a plan is checked
        against it (`memory_sim.simulate_step`; no depth folding): also
        what the overlap stage re-simulates after moving recomputation."""
        return simulate_step(
            fw, bw, num_fwd_outputs=self.num_fwd_outputs, forward_names=self.forward_names,
            mode=self.mode, charged_inputs=self.charged_inputs,
            forward_extra_bytes=self.forward_extra_bytes, backward_extra_bytes=self.backward_extra_bytes,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOutcome:
    solution: PlanSolution
    saved: list[fx.Node]
    fw: fx.GraphModule
    bw: fx.GraphModule
    timeline: MemoryTimeline
    simulated: SimulatedPeak
    """The plain-problem simulation of the chosen plan."""
    source: str
    """"planner", "default" (PyTorch's choice was cheaper and fits),
    "minimum" (nothing fit the budget; the lowest-peak plan) or "full_ac"
    (the budget was out of the MILP plans' reach, and full checkpointing's
    plan holds less: `_full_ac_if_lower`)."""
    budget: BudgetResolution
    """The budget the plan was made for (clamped where nothing fit)."""
    resolves: int = 0
    """Re-solves that moved the model's cap to fit the simulated peak to
    the budget (at most the config's ``peak_fit_solves``)."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstPlan:
    """The policy's plan of the reduced problem (`structure.BlockReduction`)
    at the budget, before its blocks are expanded and it is split: the first
    step of the plan stage (`first_plan`)."""

    solution: PlanSolution
    budget: BudgetResolution
    """The budget it was solved at: clamped to the reachable minimum, or
    with a relaxed boundary cap, where the requested one had no plan."""
    source: str
    """"planner", or "minimum" (nothing fit the budget: a plan at the
    reachable minimum)."""
    notes: tuple[str, ...] = ()


def first_plan(
    reduction: BlockReduction,
    budget: BudgetResolution,
    *,
    planner: str,
    options: SolverOptions,
    on_infeasible: str = "warn",
) -> FirstPlan:
    """One solve at the budget. Where it has no plan, one lowest-peak solve
    says whether the peak or only a ratio's boundary share is out of reach:
    the boundary is relaxed to the least any plan within the peak holds
    (`_relax_boundary`), or the budget is clamped to the reachable minimum
    and the fastest plan there is solved (`budget.clamp_to_minimum`)."""
    notes: list[str] = []
    solution = _solve(reduction.problem, budget, planner, options)
    source = "planner"
    if solution.status == "infeasible" and planner not in FIXED_PLANNERS:
        lowest = lowest_peak_plan(reduction.problem, options)
        if budget.boundary_bytes is not None and modelled_peak(reduction.problem, lowest) <= budget.budget_bytes:
            budget, solution, note = _relax_boundary(reduction.problem, budget, planner, options, lowest)
            notes.extend(note)
        else:
            requested_boundary = budget.boundary_bytes
            # Warned at the end of the search (`fit_simulated_peak`): full
            # checkpointing's plan may still meet the budget the MILP's rows cannot.
            budget, lowest = clamp_to_minimum(
                budget, reduction.problem, options, on_infeasible=on_infeasible, lowest=lowest, warn=False
            )
            least = lowest
            if requested_boundary is None or saved_bytes(reduction.problem, lowest) > requested_boundary:
                budget, least = _least_boundary(
                    reduction.problem, budget, requested_boundary, with_start(options, lowest, "the lowest-peak plan")
                )
            else:  # the lowest-peak plan holds no more than asked: no least-bytes solve
                budget = dataclasses.replace(budget, boundary_bytes=requested_boundary)
            # The fastest plan at that peak (the lowest-peak solve only breaks
            # ties on time, and does not place recomputation in windows),
            # started from a plan at the minimum that meets both caps.
            fastest_at_minimum = _solve(
                reduction.problem, budget, planner, with_start(options, least, "a plan at the minimum within both caps")
            )
            solution = fastest_at_minimum if fastest_at_minimum.status != "infeasible" else lowest
            source = "minimum"
    return FirstPlan(solution=solution, budget=budget, source=source, notes=tuple(notes))


def split_plan(
    context: SplitContext,
    candidates: CandidateSet,
    reduction: BlockReduction,
    first: FirstPlan,
    *,
    default: PlanSolution | None = None,
) -> PlanOutcome:
    """The first plan with its blocks expanded, or PyTorch's default plan
    where that fits the budget and costs no more (``default``; None for the
    fixed planners), split into forward and backward graphs and simulated."""
    solution, source = reduction.expand(first.solution), first.source
    if default is not None:
        solution, source = _prefer_default(candidates.problem, solution, source, default, first.budget)
    return _split(context, candidates, solution, source, first.budget, list(first.notes))


def fit_simulated_peak(
    context: SplitContext,
    candidates: CandidateSet,
    reduction: BlockReduction,
    first: PlanOutcome,
    *,
    planner: str,
    options: SolverOptions,
    solves: int,
    tolerance: float = PEAK_FIT_TOLERANCE,
    first_reduced: PlanSolution | None = None,
) -> PlanOutcome:
    """Moves the MILP's cap until the split graphs' simulated activation
    peak meets the budget, in at most ``solves`` more solves.

    The MILP's memory rows are a linear model of the step; the simulation
    of the split graphs (`memory_sim`, which follows the generated code)
    is what the step holds. They disagree both ways: the split may place
    something the model did not expect (over the budget), and the model
    over-counts where lifetimes it bounds conservatively end early or a
    value is only read inside a fused kernel (GPT-style, 2 layers, at 0.5:
    modelled 27.9 MiB, simulated 23.1, budget 28.7). So where the simulated
    peak is over the budget, or under it by more than ``tolerance`` of it,
    the cap moves by the difference and the plan is solved again: down to
    fit, up to buy back recomputation the budget never required. Of the
    plans tried, the cheapest (cost model) whose simulated peak fits is
    used; where none fits, the lowest, with a warning that gives the
    excess. A raised cap starts HiGHS from the fitting plan of the highest
    cap so far (``first_reduced`` is the first plan as the policy solved
    it, before block expansion), which is feasible there. The moves are the
    same on every rank (all inputs are)."""
    budget = first.budget
    target = budget.budget_bytes
    tried = [first]
    peaks = {_plan_key(first.solution): budget.peak_of(first.timeline)}
    """Simulated peak (what the budget bounds) of each distinct plan tried."""
    # A budget clamped to the model's reachable minimum: no cap below it has
    # a plan, so a split over it is not re-solved lower (Llama-style
    # compress-only at 0.4 spent three solves there, each without a plan).
    clamped = budget.clamped and budget.minimum_bytes is not None
    bracket = _CapBracket(target, floor=budget.minimum_bytes - 1 if clamped else None)
    bracket.add(target, budget.peak_of(first.timeline), _model_peak(reduction.problem, first_reduced))
    fit_start = first_reduced if budget.peak_of(first.timeline) <= target else None
    resolves = 0
    search = "none allowed (peak_fit_solves=0)" if solves == 0 else _no_cap_left(bracket, clamped)
    fastest = added_seconds(candidates.problem, first.solution) <= budget.fastest_seconds * (1 + 1e-9) + 1e-15
    if fastest and budget.peak_of(first.timeline) <= target:
        # No cap buys back time the plan does not spend (HF Llama at 1.0
        # re-solved three times for the same plan).
        solves, search = 0, "none needed: the plan fits and is the fastest plan at any budget"
    if clamped:
        # The budget is below every plan's reach: the user gets the lowest
        # plan, as the warning says. A cap above the minimum would buy back
        # time with memory no budget allowed (HF Llama, 4 layers, at 0.5: a
        # re-solve and two splits, ending on full AC's plan, 2.6% over the
        # lowest, which the same model got at "min").
        solves, search = 0, "none: the budget is out of reach, and the lowest plan is what it gets"
    if planner == "milp" and first.solution.solver == "recompute_all":
        # HiGHS stopped at its limit without a plan (`policies.milp_policy`):
        # under the same limit a re-solve would stop again.
        solves, search = 0, "none: HiGHS stopped at its limit without a plan, and would again"
    for _ in range(solves):
        cap = bracket.next_cap(tolerance)
        if cap is None:
            break
        resolves += 1
        peak = bracket.last_peak
        where = (
            f"the split graphs peak at {peak} bytes, {abs(target - peak)} {'over' if peak > target else 'under'} "
            f"the budget {target}" if peak else f"no plan fits the model's last cap (budget {target})"
        )
        reason = f"{where}; re-solving with the model's cap at {cap}"
        search = f"the last: {reason}"
        log.info("adacc: %s", reason)
        start = options
        if fit_start is not None and bracket.fit is not None and cap > bracket.fit[0]:
            start = with_start(options, fit_start, "the fitting plan at a lower cap")
        retry = _solve(reduction.problem, dataclasses.replace(budget, budget_bytes=cap), planner, start)
        if retry.status == "infeasible" or (not retry.choices and reduction.problem.candidates):
            bracket.add(cap, None)  # nothing fits the model at that cap: a floor
            continue
        expanded = reduction.expand(retry)
        key = _plan_key(expanded)
        if key in peaks:  # a plan already split and simulated
            bracket.add(cap, peaks[key], _model_peak(reduction.problem, retry))
            continue
        outcome = _split(context, candidates, expanded, "planner", budget, [*first.notes, reason])
        tried.append(outcome)
        peaks[key] = budget.peak_of(outcome.timeline)
        if budget.peak_of(outcome.timeline) <= target and (bracket.fit is None or cap > bracket.fit[0]):
            fit_start = retry
        bracket.add(cap, budget.peak_of(outcome.timeline), _model_peak(reduction.problem, retry))
    fitting = [o for o in tried if budget.peak_of(o.timeline) <= target]
    if fitting:
        best = min(fitting, key=lambda o: added_seconds(candidates.problem, o.solution))
    else:
        best = min(tried, key=lambda o: budget.peak_of(o.timeline))
    if not fitting or budget.clamped:  # the requested budget is out of the MILP plans' reach
        full_ac = _full_ac_if_lower(context, candidates, best, options)
        if full_ac is not None:
            tried.append(full_ac)
            best = full_ac
    notes = tuple(dict.fromkeys(n for o in tried for n in o.notes))
    if best.budget.clamped and best.budget.minimum_bytes is not None:
        warnings.warn(
            out_of_reach_warning(best.budget.requested_bytes, best.budget.minimum_bytes, best.budget.scope),
            stacklevel=2,
        )
    return _over_budget(dataclasses.replace(best, resolves=resolves, notes=notes), search)


def _full_ac_if_lower(
    context: SplitContext, candidates: CandidateSet, best: PlanOutcome, options: SolverOptions
) -> PlanOutcome | None:
    """Full checkpointing's plan (`policies.full_ac_policy`), split and
    simulated, where the requested budget is out of the MILP's plans'
    reach and the plan simulator puts full AC's plan below ``best``, the
    lowest of them; None otherwise (or where its split graphs hold no
    less).

    The MILP's rows over-count a block recomputed in one burst (every
    input of a value recomputed early stays counted to that value's first
    read: 1.32x full AC's split graphs on a 4-layer Llama), so its lowest
    plan can hold more than full AC's (HF Llama with ``labels=``, 4
    layers: 1.05x). One split, only where the budget was out of reach."""
    problem = candidates.problem
    plan = get_policy("full_ac")(problem, options)
    unbudgeted = dataclasses.replace(problem, budget_bytes=None, boundary_budget_bytes=None)
    if check_solution(unbudgeted, plan) or simulate(problem, plan).peak_bytes >= best.simulated.peak_bytes:
        return None
    budget = best.budget
    outcome = _split(context, candidates, plan, "full_ac", budget, best.notes)
    peak = budget.peak_of(outcome.timeline)
    if peak >= budget.peak_of(best.timeline):
        return None
    note = (
        f"the budget is out of the MILP plans' reach (the lowest simulated at {budget.peak_of(best.timeline)} "
        f"bytes); full checkpointing's plan holds {peak} bytes, and is used"
    )
    log.info("adacc: %s", note)
    if budget.clamped and peak <= budget.requested_bytes:
        # Full AC meets the budget the MILP's rows put out of reach: the
        # budget stands, and what it leaves above this plan is room for
        # keeping the last blocks (at full AC's measured peak, the GPU step
        # benchmark's budget, that room was given away).
        budget = dataclasses.replace(budget, budget_bytes=budget.requested_bytes, minimum_bytes=peak, clamped=False)
    elif budget.clamped:  # the reachable minimum is what this plan holds
        budget = dataclasses.replace(budget, budget_bytes=peak, minimum_bytes=peak)
    outcome = dataclasses.replace(outcome, budget=budget, notes=(*best.notes, note))
    return _last_blocks_kept(context, candidates, outcome, options) or outcome


KEEP_ROUNDS = 3
"""Splits the last-blocks search may spend (`_last_blocks_kept`)."""


def _last_blocks_kept(
    context: SplitContext, candidates: CandidateSet, full_ac: PlanOutcome, options: SolverOptions
) -> PlanOutcome | None:
    """Full checkpointing's plan with as many of its last blocks kept as the
    budget leaves room for (`kept_blocks`), split and simulated; None where
    no block fits or the split graphs of that plan peak over the budget.

    The room is the budget less what the split graphs of the plan so far
    hold; the plan simulator prices what keeping more adds to it (at a
    clamped budget the room is nothing: only values that add no peak are
    kept). The simulator over-counts what a kept value adds to full AC's
    step (4-layer HF Llama at full AC's measured peak: 35 values fit by it,
    the split graphs 3.5 MB under the budget), so the search goes on from
    the split plan with the room its split graphs measure, in at most
    `KEEP_ROUNDS` splits; a round whose split graphs peak over the budget
    is dropped."""
    problem = candidates.problem
    budget = full_ac.budget
    keep_all = get_policy("keep_all")(problem, options)
    best, kept = full_ac, 0
    for _ in range(KEEP_ROUNDS):
        room = budget.budget_bytes - budget.peak_of(best.timeline)
        if room < 0:
            break
        anchor = best.simulated.peak_bytes
        with plan_timing.timed("simulate"):
            plan, count = most_kept(
                problem, best.solution, keep_all, lambda p: simulate(problem, p).peak_bytes - anchor <= room
            )
        if count == 0:
            break
        outcome = _split(context, candidates, plan, "full_ac", budget, full_ac.notes)
        if budget.peak_of(outcome.timeline) > budget.budget_bytes:
            break
        best, kept = outcome, kept + count
    if kept == 0:
        return None
    note = f"full checkpointing's plan with {kept} values of its last blocks kept (the budget leaves room for them)"
    log.info("adacc: %s", note)
    return dataclasses.replace(best, notes=(*full_ac.notes, note))


def _no_cap_left(bracket: _CapBracket, clamped: bool) -> str:
    """Why the search stopped before its first re-solve, for the warning."""
    if clamped:
        return "none: the budget is the model's reachable minimum, so no lower cap has a plan"
    if bracket.over is not None and bracket.fit is None:
        cap, peak = bracket.over
        return (f"none: the plan is {peak - bracket.target} bytes over the budget, at least its modelled "
                f"peak {cap}, so no lower cap is left to try")
    return "none needed by the search"


@dataclass(slots=True)
class _CapBracket:
    """The model caps tried and the simulated peaks their plans reached;
    proposes the next cap. A plan's peak is a step function of the cap
    (plans are discrete), rising with it but not strictly: the next cap
    steps by the gap to the target until the target is bracketed between a
    cap whose plan fits and one whose plan is over, then interpolates
    between the two (halving where the interpolation repeats a cap). A cap
    at which the MILP finds no plan is a floor, not the end: where only
    plans over the target were found, a step down to or below the floor
    halves the gap between the floor and the lowest cap that gave a plan
    instead (Llama-style, 2 layers, mixed/balanced at a 14.0 MiB budget:
    the first plan simulated 2.4 MiB over, and the model had no plan a
    full excess lower, while plans in between fit)."""

    target: int
    fit: tuple[int, int] | None = None
    """(cap, peak) of the highest cap whose plan fits the target."""
    over: tuple[int, int] | None = None
    """(cap, peak) of the lowest cap whose plan is over it. The cap is the
    plan's own modelled peak where that is lower: the MILP gives the same
    plan at every cap down to there (optimal at the higher cap, and still
    feasible), so a step down by the excess from the higher cap repeats it
    until it passes that peak (Llama-style at 0.6, recompute-only: 0.06 MB
    over, three solves in 0.06 MB steps, the same plan each time, while
    its modelled peak lay 1 MB under the budget)."""
    floor: int | None = None
    """The highest cap at which the MILP found no plan."""
    caps: set[int] = dataclasses.field(default_factory=set)
    last_peak: int = 0
    """The simulated peak of the plan at the cap added last (0: none)."""

    def add(self, cap: int, peak: int | None, modelled: int | None = None) -> None:
        """The plan solved at ``cap`` simulated at ``peak`` (None: the MILP
        found no plan); ``modelled`` is its peak by the MILP's own rows."""
        self.caps.add(cap)
        self.last_peak = peak or 0
        if peak is None:
            if self.floor is None or cap > self.floor:
                self.floor = cap
        elif peak <= self.target:
            if self.fit is None or cap > self.fit[0]:
                self.fit = (cap, peak)
        else:
            lowest = cap if modelled is None else min(cap, modelled)
            if self.over is None or lowest < self.over[0]:
                self.over = (lowest, peak)

    def next_cap(self, tolerance: float) -> int | None:
        if self.fit is not None and self.target - self.fit[1] <= tolerance * self.target:
            return None  # close enough under the target
        if self.over is None:  # every plan fit: step up by the slack
            if self.fit is None:
                return None
            cap = self.fit[0] + self.target - self.fit[1]
        elif self.fit is None:  # every plan was over: step down by the excess
            cap = self.over[0] - (self.over[1] - self.target)
            if self.floor is not None and cap <= self.floor:
                cap = self.floor + (self.over[0] - self.floor) // 2
        else:
            (lo, lo_peak), (hi, hi_peak) = self.fit, self.over
            if hi - lo <= 1:
                return None
            cap = lo + (hi - lo) // 2
            if hi_peak > lo_peak:
                cap = lo + int((self.target - lo_peak) * (hi - lo) / (hi_peak - lo_peak))
            if not lo < cap < hi or cap in self.caps:
                cap = lo + (hi - lo) // 2
        if cap <= 0 or cap in self.caps or (self.floor is not None and cap <= self.floor):
            return None
        return cap


def _model_peak(problem: PlanProblem, solution: PlanSolution | None) -> int | None:
    """The peak the MILP's memory rows give a plan it solved (None where
    the plan did not come from the MILP): every cap from there up to the
    one it was solved at admits it, so a lower cap must go below it."""
    if solution is None or problem.memory is None or (not solution.choices and problem.candidates):
        return None
    return modelled_peak(problem, solution)


def _plan_key(solution: PlanSolution) -> tuple:
    return tuple(sorted((name, choice.decision.value, choice.codec) for name, choice in solution.choices.items()))


def _over_budget(outcome: PlanOutcome, search: str) -> PlanOutcome:
    """Warns where no plan tried fits the budget by simulation (the split
    graphs hold what the model did not expect, and the tighter solves could
    not make up for it): training runs, over the budget by the figure the
    warning gives. ``search`` says which re-solve came last, or why none
    ran."""
    peak, budget = outcome.budget.peak_of(outcome.timeline), outcome.budget.budget_bytes
    what = "step peak" if outcome.budget.scope == "step" else "activation peak"
    if peak > budget:
        warnings.warn(
            f"adacc: the plan's {what} {peak} bytes is {peak - budget} bytes "
            f"({(peak - budget) / max(budget, 1):.1%}) over the budget {budget} after {outcome.resolves} "
            f"corrective re-solve(s) ({search}); using the "
            f"lowest-peak plan tried",
            stacklevel=4,
        )
    return outcome


def _relax_boundary(
    problem: PlanProblem, budget: BudgetResolution, planner: str, options: SolverOptions, within_peak: PlanSolution
) -> tuple[BudgetResolution, PlanSolution, list[str]]:
    """No plan meets both caps of a ratio budget, but ``within_peak`` (the
    lowest-peak plan) fits the peak budget: only the boundary share was
    out of reach. The cap becomes the least any plan within the peak holds,
    and the fastest plan under both is solved (started from that
    least-bytes plan). The peak budget, what the user's memory is, stays;
    only where no plan fits the peak either is the budget clamped to the
    reachable minimum (`clamp_to_minimum`), which would otherwise hand back
    the lowest-peak plan, slower than needed, for a peak the budget allows.

    The least-bytes solve starts from ``within_peak``: without a start,
    HiGHS can stop on its time limit before it finds any plan (a 2-layer
    GPT with codecs at 0.3 did, and the search went on with an empty
    plan)."""
    relaxed, least = _least_boundary(
        problem, budget, budget.boundary_bytes, with_start(options, within_peak, "the lowest-peak plan")
    )
    if not least.choices:  # the solver kept no plan, not even its start
        least = within_peak
        relaxed = dataclasses.replace(budget, boundary_bytes=_boundary_cap(problem, within_peak, budget.boundary_bytes))
    solution = _solve(problem, relaxed, planner, with_start(options, least, "the least-bytes plan within the peak"))
    if solution.status == "infeasible":  # the start itself meets both caps; a solver limit
        solution = least
    note = (
        f"no plan within the peak budget holds at most {budget.boundary_bytes} bytes at the forward/backward "
        f"boundary (the ratio's share of the default's saved bytes, or what later graphs of the step leave "
        f"it); the boundary cap is the least any plan "
        f"within the peak holds, {relaxed.boundary_bytes} bytes"
    )
    log.info("adacc: %s", note)
    return relaxed, solution, [note]


def _least_boundary(
    problem: PlanProblem, budget: BudgetResolution, requested: int | None, options: SolverOptions
) -> tuple[BudgetResolution, PlanSolution]:
    """The boundary cap at ``budget``'s peak: the requested one, or the least
    any plan within that peak holds where that is more (with that plan;
    none where no plan fits the peak). Used within a reachable peak
    (`_relax_boundary`) and at the minimum, where this graph's own peak
    cannot fall further but what it holds at its forward/backward boundary still lies under the
    peaks of the graphs that run inside its backward window (a loss graph
    after a graph break holds the logits and their gradient on top of it:
    HF GPT-2's step peaks there). So the plan at the minimum holds at most
    the requested boundary bytes, or the least any plan at the minimum
    holds where that is more."""
    within_peak = dataclasses.replace(problem, budget_bytes=budget.budget_bytes, boundary_budget_bytes=None)
    least = solve_milp(within_peak, options, minimize="bytes")
    if not least.choices:
        return budget, least
    return dataclasses.replace(budget, boundary_bytes=_boundary_cap(problem, least, requested)), least


def _boundary_cap(problem: PlanProblem, plan: PlanSolution, requested: int | None) -> int:
    """The requested boundary cap, or what ``plan`` saves (plus rounding
    room) where that is more."""
    held = int(saved_bytes(problem, plan) * (1 + 1e-6)) + 1
    return held if requested is None else max(requested, held)


def _solve(problem: PlanProblem, budget: BudgetResolution, planner: str, options: SolverOptions) -> PlanSolution:
    problem = dataclasses.replace(
        problem, budget_bytes=budget.budget_bytes, boundary_budget_bytes=budget.boundary_bytes
    )
    return get_policy(planner)(problem, options)


def _prefer_default(
    full: PlanProblem, solution: PlanSolution, source: str, default: PlanSolution, budget: BudgetResolution
) -> tuple[PlanSolution, str]:
    """PyTorch's plan instead, where it fits the budget and costs less."""
    simulated = simulate(full, default)
    fits = simulated.peak_bytes <= budget.budget_bytes and (
        budget.boundary_bytes is None or saved_bytes(full, default) <= budget.boundary_bytes
    )
    if fits and added_seconds(full, default) < added_seconds(full, solution) * (1 - 1e-9):
        return default, "default"
    return solution, source


def _split(
    context: SplitContext,
    candidates: CandidateSet,
    solution: PlanSolution,
    source: str,
    budget: BudgetResolution,
    notes: Iterable[str],
) -> PlanOutcome:
    unbudgeted = dataclasses.replace(candidates.problem, budget_bytes=None, boundary_budget_bytes=None)
    errors = check_solution(unbudgeted, solution)
    if errors:
        raise RuntimeError(f"adacc planner {solution.solver} produced an illegal plan: {errors}")
    plan_timing.count_split()
    with plan_timing.timed("split"):
        saved = saved_values_for(context.joint, context.info, candidates, solution)
        fw, bw = split_joint_graph(context.joint, context.info, saved, num_fwd_outputs=context.num_fwd_outputs)
        fw, bw = apply_compression(
            fw, bw, solution, num_fwd_outputs=context.num_fwd_outputs,
            realize=context.mode is Realization.INDUCTOR, parameters=context.codec_parameters,
            profile=context.profile,
        )
        if context.mode is Realization.INDUCTOR:  # what no few-bit codec replaced, as Inductor's table has it
            for module in (fw, bw):
                compat_inductor.decompose_whole_ops(module, replaced_ops())
    with plan_timing.timed("simulate"):
        timeline = context.simulate(fw, bw)
        if context.fold is not None:
            timeline = context.fold.extend_for(timeline, candidates.problem, solution)
    return PlanOutcome(
        solution=solution,
        saved=saved,
        fw=fw,
        bw=bw,
        timeline=timeline,
        simulated=simulate(candidates.problem, solution),
        source=source,
        budget=budget,
        notes=tuple(notes),
    )
