"""Per-layer costs of a pipeline stage, from adacc's own passes.

Partitioning a model into pipeline stages needs, for each layer, how long
its forward and backward take and how many bytes of activations one
micro-batch leaves saved at each plan the stage could use (keep everything,
adacc at a few budgets, recompute everything), with the recomputation time
each plan adds. Measuring that on the device would mean building the model;
instead one layer is traced under fake tensors (as `plan_preview` does for a
whole model), annotated with a `DeviceProfile` roofline, and planned by the
adacc pipeline at each level. The numbers are therefore the planner's own:
a stage partitioned with them is planned, at run time, by the same passes.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn as nn

from adacc_compile import compat_tracing
from adacc_compile.config import AdaccConfig
from adacc_compile.passes.annotate import annotation
from adacc_compile.passes.fusion import Realization
from adacc_compile.stage_runner import run_pipeline
from adacc_compile.state import PartitionState


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanLevel:
    """One way of planning a layer's saved activations."""

    name: str
    """"keep all", "adacc 0.6", "recompute all", ..."""
    saved_bytes: int
    """Bytes one micro-batch leaves saved for the backward."""
    recompute_seconds: float
    """Time the plan adds to the backward (recomputation), on the profile."""
    working_bytes: int = 0
    """Transient bytes while this layer's backward runs, beyond what is
    saved (recomputed values and their gradients): held for one layer at a
    time, so a stage pays the largest of its layers' once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """What the partitioner knows about one layer."""

    name: str
    forward_seconds: float
    backward_seconds: float
    """Without recomputation (that is in the chosen `PlanLevel`)."""
    levels: tuple[PlanLevel, ...]
    """Pareto-sorted: more saved bytes, less recomputation."""
    static_bytes: int = 0
    """Parameters, gradients and optimizer state the stage holding this
    layer keeps whatever the plan."""
    boundary_bytes: int = 0
    """Bytes of the layer's output: what a stage ending here sends to the
    next one (and receives back as the gradient)."""
    trace_seconds: float = 0.0
    plan_seconds: float = 0.0

    def renamed(self, name: str) -> "LayerCost":
        return LayerCost(
            name=name, forward_seconds=self.forward_seconds, backward_seconds=self.backward_seconds,
            levels=self.levels, static_bytes=self.static_bytes, boundary_bytes=self.boundary_bytes,
            trace_seconds=self.trace_seconds, plan_seconds=self.plan_seconds,
        )


DEFAULT_RATIOS = (1.0, 0.6, 0.35)
"""adacc budgets (ratios of the default partitioner's activation peak) that
give the levels between keeping and recomputing everything."""


class _SumOutput(nn.Module):
    """The layer with its output summed: a scalar to differentiate, whose
    backward (an expand) adds nothing to plan."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.layer(*inputs)
        return out if out.dim() == 0 else out.float().sum()


@dataclass(slots=True, kw_only=True)
class LayerTrace:
    """One layer's joint graph, traced under fake tensors."""

    joint: compat_tracing.CapturedJoint
    parameter_count: int
    output_bytes: int
    seconds: float


def trace_layer(
    build: Callable[[], nn.Module], inputs: Callable[[], Sequence[torch.Tensor]], *, dtype: torch.dtype
) -> LayerTrace:
    """Builds ``build()`` and its ``inputs()`` under fake tensors in ``dtype``
    and traces the joint graph of the summed output (nothing allocated)."""
    start = time.perf_counter()
    previous = torch.get_default_dtype()
    with compat_tracing.fake_tensors():
        torch.set_default_dtype(dtype)
        try:
            layer = build()
            args = tuple(inputs())
        finally:
            torch.set_default_dtype(previous)
        parameter_count = sum(p.numel() for p in layer.parameters())
        out = layer(*args)
        output_bytes = out.numel() * out.element_size()
    joint = compat_tracing.capture_joint_graph(_SumOutput(layer), args)
    return LayerTrace(joint=joint, parameter_count=parameter_count, output_bytes=output_bytes,
                      seconds=time.perf_counter() - start)


def _plan(traced: LayerTrace, options: dict) -> PartitionState:
    joint = traced.joint
    state = PartitionState(
        joint=joint.gm,
        config=AdaccConfig.from_options(options),
        num_fwd_outputs=int(joint.kwargs["num_fwd_outputs"]),
        static_lifetime_input_indices=list(joint.kwargs.get("static_lifetime_input_indices") or []),
        mode=Realization.INDUCTOR,
    )
    with warnings.catch_warnings():
        # A budget below the layer's reachable minimum gives the minimum-peak
        # plan: one more level, not an error.
        warnings.simplefilter("ignore")
        return run_pipeline(state)


def _side_seconds(state: PartitionState, side: str) -> float:
    return sum(
        annotation(n).runtime_s for n in state.joint.graph.nodes
        if n.op == "call_function" and annotation(n).side == side
    )


def pareto(levels: Sequence[PlanLevel]) -> tuple[PlanLevel, ...]:
    """Levels no other level beats on both saved bytes and recomputation,
    most bytes first (a dominated level can never be the partitioner's
    choice, and fewer levels keep its search small)."""
    ordered = sorted(levels, key=lambda lv: (-lv.saved_bytes, lv.recompute_seconds))
    out: list[PlanLevel] = []
    for level in ordered:
        if any(o.recompute_seconds <= level.recompute_seconds and o.saved_bytes <= level.saved_bytes
               for o in out):
            continue
        out = [o for o in out if not (level.saved_bytes <= o.saved_bytes and level.recompute_seconds <= o.recompute_seconds)]
        out.append(level)
    return tuple(sorted(out, key=lambda lv: -lv.saved_bytes))


@dataclass(frozen=True, slots=True, kw_only=True)
class CostOptions:
    """How a layer is costed."""

    device_profile: str = "h100"
    """A built-in `DeviceProfile` name (or "cpu": measured on this machine)."""
    ratios: tuple[float, ...] = DEFAULT_RATIOS
    accuracy: str = "lossless"
    state_bytes_per_parameter: int = 16
    """Weights, gradients and Adam state per parameter (mixed precision:
    2 + 2 + 12 bytes)."""
    extra_options: dict = field(default_factory=dict)


def layer_cost(
    name: str,
    build: Callable[[], nn.Module],
    inputs: Callable[[], Sequence[torch.Tensor]],
    *,
    dtype: torch.dtype = torch.bfloat16,
    options: CostOptions = CostOptions(),
) -> LayerCost:
    """Traces one layer and plans it at every level: keep all
    (``planner="keep_all"``), adacc's MILP at ``options.ratios``, recompute
    all (``planner="recompute_all"``). Forward and backward seconds are the
    annotate pass's roofline sums over the joint graph's two sides."""
    traced = trace_layer(build, inputs, dtype=dtype)
    base = {"device_profile": options.device_profile, "accuracy": options.accuracy,
            "calibrate_codecs": False, **options.extra_options}
    runs = [("keep all", {"planner": "keep_all"}),
            *[(f"adacc {r:g}", {"memory_budget": r}) for r in options.ratios],
            ("recompute all", {"planner": "recompute_all"})]
    start = time.perf_counter()
    levels = []
    forward = backward = 0.0
    fastest = None
    for label, extra in runs:
        state = _plan(traced, {**base, **extra})
        summary = state.report["summary"]
        if fastest is None:
            forward, backward = _side_seconds(state, "forward"), _side_seconds(state, "backward")
        added = float(summary["estimated_added_seconds"])
        fastest = added if fastest is None else min(fastest, added)
        saved = int(summary["planned_saved_bytes"])
        levels.append(PlanLevel(
            name=label, saved_bytes=saved, recompute_seconds=added,
            working_bytes=max(int(summary["predicted_activation_peak_bytes"]) - saved, 0),
        ))
    # Added time is relative to the keep-all plan's (free view recomputation
    # and the like are part of the backward, not of any choice).
    assert fastest is not None
    levels = [PlanLevel(name=lv.name, saved_bytes=lv.saved_bytes, working_bytes=lv.working_bytes,
                        recompute_seconds=max(lv.recompute_seconds - fastest, 0.0)) for lv in levels]
    return LayerCost(
        name=name, forward_seconds=forward, backward_seconds=backward, levels=pareto(levels),
        static_bytes=traced.parameter_count * options.state_bytes_per_parameter,
        boundary_bytes=traced.output_bytes, trace_seconds=traced.seconds,
        plan_seconds=time.perf_counter() - start,
    )


def fuse(first: LayerCost, second: LayerCost, name: str | None = None) -> LayerCost:
    """Two consecutive layers as one unit the partitioner never splits
    (the embedding with the first block, the last block with the head):
    times and bytes add up, levels are every pairing (Pareto-pruned), and
    the working set is the larger one (their backwards run one after the
    other)."""
    levels = [
        PlanLevel(name=f"{a.name} + {b.name}", saved_bytes=a.saved_bytes + b.saved_bytes,
                  recompute_seconds=a.recompute_seconds + b.recompute_seconds,
                  working_bytes=max(a.working_bytes, b.working_bytes))
        for a in first.levels for b in second.levels
    ]
    return LayerCost(
        name=name or f"{first.name}+{second.name}",
        forward_seconds=first.forward_seconds + second.forward_seconds,
        backward_seconds=first.backward_seconds + second.backward_seconds,
        levels=pareto(levels), static_bytes=first.static_bytes + second.static_bytes,
        boundary_bytes=second.boundary_bytes, trace_seconds=first.trace_seconds + second.trace_seconds,
        plan_seconds=first.plan_seconds + second.plan_seconds,
    )
