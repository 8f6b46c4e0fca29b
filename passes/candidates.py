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
* compress: each codec whose ``applies`` check accepts the value (issue 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.fx as fx

from adacc_compile.compat import JointGraphInfo, is_sym_node, must_save

from .annotate import annotation
from .mutation import stale_reading
from .op_class import OpClass
from .plan_problem import Candidate, CompressOption, PlanProblem

_NEVER_RECOMPUTE = (OpClass.RANDOM, OpClass.DROPOUT, OpClass.COLLECTIVE)

CompressOptionsFn = Callable[[fx.Node], tuple[CompressOption, ...]]


@dataclass(frozen=True, slots=True)
class CandidateSet:
    problem: PlanProblem
    nodes: dict[str, fx.Node]
    """Candidate name -> joint-graph node."""


def find_candidates(
    gm: fx.GraphModule,
    info: JointGraphInfo,
    compress_options: CompressOptionsFn | None = None,
    *,
    allow_recompute: bool = True,
) -> CandidateSet:
    """Builds the plan problem (no budget yet) from an annotated joint graph.

    With ``allow_recompute=False`` only free recomputations (views) remain
    legal: the "compression alone" baseline."""
    forward = info.forward_nodes
    required = _read_by_backward(gm, info)
    needed = _upstream_forward_values(required, forward)
    order = [n for n in gm.graph.nodes if n in needed]
    stale = stale_reading([n for n in gm.graph.nodes if n in forward])
    candidates = []
    for node in order:
        ann = annotation(node)
        val = node.meta.get("val")
        inputs = tuple(dict.fromkeys(a.name for a in node.all_input_nodes if a in needed))
        candidates.append(
            Candidate(
                name=node.name,
                keep_bytes=ann.storage_bytes,
                recompute_seconds=ann.runtime_s,
                inputs=inputs,
                required=node in required,
                can_keep=isinstance(val, torch.Tensor) and not _view_of_keepable(node, needed),
                can_recompute=_recomputable(node)
                and node not in stale
                and (allow_recompute or ann.runtime_s == 0.0),
                compress=compress_options(node) if compress_options else (),
                block=ann.layer,
            )
        )
    return CandidateSet(
        problem=PlanProblem(candidates=tuple(candidates)),
        nodes={n.name: n for n in order},
    )


def _is_value(node: fx.Node) -> bool:
    return node.op == "call_function" and not is_sym_node(node)


def _read_by_backward(gm: fx.GraphModule, info: JointGraphInfo) -> set[fx.Node]:
    read = set()
    for node in gm.graph.nodes:
        if node in info.backward_nodes:
            read.update(a for a in node.all_input_nodes if a in info.forward_nodes and _is_value(a))
    return read


def _upstream_forward_values(seeds: Iterable[fx.Node], forward: frozenset[fx.Node]) -> set[fx.Node]:
    needed: set[fx.Node] = set()
    stack = list(seeds)
    while stack:
        node = stack.pop()
        if node in needed or node not in forward or not _is_value(node):
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
