"""The pipeline's stages: each ``stage(state) -> None`` reads and fills
fields of `PartitionState`; the work is in `adacc_compile.passes`. The order
and the runner are in `adacc_compile.stage_runner`."""

from __future__ import annotations

import dataclasses
import logging

from adacc_compile import compat, rank_zero
from adacc_compile.passes.annotate import annotate, tensor_bytes
from adacc_compile.passes.budget import resolve_budget
from adacc_compile.passes.calibrate import (
    Calibration, calibrate_candidates, calibrated_candidates, lossy_options, not_calibrated,
)
from adacc_compile.passes.candidates import CandidateSet, find_candidates, with_step_constants
from adacc_compile.passes.codec_options import allowed_codecs, make_compress_options
from adacc_compile.passes.default_plan import counted_saved_bytes, default_plan
from adacc_compile.passes.depth_fold import make_fold, repeated_block
from adacc_compile.passes.device_profile import profile_by_name
from adacc_compile.passes.dropout_replay import replay_dropout_from_masks
from adacc_compile.passes.early_placement import place_backward_only_values_early
from adacc_compile.passes.fusion import Realization, mark_placed
from adacc_compile.passes.peak_model import build_memory_model
from adacc_compile.passes.plan_problem import BlockRepeat, PlanProblem
from adacc_compile.passes.plan_search import (
    FIXED_PLANNERS,
    SplitContext,
    first_plan,
    fit_simulated_peak,
    split_plan,
)
from adacc_compile.passes.structure import (
    block_classes,
    differing_blocks,
    first_differentiated_apart,
    no_reduction,
    protect_block_boundaries,
    reduce_identical_blocks,
)
from adacc_compile.passes.verify import verify_split
from adacc_compile.state import PartitionState

log = logging.getLogger(__name__)


def prepare(state: PartitionState) -> None:
    """PyTorch's own joint-graph clean-ups (dead code, must-save tags), and
    under Inductor, dropout made recomputable from its mask (`dropout_replay`)."""
    state.joint = compat.prepare_joint_graph(state.joint)
    if state.mode is Realization.INDUCTOR:
        replay_dropout_from_masks(state.joint)


def classify(state: PartitionState) -> None:
    """Which nodes are forward and backward; the views only the backward
    reads (``place_backward_only_views_early``) then move to where the
    forward is done with their bases, and under Inductor
    (``place_backward_only_early``) the computed ones to the kernel
    Inductor fuses them into (`early_placement`)."""
    state.info = compat.classify_joint_graph(
        state.joint, state.static_lifetime_input_indices, state.num_fwd_outputs
    )
    config = state.config
    all_values = config.place_backward_only_early and state.mode is Realization.INDUCTOR
    if all_values or config.place_backward_only_views_early:
        views_only = not all_values
        moved = place_backward_only_values_early(state.joint, state.info, views_only=views_only, mode=state.mode)
        log.debug("adacc: %d backward-only %s placed early", moved, "views" if views_only else "values")


def annotate_stage(state: PartitionState) -> None:
    assert state.info is not None
    state.profile = profile_by_name(state.config.device_profile)
    annotate(state.joint, state.profile, state.info.backward_nodes)


def candidates_stage(state: PartitionState) -> None:
    assert state.info is not None and state.profile is not None
    codecs = allowed_codecs(state.config.accuracy, state.config.codecs)
    options = make_compress_options(
        codecs, state.profile, state.info.backward_nodes, state.info.forward_needed, mode=state.mode
    )
    state.candidates = find_candidates(
        state.joint, state.info, options, allow_recompute=state.config.allow_recompute,
        profile=state.profile, mode=state.mode, num_fwd_outputs=state.num_fwd_outputs,
        step_budget=state.config.budget_scope == "step",
    )
    if state.config.budget_scope == "step":
        state.earlier_output_bytes = earlier_output_bytes(state)
        state.candidates = with_step_constants(
            state.candidates, forward=state.earlier_output_bytes, backward=state.later_gradient_bytes
        )


def calibrate_stage(state: PartitionState) -> None:
    assert state.candidates is not None and state.info is not None
    if not state.config.calibrate_codecs:
        state.calibration = not_calibrated("off (calibrate_codecs=False)")
    else:
        def measure() -> Calibration:
            return calibrate_candidates(state.joint, state.info, state.candidates, state.real_inputs)

        if rank_zero.distributed():  # rank 0's batch for every rank: plans agree
            state.calibration = rank_zero.shared_calibration(
                measure, lossy_options(state.candidates), state.config.plan_check_timeout_s
            )
        else:
            state.calibration = measure()
    state.real_inputs = None
    state.candidates = calibrated_candidates(state.candidates, state.calibration)


EXACT_MODEL_CANDIDATES = 1500
"""Without block reuse (``block_reuse=False``), up to this many candidates
the memory model takes every position of the step one by one; with block
reuse, or above it, the blocks of each class other than its first, its last
and the one before the last (the last decides apart:
`structure.first_differentiated_apart`) are bounded by the rows of those
(`peak_model.dominated_segments`), so the MILP has the size of three blocks
whatever the depth."""

BLOCK_BOUNDARY_CANDIDATES = 8
"""Identical blocks with at least this many candidates each (transformer
blocks, not single layers of a plain MLP) keep the values flowing between
them (`structure.protect_block_boundaries`): recomputation chains then stay
inside a block, as in full activation checkpointing, and the memory model
stays small."""


def structure_stage(state: PartitionState) -> None:
    """Identical blocks share one set of decisions with ``block_reuse``
    (Lynx HEU; off where communication windows are in play, which are per
    block). Then the memory model of the step, on the full problem."""
    assert state.candidates is not None
    nodes = state.candidates.nodes
    full = state.candidates.problem
    classes = block_classes(full, nodes)
    sizes = {c.block: 0 for c in full.candidates}
    for cand in full.candidates:
        sizes[cand.block] += 1
    protected = tuple(cls for cls in classes if sizes[cls[0]] >= BLOCK_BOUNDARY_CANDIDATES)
    full = protect_block_boundaries(full, protected)
    reuse = state.config.block_reuse and not full.windows and bool(classes)
    shared = first_differentiated_apart(classes)
    coarse: frozenset[str] = frozenset()
    if reuse or len(full.candidates) > EXACT_MODEL_CANDIDATES:
        # Exact: the first block differentiated (deciding on its own), the
        # representative (the next, the first differentiated of those
        # sharing decisions) and the first in the forward (the last
        # differentiated, where a step budget's gradients are largest).
        coarse = frozenset(b for cls in first_differentiated_apart(protected) for b in cls[1:-1])
    if state.fold_copies:
        full = _fold(state, full, classes if reuse else (), sizes)
    if reuse:
        # Reported over the whole classes, with the blocks deciding apart named.
        reduction = dataclasses.replace(
            reduce_identical_blocks(full, nodes, shared), classes=classes,
            apart=tuple(cls[0] for cls, kept in zip(classes, shared) if kept != cls),
        )
    else:
        reduction = no_reduction(full)
    reduction = dataclasses.replace(reduction, differing=differing_blocks(full, nodes, classes))
    memory = build_memory_model(full, coarse_blocks=coarse, rep_of=reduction.rep_of)
    state.candidates = CandidateSet(problem=dataclasses.replace(full, memory=memory), nodes=nodes)
    state.reduction = dataclasses.replace(
        reduction, problem=dataclasses.replace(reduction.problem, memory=memory, layout=full.layout)
    )


def _fold(
    state: PartitionState, full: PlanProblem, classes: tuple[tuple[str, ...], ...], sizes: dict[str, int]
) -> PlanProblem:
    """Depth folding: a middle block of the largest class of identical
    blocks stands for ``fold_copies`` more (`depth_fold`). It needs block
    reuse (the copies share the block's decisions)."""
    assert state.info is not None
    block = repeated_block(classes, sizes)
    if block is None:
        raise ValueError(
            "depth folding needs identical repeated blocks with block reuse on; "
            "this graph has none (trace the whole model instead)"
        )
    repeat = BlockRepeat(block=block, copies=state.fold_copies)
    state.fold = make_fold(state.joint, state.info, state.num_fwd_outputs, repeat)
    return dataclasses.replace(full, repeat=repeat)


def budget_stage(state: PartitionState) -> None:
    """The budget in bytes, anchored at PyTorch's default partitioner."""
    assert state.reduction is not None and state.candidates is not None
    assert state.info is not None
    saved = compat.default_saved_values(state.joint, state.info)
    state.default_saved_names = frozenset(n.name for n in saved)
    state.default_plan = default_plan(state.candidates.problem, (n.name for n in saved))
    state.budget = resolve_budget(
        state.reduction.problem,
        state.config.memory_budget,
        state.solver_options,
        full_problem=state.candidates.problem,
        default_plan=state.default_plan,
        default_counted_bytes=counted_saved_bytes(
            state.candidates.problem, {n.name: tensor_bytes(n.meta.get("val")) for n in saved}
        ),
        held_by_earlier_graphs=state.held_by_earlier_graphs,
        held_default_by_earlier_graphs=state.held_default_by_earlier_graphs,
        measured_excess=state.measured_excess_bytes,
        scope=state.config.budget_scope,
        boundary_cap=state.boundary_cap_bytes,
    )


def earlier_output_bytes(state: PartitionState) -> int:
    """After a graph break (``state.earlier_graphs``): the bytes of this
    graph's activation inputs (not parameters or buffers). They are earlier
    graphs' outputs, allocated inside the step and held by the caller
    through this graph's forward: Hugging Face GPT-2's logits, which its
    loss graph reads while it writes their exponentials, is where that
    step peaks (measured). The caller holds them until this graph's forward
    returns, so the whole forward is their lifetime here; an input the plan
    keeps is charged from the boundary on, like any kept value (the model's
    forward rows and the simulation leave inputs to this constant). The
    first graph's inputs were allocated before the step."""
    if not state.earlier_graphs:
        return 0
    assert state.info is not None
    static = set(state.info.static_lifetime_input_nodes)
    return sum(
        tensor_bytes(n.meta.get("val"))
        for n in state.joint.graph.nodes
        if compat.is_primal(n) and n not in static
    )


def charged_inputs(state: PartitionState) -> frozenset[str]:
    """Graph inputs the plan decides about (candidates produced before the
    forward's first node): the simulator charges them as activations."""
    assert state.candidates is not None
    return frozenset(
        c.name for c in state.candidates.problem.candidates if c.lifetime is not None and c.lifetime.produced < 0
    )


def plan_stage(state: PartitionState) -> None:
    """Decide under the budget (`plan_search`), in three steps: the
    policy's plan of one block class at the budget (or at the reachable
    minimum, where the budget is out of reach); that plan over every block
    (or PyTorch's own, where it fits and costs no more) split into forward
    and backward graphs and simulated as they will run; re-solves that move
    the model's cap until the simulated peak meets the budget."""
    assert state.candidates is not None and state.info is not None
    assert state.reduction is not None and state.budget is not None
    context = SplitContext(
        joint=state.joint,
        info=state.info,
        num_fwd_outputs=state.num_fwd_outputs,
        mode=state.mode,
        charged_inputs=charged_inputs(state),
        fold=state.fold,
        codec_parameters=state.calibration.codec_parameters() if state.calibration is not None else {},
        profile=state.profile,
        forward_extra_bytes=state.earlier_output_bytes,
        backward_extra_bytes=state.later_gradient_bytes,
    )
    state.split_context = context
    planner, options = state.config.planner, state.solver_options
    fixed = planner in FIXED_PLANNERS
    first = first_plan(
        state.reduction, state.budget, planner=planner, options=options, on_infeasible=state.config.on_infeasible
    )
    outcome = split_plan(context, state.candidates, state.reduction, first, default=None if fixed else state.default_plan)
    if not fixed:
        outcome = fit_simulated_peak(
            context, state.candidates, state.reduction, outcome, planner=planner, options=options,
            solves=state.config.peak_fit_solves,
            first_reduced=first.solution if outcome.source != "default" else None,
        )
    state.outcome, state.budget = outcome, outcome.budget
    state.solution, state.saved_values = outcome.solution, outcome.saved
    state.fw_module, state.bw_module, state.timeline = outcome.fw, outcome.bw, outcome.timeline
    state.replans = outcome.resolves


def placed_stage(state: PartitionState) -> None:
    """Tags the backward nodes the plan placed (`fusion.mark_placed`): the
    memory model runs them where they stand, and Inductor is kept from
    fusing them with a far kernel. The last change to the graphs."""
    assert state.bw_module is not None
    mark_placed(state.bw_module, state.forward_names)


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
