"""`PartitionState`: everything the pipeline's stages produce for one joint
graph. Its own module so that stages, reports and the overlap stages can
use it without importing the pipeline (which imports them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from adacc_compile import compat
from adacc_compile.config import AdaccConfig
from adacc_compile.passes.budget import BudgetResolution
from adacc_compile.passes.calibrate import Calibration
from adacc_compile.passes.candidates import CandidateSet
from adacc_compile.passes.depth_fold import DepthFold
from adacc_compile.passes.device_profile import DeviceProfile
from adacc_compile.passes.fusion import Realization
from adacc_compile.passes.memory_sim import MemoryTimeline
from adacc_compile.passes.milp import SolverOptions
from adacc_compile.passes.plan_problem import Choice, PlanSolution
from adacc_compile.passes.plan_search import PlanOutcome, SplitContext
from adacc_compile.passes.plan_timing import PlanTiming
from adacc_compile.passes.structure import BlockReduction


@dataclass(slots=True, kw_only=True)
class PartitionState:
    """What the stages read and write (each stage's docstring says which)."""

    joint: fx.GraphModule
    config: AdaccConfig
    num_fwd_outputs: int
    static_lifetime_input_indices: list[int] = field(default_factory=list)
    graph_index: int = 0
    mode: Realization = Realization.INDUCTOR
    """How the split graphs will run: Inductor fuses, adacc_eager does not."""
    held_by_earlier_graphs: int = 0
    """Bytes earlier graphs of the same step hold through this graph's
    forward and backward (`step_ledger`): charged against the budget."""
    held_default_by_earlier_graphs: int = 0
    """What PyTorch's default plans of those graphs would hold (a ratio
    budget is of the step's default total)."""
    earlier_graphs: tuple[int, ...] = ()
    boundary_cap_bytes: int | None = None
    """Saved bytes later graphs of the step leave this one at its
    forward/backward boundary (`step_ledger.StepLedger.ask_room`)."""
    measured_excess_bytes: int = 0
    """How far the measured first step's peak was above (negative: below)
    the plan's prediction (`step_measure`): the budget's cap moves down by
    it when the graph re-plans."""
    earlier_output_bytes: int = 0
    """Under a step budget after a graph break: earlier graphs' outputs
    this graph reads, alive through its forward (`stages.earlier_output_bytes`)."""
    later_gradient_bytes: int = 0
    """Bytes later graphs' backwards leave alive (their parameters'
    gradients) through this graph's backward, under a step budget: a
    constant of its backward rows and simulation."""
    split_context: SplitContext | None = None
    """What the plan stage split and simulated the plan with; the overlap
    stage re-simulates the step through it."""
    fold_copies: int = 0
    """Depth folding (`depth_fold`, ``adacc plan`` on a deep model traced
    shallow): the number of copies of a middle block the step has beyond
    the traced ones (0: the graph is the whole step)."""
    fold: DepthFold | None = None
    real_inputs: list[Any] | None = None
    """Real values of the graph's primal inputs, when the backend has them
    (calibration); dropped once calibrated."""
    calibration: Calibration | None = None
    info: compat.JointGraphInfo | None = None
    profile: DeviceProfile | None = None
    candidates: CandidateSet | None = None
    reduction: BlockReduction | None = None
    default_plan: PlanSolution | None = None
    """PyTorch's default partitioner's choice as a plan of the full problem."""
    default_saved_names: frozenset[str] = frozenset()
    """The values that choice saves, as PyTorch made it (``adacc plan``
    splits the graph with them to compare)."""
    budget: BudgetResolution | None = None
    outcome: PlanOutcome | None = None
    solution: PlanSolution | None = None
    saved_values: list[fx.Node] = field(default_factory=list)
    fw_module: fx.GraphModule | None = None
    bw_module: fx.GraphModule | None = None
    timeline: MemoryTimeline | None = None
    replans: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    plan_timing: PlanTiming = field(default_factory=PlanTiming)
    """Where planning time went: model building, solves, splits, simulation."""
    report: dict[str, Any] = field(default_factory=dict)
    overlap: Any = None
    """`overlap.OverlapState`: communication windows, placement, plan hash."""
    start_plan: dict[str, Choice] | None = None
    """The plan a re-plan replaces (`adaptation`): the MILP starts from it."""

    @property
    def solver_options(self) -> SolverOptions:
        return SolverOptions(
            time_limit_s=self.config.solver_time_limit_s,
            node_limit=self.config.solver_node_limit,
            mip_rel_gap=self.config.mip_rel_gap,
            threads=self.config.solver_threads,
            start=self.start_plan,
        )

    @property
    def forward_names(self) -> set[str]:
        assert self.info is not None
        return {n.name for n in self.info.forward_nodes}
