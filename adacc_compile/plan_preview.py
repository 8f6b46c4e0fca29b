"""Planning a model without a GPU: trace it under fake tensors, run adacc's
pipeline on its joint graph, and put the plan next to what the usual
strategies would hold on the same graph (``adacc plan``).

Nothing is compiled or run: the model is built under fake tensors
(`compat_tracing.fake_tensors`), Dynamo and AOTAutograd trace it to the joint graph
``torch.compile`` would partition (`compat_tracing.capture_joint_graph`), and the
pipeline plans it with a built-in GPU profile as the cost model. Each
baseline strategy is a set of saved values on that same graph, split into
forward and backward by PyTorch's extractor and simulated by adacc's memory
simulator (`memory_sim.simulate_step`, Inductor's fusion), so all of them
are measured by one ruler:

* **no checkpointing**: Inductor's default partitioner (PyTorch's min-cut
  choice);
* **full AC**: every value inside a repeated block recomputed, only what
  flows between blocks kept (activation checkpointing of each block); what
  lies outside the blocks as the default partitioner does it;
* **PyTorch budget**: PyTorch's memory-budget partitioner
  (``activation_memory_budget``) at the ratio of adacc's budget to the
  default's activation peak (left out where that ratio is 1 or more: the
  default's own choice then).

Step times are the roofline estimate of the joint graph on the GPU profile
plus each plan's added time by adacc's cost model (recomputation, codecs).

Attention is traced as a GPU runs it (`attention_as_on_a_gpu`): with
dropout inside ``scaled_dot_product_attention`` the CPU's SDPA takes its
math path, which saves the scores and the dropout mask, while a GPU's
flash attention keeps dropout inside the kernel and saves neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat, compat_tracing
from adacc_compile.config import AdaccConfig
from adacc_compile.forked import Forked
from adacc_compile.model_source import ModelSource
from adacc_compile.passes.default_plan import default_plan
from adacc_compile.passes.fusion import Realization
from adacc_compile.passes.memory_sim import MemoryTimeline, simulate_step
from adacc_compile.passes.depth_fold import FOLD_TRACE_BLOCKS, timeline_held_bytes
from adacc_compile.passes.plan_problem import (
    PlanProblem, PlanSolution, added_seconds, check_solution, repeated_held_bytes,
)
from adacc_compile.passes.policies import recompute_all_policy
from adacc_compile.passes.rewrite import saved_values_for, split_joint_graph
from adacc_compile.stage_runner import run_pipeline
from adacc_compile.state import PartitionState

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class GraphBreakBeforeLoss(RuntimeError):
    """The model's step is not one graph: Dynamo broke it before the loss,
    so the traced graph holds no backward to plan."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Traced:
    """One traced batch shape of a model."""

    joint: compat_tracing.CapturedJoint
    batch: int
    seq: int
    parameter_bytes: int
    trace_seconds: float
    block_parameter_bytes: int = 0
    """The largest block's parameter bytes (FSDP unshards a block at a
    time: `job_memory`)."""
    fold_copies: int = 0
    """Depth folding: blocks the model has beyond the traced ones (0: the
    whole model was traced)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One way of choosing saved values, simulated on the traced graph."""

    name: str
    saved_bytes: int
    activation_peak_bytes: int
    step_peak_bytes: int
    """The simulated step (activations, gradients, temporaries); parameters
    are graph inputs and not in it."""
    step_seconds: float
    timeline: MemoryTimeline


@dataclass(slots=True, kw_only=True)
class Preview:
    traced: Traced
    state: PartitionState
    """The adacc pipeline's state for the traced graph (plan, budget, split)."""
    strategies: list[Strategy]
    """adacc first, then the baselines."""
    plan_seconds: float
    compare_seconds: float

    @property
    def summary(self) -> dict[str, Any]:
        return self.state.report["summary"]

    @property
    def fits(self) -> bool:
        return bool(self.summary["fits_budget"]) and not self.summary["budget_clamped_to_minimum"]


@contextlib.contextmanager
def attention_as_on_a_gpu() -> Iterator[None]:
    """Inside: ``torch.nn.functional.scaled_dot_product_attention`` traces
    with ``dropout_p=0``, so the CPU picks its fused (flash) attention, whose
    saved values (output and log-sum-exp) are those of a GPU's flash
    attention with dropout, which draws its mask inside the kernel. With
    dropout the CPU would take the math path and save the b x h x s x s
    scores and mask: on the H200 check's GPT (seq 1024, 16 heads, batch 4)
    192 MiB per layer that the GPU never holds. The dropout's cost inside
    the kernel is left out. Reaches models that call the function through
    its module (``F.scaled_dot_product_attention``, as transformers does),
    not a name imported before the trace."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def fused(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        if "dropout_p" in kwargs:
            kwargs["dropout_p"] = 0.0
        return original(*args, **kwargs)

    functional.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def trace(
    source: ModelSource, *, batch: int, seq: int, dtype: torch.dtype, fold: bool = False,
    whole_ops: Sequence[Any] = (),
) -> Traced:
    """The model's joint graph at ``(batch, seq)`` token ids, built and traced
    under fake tensors in ``dtype``. With ``fold``, a model deeper than
    `FOLD_TRACE_BLOCKS` blocks is traced with that many and planned at its
    full depth (`depth_fold`), where its source can build it shallower.
    ``whole_ops``: the ops the plan's options keep whole
    (`partitioner.whole_ops`), so the joint graph is the one
    ``torch.compile`` would plan with those options."""
    copies = 0
    if fold and source.layers is not None and source.with_layers is not None and source.layers > FOLD_TRACE_BLOCKS:
        copies = source.layers - FOLD_TRACE_BLOCKS
        source = source.with_layers(FOLD_TRACE_BLOCKS)
    start = time.perf_counter()
    previous = torch.get_default_dtype()
    with compat_tracing.fake_tensors():
        torch.set_default_dtype(dtype)
        try:
            model = source.build()
        finally:
            torch.set_default_dtype(previous)
        ids = torch.zeros(batch, seq, dtype=torch.long)
        parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with attention_as_on_a_gpu():
        joint = compat_tracing.capture_joint_graph(model, (ids, ids), whole_ops=whole_ops)
    if not compat_tracing.joint_outputs_scalar(joint):
        raise GraphBreakBeforeLoss(
            f"{source.label}: Dynamo's first graph does not end in the loss (a graph break before it); "
            "adacc plan needs the step as one graph (TORCH_LOGS=graph_breaks shows where it breaks)"
        )
    per_block = _block_parameter_bytes(model)
    if copies:
        parameter_bytes = _deep_parameter_bytes(per_block, parameter_bytes, copies)
    return Traced(joint=joint, batch=batch, seq=seq, parameter_bytes=parameter_bytes,
                  trace_seconds=time.perf_counter() - start, fold_copies=copies,
                  block_parameter_bytes=max(per_block.values(), default=0))


def _block_parameter_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Parameter bytes of each block (a module path ending in an index)."""
    per_block: dict[str, int] = {}
    for name, p in model.named_parameters():
        match = re.search(r"^(.*?\.\d+)\.", name)
        if match:
            per_block[match.group(1)] = per_block.get(match.group(1), 0) + p.numel() * p.element_size()
    return per_block


def _deep_parameter_bytes(per_block: dict[str, int], traced_bytes: int, copies: int) -> int:
    """The deep model's parameter bytes: the traced ones plus ``copies``
    times those of one block (the middle block of the traced stack)."""
    blocks = sorted(per_block)
    return traced_bytes + copies * (per_block[blocks[len(blocks) // 2]] if blocks else 0)


def plan(traced: Traced, config: AdaccConfig) -> PartitionState:
    """adacc's whole pipeline on the traced joint graph (as `AdaccPartitioner`
    runs it, Inductor's fusion assumed), keeping the state."""
    return run_pipeline(_state(traced, config))


def _state(traced: Traced, config: AdaccConfig) -> PartitionState:
    joint = traced.joint
    return PartitionState(
        joint=joint.gm,
        config=config,
        num_fwd_outputs=int(joint.kwargs["num_fwd_outputs"]),
        static_lifetime_input_indices=list(joint.kwargs.get("static_lifetime_input_indices") or []),
        mode=Realization.INDUCTOR,
        fold_copies=traced.fold_copies,
    )


def preview(
    traced: Traced, config: AdaccConfig, *, on_phase: Callable[[str], None] = lambda _: None, fork: bool = False
) -> Preview:
    """Plans ``traced`` with adacc and simulates the baselines on the same
    graph; with ``fork`` (``adacc plan``, a fresh process) the baselines run
    in a forked child while the plan is solved (`forked`)."""
    start = time.perf_counter()
    on_phase("planning")
    state = _state(traced, config)
    run_pipeline(state, until="budget")
    # The baselines need the state up to the budget, not the plan: they are
    # simulated on a second core while the plan is solved (`forked`).
    work = lambda: baselines(state, base_seconds=0.0)  # noqa: E731
    pending = Forked(work) if fork else None
    run_pipeline(state, after="budget")
    planned = time.perf_counter()
    on_phase("comparing strategies")
    base = _base_seconds(state)
    simulated = pending.result() if pending is not None else work()
    others = [dataclasses.replace(s, step_seconds=base + s.step_seconds) for s in simulated]
    return Preview(traced=traced, state=state, strategies=[_adacc_strategy(state), *others],
                   plan_seconds=planned - start, compare_seconds=time.perf_counter() - planned)


def _adacc_strategy(state: PartitionState) -> Strategy:
    s = state.report["summary"]
    assert state.timeline is not None
    return Strategy(
        name=f"adacc ({state.config.accuracy})",
        saved_bytes=s["planned_saved_bytes"],
        activation_peak_bytes=s["predicted_activation_peak_bytes"],
        step_peak_bytes=s["predicted_peak_bytes"],
        step_seconds=s["estimated_step_seconds"] + s["estimated_added_seconds"],
        timeline=state.timeline,
    )


def baselines(state: PartitionState, *, base_seconds: float | None = None) -> list[Strategy]:
    """No checkpointing, full AC and PyTorch's budget partitioner, each split
    and simulated on the pipeline's joint graph (whose stages up to the
    budget have run). Step times are ``base_seconds`` (by default the
    report's roofline estimate of the step) plus each plan's added time; the
    budget ratio given to PyTorch's partitioner is of the requested budget."""
    if base_seconds is None:
        base_seconds = _base_seconds(state)
    assert state.candidates is not None and state.info is not None and state.budget is not None
    problem = state.candidates.problem
    default_saved = set(state.default_saved_names)
    ratio = state.budget.requested_bytes / max(state.budget.default_peak_bytes, 1)
    out = [
        _simulate_saved(state, "no checkpointing (Inductor default)", default_saved, base_seconds),
        _simulate_plan(state, "full AC (every block)", full_ac_plan(problem, default_saved), base_seconds),
    ]
    if ratio < 1.0:  # at 1 it is the default partitioner's own choice
        torch_saved = {n.name for n in compat.default_saved_values(state.joint, state.info, memory_budget=ratio)}
        out.append(_simulate_saved(state, f"PyTorch memory budget {ratio:.2f}", torch_saved, base_seconds))
    return out


def full_ac_plan(problem: PlanProblem, default_saved: set[str]) -> PlanSolution:
    """Activation checkpointing of every block: what lies in a block is
    recomputed (what flows between blocks cannot be, `structure`); outside
    the blocks the default partitioner's choice. Where that mix is not a
    legal plan, everything legal is recomputed."""
    everything = recompute_all_policy(problem, None)  # type: ignore[arg-type]
    outside = default_plan(problem, default_saved)
    if outside is None:
        return everything
    block_of = {c.name: c.block for c in problem.candidates}
    choices = {n: c for n, c in outside.choices.items() if not block_of.get(n)}
    choices.update({n: c for n, c in everything.choices.items() if block_of.get(n)})
    mixed = dataclasses.replace(everything, choices=choices)
    unbudgeted = dataclasses.replace(problem, budget_bytes=None, boundary_budget_bytes=None)
    return everything if check_solution(unbudgeted, mixed) else mixed


def _base_seconds(state: PartitionState) -> float:
    return float(state.report["summary"]["estimated_step_seconds"])


def _added(state: PartitionState, solution: PlanSolution | None) -> float:
    assert state.candidates is not None and state.budget is not None
    if solution is None:
        return 0.0
    return max(added_seconds(state.candidates.problem, solution) - state.budget.fastest_seconds, 0.0)


def _simulate_saved(state: PartitionState, name: str, saved: set[str], base_seconds: float) -> Strategy:
    """A saved set chosen by PyTorch: split as PyTorch splits it; its time
    from the same set as an adacc plan."""
    assert state.candidates is not None and state.info is not None
    nodes = [
        n for n in state.joint.graph.nodes
        if n.name in saved or (n in state.info.forward_nodes and (compat.is_primal(n) or compat.is_sym_node(n)))
    ]
    as_plan = default_plan(state.candidates.problem, saved)
    return _strategy(state, name, nodes, base_seconds + _added(state, as_plan), None)


def _simulate_plan(state: PartitionState, name: str, solution: PlanSolution, base_seconds: float) -> Strategy:
    assert state.candidates is not None and state.info is not None
    nodes = saved_values_for(state.joint, state.info, state.candidates, solution)
    held = repeated_held_bytes(state.candidates.problem, solution)
    return _strategy(state, name, nodes, base_seconds + _added(state, solution), held)


def _strategy(
    state: PartitionState, name: str, saved: list[fx.Node], step_seconds: float, held: int | None
) -> Strategy:
    """Splits and simulates one strategy; under depth folding its timeline is
    extended to the deep step's with what it holds of the repeated block
    (``held``; None: read off the timeline, for PyTorch's saved sets)."""
    assert state.info is not None
    with compat.lazy_graph_modules():
        fw, bw = split_joint_graph(state.joint, state.info, saved, num_fwd_outputs=state.num_fwd_outputs)
        timeline = simulate_step(
            fw, bw, num_fwd_outputs=state.num_fwd_outputs, forward_names=state.forward_names,
            mode=Realization.INDUCTOR,
        )
    if state.fold is not None:
        timeline = state.fold.extend(timeline, timeline_held_bytes(timeline, state.fold) if held is None else held)
    return Strategy(
        name=name,
        saved_bytes=timeline.saved_bytes,
        activation_peak_bytes=timeline.activation_peak_bytes,
        step_peak_bytes=timeline.peak_bytes,
        step_seconds=step_seconds,
        timeline=timeline,
    )

