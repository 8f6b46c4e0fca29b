"""Candidates pass: which forward values the backward may need, and how.

Reads: ``node.meta["adacc"]`` (annotate pass), the forward/backward split.
Writes: nothing on the graph; returns a `PlanProblem` and the map from
candidate names back to nodes.

A candidate is every forward value that the backward reads directly
(``required``) and every forward value upstream of one (it may be needed by
a recompute chain). Legality per value:

* keep: any single tensor (a multi-output node's tuple cannot be saved; its
  ``getitem`` outputs can), except views of a keepable candidate (keeping
  the base instead is never worse);
* recompute: not for random ops (no RNG replay here), collectives, effectful
  ops, values PyTorch tagged "must save", or values that read an input the
  forward writes in place afterwards (`mutation.stale_reading`: the
  recomputation would see the new contents);
* compress: each codec whose ``applies`` check accepts the value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.compat import JointGraphInfo, is_sym_node, must_save

from .annotate import annotation, tensor_bytes
from .device_profile import DeviceProfile
from .fusion import Realization, keep_seconds, recompute_seconds
from .lifetimes import candidate_lifetime, step_layout, step_orders
from .mutation import stale_reading
from .op_class import OpClass, is_view_op
from .plan_problem import Candidate, CompressOption, PlanProblem

_NEVER_RECOMPUTE = (OpClass.RANDOM, OpClass.DROPOUT, OpClass.COLLECTIVE)

CompressOptionsFn = Callable[[fx.Node], tuple[CompressOption, ...]]


@dataclass(frozen=True, slots=True)
class CandidateSet:
    problem: PlanProblem
    nodes: dict[str, fx.Node]
    """Candidate name -> joint-graph node."""


def with_step_constants(candidates: CandidateSet, *, forward: int = 0, backward: int = 0) -> CandidateSet:
    """``candidates`` with ``forward`` more bytes alive at every forward
    position and ``backward`` more at every backward position of a step
    budget's layout (constants of the rows): what other graphs of the step
    hold through this one (`adacc_compile.step_ledger`)."""
    layout = candidates.problem.layout
    if layout is None or not layout.backward_base or not (forward or backward):
        return candidates
    layout = dataclasses.replace(
        layout,
        forward_base=tuple(b + forward for b in layout.forward_base),
        backward_base=tuple(b + backward for b in layout.backward_base),
    )
    return dataclasses.replace(candidates, problem=dataclasses.replace(candidates.problem, layout=layout))


def find_candidates(
    gm: fx.GraphModule,
    info: JointGraphInfo,
    compress_options: CompressOptionsFn | None = None,
    *,
    allow_recompute: bool = True,
    profile: DeviceProfile | None = None,
    mode: Realization = Realization.EAGER,
    num_fwd_outputs: int | None = None,
    step_budget: bool = False,
) -> CandidateSet:
    """Builds the plan problem (no budget yet) from an annotated joint graph.

    With ``allow_recompute=False`` only free recomputations (views, and
    values only the backward reads, computed there instead) remain legal:
    the "compression alone" baseline. With a ``profile``, costs follow
    `fusion` (keeping costs its writes and reads, fused recomputation its
    input reads) and every candidate gets its `Lifetime`, the problem its
    `StepLayout` (for the peak model; with ``step_budget`` it also holds
    the backward's own bytes, `lifetimes.backward_base`)."""
    forward = info.forward_nodes
    inputs_to_charge = _activation_inputs(gm, info)
    required = _read_by_backward(gm, info, inputs_to_charge)
    needed = _upstream_forward_values(required, forward, inputs_to_charge)
    order = [n for n in gm.graph.nodes if n in needed]
    stale = stale_reading([n for n in gm.graph.nodes if n in forward])
    orders = step_orders(gm, info) if profile is not None else None
    outputs = _forward_outputs(gm, num_fwd_outputs)
    candidates = []
    for node in order:
        ann = annotation(node)
        val = node.meta.get("val")
        placeholder = node.op == "placeholder"
        forward_needed = node in info.forward_needed or placeholder
        lifetime = None
        keep_s, recompute_s = 0.0, ann.runtime_s
        if orders is not None:
            assert profile is not None
            lifetime = candidate_lifetime(node, info, orders, mode, outputs)
            if not placeholder:
                keep_s = keep_seconds(node, realised_in_forward=lifetime.forward_bytes > 0, profile=profile, mode=mode)
                recompute_s = recompute_seconds(
                    node, forward_needed=forward_needed, realised_in_backward=lifetime.backward_bytes > 0,
                    profile=profile, mode=mode,
                )
        free = is_view_op(node) or not forward_needed
        candidates.append(
            Candidate(
                name=node.name,
                keep_bytes=ann.storage_bytes if not placeholder else tensor_bytes(val),
                recompute_seconds=0.0 if free else recompute_s,
                keep_seconds=keep_s,
                inputs=tuple(dict.fromkeys(a.name for a in node.all_input_nodes if a in needed)),
                required=node in required,
                can_keep=isinstance(val, torch.Tensor) and not _view_of_keepable(node, needed),
                can_recompute=not placeholder
                and _recomputable(node)
                and node not in stale
                and (allow_recompute or free),
                compress=compress_options(node) if compress_options and not placeholder else (),
                block=ann.layer,
                lifetime=lifetime,
            )
        )
    layout = None
    if orders is not None:
        layout = step_layout(gm, info, orders, order, mode, outputs, with_backward_base=step_budget)
    return CandidateSet(
        problem=PlanProblem(candidates=tuple(candidates), layout=layout),
        nodes={n.name: n for n in order},
    )


def _is_value(node: fx.Node) -> bool:
    return node.op == "call_function" and not is_sym_node(node)


def _activation_inputs(gm: fx.GraphModule, info: JointGraphInfo) -> set[fx.Node]:
    """Graph inputs whose bytes a plan holds when it saves them: tensors that
    are not parameters or buffers (those live anyway). An activation handed
    over by an earlier graph (the logits a separate loss graph receives) is
    one; saving it keeps it alive through the backward."""
    static = set(info.static_lifetime_input_nodes or ())
    return {
        n for n in gm.graph.nodes
        if compat.is_primal(n) and n not in static and isinstance(n.meta.get("val"), torch.Tensor)
    }


def _forward_outputs(gm: fx.GraphModule, num_fwd_outputs: int | None) -> set[fx.Node]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    if num_fwd_outputs is not None:
        flat = flat[:num_fwd_outputs]
    return {n for n in flat if isinstance(n, fx.Node)}


def _read_by_backward(gm: fx.GraphModule, info: JointGraphInfo, inputs: set[fx.Node]) -> set[fx.Node]:
    """Forward values (and charged inputs) a backward node reads. The output
    node is not a reader: returning a forward output saves nothing."""
    read = set()
    for node in gm.graph.nodes:
        if node in info.backward_nodes and node.op != "output":
            read.update(
                a for a in node.all_input_nodes if a in info.forward_nodes and (_is_value(a) or a in inputs)
            )
    return read


def _upstream_forward_values(
    seeds: Iterable[fx.Node], forward: frozenset[fx.Node], inputs: set[fx.Node]
) -> set[fx.Node]:
    needed: set[fx.Node] = set()
    stack = list(seeds)
    while stack:
        node = stack.pop()
        if node in needed or node not in forward or not (_is_value(node) or node in inputs):
            continue
        needed.add(node)
        stack.extend(node.all_input_nodes)
    return needed


def _view_of_keepable(node: fx.Node, needed: set[fx.Node]) -> bool:
    """Keeping a view costs its base's storage, and recomputing it from the
    base is free, so keeping the base instead is never worse: offering
    "keep" for such views only adds symmetric alternatives to the MILP."""
    if annotation(node).op_class is not OpClass.VIEW or not node.args:
        return False
    base = node.args[0]
    if not isinstance(base, fx.Node) or base not in needed:
        return False
    if not isinstance(base.meta.get("val"), torch.Tensor) or not _recomputable(node):
        return False
    return annotation(base).storage_bytes <= annotation(node).storage_bytes


def _recomputable(node: fx.Node) -> bool:
    ann = annotation(node)
    if ann.op_class in _NEVER_RECOMPUTE or must_save(node):
        return False
    target = node.target
    if getattr(target, "is_view", False):
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return False
    return True
