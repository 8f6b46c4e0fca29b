"""Plan search: decide once under the budget, confirm by simulation, split
once.

Reads: the joint graph and its split (`compat.JointGraphInfo`), the
candidates (full problem, with its memory model), the block reduction (the
problem the policy solves), the resolved budget and PyTorch's default plan.
Writes nothing on the joint graph; returns a `PlanOutcome` with the chosen
solution and the forward/backward graphs made from it.

The MILP's memory rows bound the activation peak at every position of the
step (`peak_model`), so its plan fits the budget by construction; it is
simulated on the plain problem (no graph work) and then split once, and the
split graphs are simulated again. Only if that last simulation disagrees
with the model (the split placed something where the model did not expect
it) is the MILP solved once more with the budget lowered by the excess,
and the reason logged. Where no plan meets both caps of a ratio budget but
plans within its peak exist, the boundary cap is relaxed to the least any
of them holds (`_relax_boundary`); only a peak out of reach is clamped to
the reachable minimum. At the budget the default partitioner's own plan is
also a candidate: where it fits and is cheaper by the cost model, it is
used, so a ratio of 1.0 is never worse than the default.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from typing import Iterable

import torch.fx as fx

from adacc_compile import compat

from .budget import BudgetResolution, clamp_to_minimum
from .candidates import CandidateSet
from .compress_rewrite import apply_compression
from .depth_fold import DepthFold
from .fusion import Realization
from .memory_sim import MemoryTimeline, simulate_step
from .milp import SolverOptions, solve_milp, with_start
from .peak_model import SimulatedPeak, simulate
from .plan_problem import PlanProblem, PlanSolution, added_seconds, check_solution, saved_bytes
from .policies import get_policy
from .rewrite import saved_values_for, split_joint_graph
from .structure import BlockReduction

log = logging.getLogger(__name__)

FIXED_PLANNERS = ("keep_all", "recompute_all")


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

    @property
    def forward_names(self) -> set[str]:
        return {n.name for n in self.info.forward_nodes}


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
    """"planner", "default" (PyTorch's choice was cheaper and fits) or
    "minimum" (nothing fit the budget; the lowest-peak plan)."""
    budget: BudgetResolution
    """The budget the plan was made for (clamped where nothing fit)."""
    resolves: int = 0
    """Corrective re-solves (at most one)."""
    notes: tuple[str, ...] = ()


def search_plan(
    context: SplitContext,
    candidates: CandidateSet,
    reduction: BlockReduction,
    budget: BudgetResolution,
    *,
    planner: str,
    options: SolverOptions,
    on_infeasible: str = "warn",
    default: PlanSolution | None = None,
) -> PlanOutcome:
    full = candidates.problem
    fixed = planner in FIXED_PLANNERS
    notes: list[str] = []
    solution = _solve(reduction.problem, budget, planner, options)
    source = "planner"
    if solution.status == "infeasible" and not fixed and budget.boundary_bytes is not None:
        budget, solution, note = _relax_boundary(reduction.problem, budget, planner, options)
        notes.extend(note)
    if solution.status == "infeasible" and not fixed:
        requested_boundary = budget.boundary_bytes
        budget, lowest = clamp_to_minimum(budget, reduction.problem, options, on_infeasible=on_infeasible)
        budget, least = _least_boundary(
            reduction.problem, budget, requested_boundary, with_start(options, lowest, "the lowest-peak plan")
        )
        # The fastest plan at that peak (the lowest-peak solve only breaks
        # ties on time, and does not place recomputation in windows), started
        # from the least-bytes plan at the minimum, which meets both caps.
        fastest_at_minimum = _solve(
            reduction.problem, budget, planner, with_start(options, least, "the least-bytes plan at the minimum")
        )
        solution = fastest_at_minimum if fastest_at_minimum.status != "infeasible" else lowest
        source = "minimum"
    solution = reduction.expand(solution)
    if not fixed and default is not None:
        solution, source = _prefer_default(full, solution, source, default, budget)
    outcome = _split(context, candidates, solution, source, budget, notes)
    if fixed or outcome.timeline.activation_peak_bytes <= budget.budget_bytes:
        return outcome
    excess = outcome.timeline.activation_peak_bytes - budget.budget_bytes
    reason = (
        f"the split graphs peak at {outcome.timeline.activation_peak_bytes} bytes, {excess} over the "
        f"budget {budget.budget_bytes} the model met; re-solving once with the budget lowered by that"
    )
    log.info("adacc: %s", reason)
    tighter = dataclasses.replace(budget, budget_bytes=budget.budget_bytes - excess)
    retry = _solve(reduction.problem, tighter, planner, options)
    if retry.status == "infeasible":
        return _over_budget(dataclasses.replace(outcome, notes=(*outcome.notes, reason + ": no plan fits that")))
    second = _split(context, candidates, reduction.expand(retry), "planner", budget, [*notes, reason])
    best = min((outcome, second), key=lambda o: o.timeline.activation_peak_bytes)
    return _over_budget(dataclasses.replace(best, resolves=1, notes=(*best.notes, reason)))


def _over_budget(outcome: PlanOutcome) -> PlanOutcome:
    """Warns where the plan kept after the corrective re-solve still peaks
    over the budget (the split graphs hold what the model did not expect,
    and the tighter solve could not make up for it): training runs, over
    the budget by the figure the warning gives."""
    peak, budget = outcome.timeline.activation_peak_bytes, outcome.budget.budget_bytes
    if peak > budget:
        warnings.warn(
            f"adacc: the plan's activation peak {peak} bytes is {peak - budget} bytes "
            f"({(peak - budget) / max(budget, 1):.1%}) over the budget {budget} after one corrective re-solve "
            f"({outcome.notes[-1]}); using the lowest-peak plan of the two",
            stacklevel=4,
        )
    return outcome


def _relax_boundary(
    problem: PlanProblem, budget: BudgetResolution, planner: str, options: SolverOptions
) -> tuple[BudgetResolution, PlanSolution, list[str]]:
    """No plan meets both caps of a ratio budget. Where plans within the
    peak budget exist, only the boundary share was out of reach: the cap
    becomes the least any plan within the peak holds, and the fastest plan
    under both is solved (started from that least-bytes plan). The peak
    budget, what the user's memory is, stays; only where no plan fits the
    peak either is the budget clamped to the reachable minimum
    (`clamp_to_minimum`), which would otherwise hand back the lowest-peak
    plan, slower than needed, for a peak the budget allows."""
    relaxed, least = _least_boundary(problem, budget, budget.boundary_bytes, options)
    if not least.choices:
        return budget, least, []
    solution = _solve(problem, relaxed, planner, with_start(options, least, "the least-bytes plan within the peak"))
    if solution.status == "infeasible":  # the start itself meets both caps; a solver limit
        solution = least
    note = (
        f"no plan within the peak budget holds at most {budget.boundary_bytes} bytes at the forward/backward "
        f"boundary (the ratio's share of the default's saved bytes); the boundary cap is the least any plan "
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
    least_bytes = int(saved_bytes(problem, least) * (1 + 1e-6)) + 1
    cap = least_bytes if requested is None else max(requested, least_bytes)
    return dataclasses.replace(budget, boundary_bytes=cap), least


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
    saved = saved_values_for(context.joint, context.info, candidates, solution)
    fw, bw = split_joint_graph(context.joint, context.info, saved, num_fwd_outputs=context.num_fwd_outputs)
    fw, bw = apply_compression(fw, bw, solution, num_fwd_outputs=context.num_fwd_outputs)
    timeline = simulate_step(
        fw, bw, num_fwd_outputs=context.num_fwd_outputs, forward_names=context.forward_names,
        mode=context.mode, charged_inputs=context.charged_inputs,
    )
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
