"""Turning the user's budget into bytes, and knowing what is reachable.

The budget bounds the step's activation peak (`peak_model`). A ratio is
relative to what PyTorch's default partitioner does with the same graph:
``r`` means at most ``r`` times the activation peak of the default's choice
of saved values (simulated with adacc's model) and at most ``r`` times the
bytes it saves at the forward/backward boundary. So ``memory_budget=1.0``
never holds more than the default, and the default's own plan is one of
the plans adacc may pick there (it does where nothing cheaper fits: see
`plan_search`). A byte budget bounds the peak alone, minus what earlier
graphs of the same step still hold (`held_by_earlier_graphs`, from
`adacc_compile.step_ledger`); a ratio is then of the step's total so far:
``r`` times (what the default's plans of the earlier graphs hold plus this
graph's default peak), less what adacc's earlier graphs hold.

The fastest plan (no budget) is solved here. Where the planner finds no
plan within the budget, `clamp_to_minimum` solves for the reachable
minimum (the lowest modelled peak of any legal plan): a budget below it is
an error or, by default, a warning and the minimum-peak plan, so training
still runs and the user is told the number.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

from adacc_compile.config import MemoryBudget

from .memory_sim import MemoryTimeline
from .milp import SolverOptions, solve_milp, with_start
from .peak_model import decision_values, evaluate, simulate
from .policies import recompute_all_policy
from .plan_problem import InfeasibleBudgetError, PlanProblem, PlanSolution, added_seconds, saved_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetResolution:
    budget_bytes: int
    """The cap on the modelled activation peak the planner uses."""
    boundary_bytes: int | None
    """A cap on the bytes saved at the boundary (ratio budgets), or None."""
    requested_bytes: int
    """What the user's budget resolves to (may be below the minimum)."""
    default_peak_bytes: int
    """Activation peak of PyTorch's default partitioner's choice."""
    default_saved_bytes: int
    """Bytes the default partitioner saves."""
    fastest_seconds: float
    """Time (the plan objective) of the fastest legal plan."""
    fastest_peak_bytes: int
    minimum_bytes: int | None
    """The lowest modelled activation peak any legal plan reaches (computed
    only where the budget could not be met: it is the costliest solve), or
    the simulated peak of full checkpointing's plan where that holds less
    (`plan_search._full_ac_if_lower`)."""
    held_by_earlier_graphs: int = 0
    clamped: bool = False
    scope: str = "activations"
    """What the budget bounds (`AdaccConfig.budget_scope`): "activations" or
    "step"."""

    @property
    def baseline_saved_bytes(self) -> int:
        return self.default_saved_bytes

    def peak_of(self, timeline: MemoryTimeline) -> int:
        """The simulated peak this budget bounds: the activation peak, or
        under ``scope="step"`` everything the step allocates."""
        return timeline.peak_bytes if self.scope == "step" else timeline.activation_peak_bytes


def modelled_peak(problem: PlanProblem, solution: PlanSolution) -> int:
    assert problem.memory is not None
    return math.ceil(evaluate(problem.memory, decision_values(problem, solution))[0])


def resolve_budget(
    problem: PlanProblem,
    budget: MemoryBudget,
    options: SolverOptions,
    *,
    full_problem: PlanProblem | None = None,
    default_plan: PlanSolution | None = None,
    default_counted_bytes: int | None = None,
    held_by_earlier_graphs: int = 0,
    held_default_by_earlier_graphs: int = 0,
    measured_excess: int = 0,
    scope: str = "activations",
    boundary_cap: int | None = None,
) -> BudgetResolution:
    """``problem`` is what the planner solves (reduced by block reuse);
    ``full_problem`` and ``default_plan`` (PyTorch's choice as a legal plan
    of it) give the anchors of a ratio budget. Whether the budget can be
    met is found by the planner itself (`clamp_to_minimum` where not).

    ``default_counted_bytes`` is what PyTorch counts its choice as saving
    (each saved tensor at its own size). Where it saves views, adacc holds
    their bases (what really stays alive), which can be more: the boundary
    share of a ratio is anchored at the smaller of the two, so that
    ``memory_budget=1.0`` never saves more than PyTorch says it does.

    ``boundary_cap``: saved bytes at the forward/backward boundary that
    later graphs of the step leave this one (`step_ledger.StepLedger
    .ask_room`), a cap on the boundary share besides the ratio's.

    ``measured_excess``: how far a measured step of an earlier plan peaked
    above its prediction (`adacc_compile.step_measure`); the cap is lower
    by that much (higher where it is negative)."""
    assert problem.memory is not None, "resolve_budget needs a problem with a memory model"
    full_problem = full_problem or problem
    # The fastest plan, without memory rows (nothing bounds it).
    unconstrained = dataclasses.replace(problem, budget_bytes=None, boundary_budget_bytes=None, memory=None)
    fastest = solve_milp(unconstrained, options)
    if fastest.status == "infeasible":
        raise ValueError(f"adacc: no legal plan exists for this graph: {fastest.notes}")
    fastest_peak = modelled_peak(problem, fastest)
    if default_plan is not None:
        default_peak = simulate(full_problem, default_plan).peak_bytes
        default_saved = saved_bytes(full_problem, default_plan)
        if default_counted_bytes is not None:
            default_saved = min(default_saved, default_counted_bytes)
    else:
        default_peak, default_saved = fastest_peak, saved_bytes(problem, fastest)
    if budget.ratio is not None:
        # Of the step so far: what the default's earlier graphs would hold
        # plus this graph's default peak, less what adacc's earlier graphs hold.
        requested = int(budget.ratio * (default_peak + held_default_by_earlier_graphs)) - held_by_earlier_graphs
        boundary: int | None = int(budget.ratio * default_saved)
    else:
        requested = budget.resolve(0) - held_by_earlier_graphs
        boundary = None
    requested -= measured_excess
    if boundary_cap is not None:
        boundary = boundary_cap if boundary is None else min(boundary, boundary_cap)
    return BudgetResolution(
        budget_bytes=requested,
        boundary_bytes=boundary,
        requested_bytes=requested,
        default_peak_bytes=default_peak,
        default_saved_bytes=default_saved,
        fastest_seconds=added_seconds(problem, fastest),
        fastest_peak_bytes=fastest_peak,
        minimum_bytes=None,
        held_by_earlier_graphs=held_by_earlier_graphs,
        scope=scope,
    )


def clamp_to_minimum(
    resolution: BudgetResolution,
    problem: PlanProblem,
    options: SolverOptions,
    *,
    on_infeasible: str,
    lowest: PlanSolution | None = None,
    warn: bool = True,
) -> tuple[BudgetResolution, PlanSolution]:
    """The budget cannot be met: find the lowest modelled peak any legal plan
    reaches (``lowest``, where already solved: `lowest_peak_plan`), then
    raise (``on_infeasible="error"``) or warn (`out_of_reach_warning`;
    ``warn=False`` leaves that to the caller, who may still find a plan
    within the budget) and return that budget with the plan that reaches
    it."""
    if lowest is None:
        lowest = lowest_peak_plan(problem, options)
    minimum = modelled_peak(problem, lowest)
    error = InfeasibleBudgetError(resolution.requested_bytes, minimum)
    if on_infeasible == "error":
        raise error
    if warn:
        warnings.warn(out_of_reach_warning(resolution.requested_bytes, minimum, resolution.scope), stacklevel=3)
    clamped = dataclasses.replace(
        resolution, budget_bytes=minimum, boundary_bytes=None, minimum_bytes=minimum, clamped=True
    )
    return clamped, lowest


def out_of_reach_warning(requested_bytes: int, minimum_bytes: int, scope: str) -> str:
    """What the user is told when the budget is below every plan's reach."""
    error = InfeasibleBudgetError(requested_bytes, minimum_bytes)
    what = "step peak" if scope == "step" else "activation peak"
    return (
        f"adacc: {error.args[0].split(';')[0]}; using the plan with the lowest {what} "
        f"({minimum_bytes} bytes) instead"
    )


def lowest_peak_plan(problem: PlanProblem, options: SolverOptions) -> PlanSolution:
    """The plan with the lowest modelled peak (whatever ``problem``'s caps)
    among the MILP's peak-minimising solve and recomputing everything legal
    (op-level full checkpointing). The second is the answer where HiGHS
    stops on its time limit without a plan, and a guard where the solve's
    best plan so far is worse."""
    problem = dataclasses.replace(problem, budget_bytes=None, boundary_budget_bytes=None)
    everything = recompute_all_policy(problem, options)
    # Recomputing everything is legal and low: HiGHS starts from it.
    start = with_start(options, everything, "the plan that recomputes everything it may")
    plans = [solve_milp(problem, start, minimize="peak"), everything]
    legal = [p for p in plans if p.choices or not problem.candidates]
    if not legal:
        raise ValueError(f"adacc: no legal plan exists for this graph: {[p.notes for p in plans]}")
    if not plans[0].choices and plans[0].status != "infeasible":
        warnings.warn(
            f"adacc: HiGHS stopped with status {plans[0].status!r} and no plan while searching for the "
            f"lowest reachable peak (solver_time_limit_s={options.time_limit_s:g}); using the plan that "
            f"recomputes everything it may",
            stacklevel=4,
        )
    return min(legal, key=lambda p: modelled_peak(problem, p))
