"""Fusion: which values Inductor materialises, and what recomputing or
keeping a value really costs once it fuses.

Reads: ``node.meta["adacc"]`` (annotate pass), the nodes' users. Writes
nothing.

Why: Inductor fuses chains of pointwise ops into one kernel, so most
intermediate values of such a chain never exist in memory, and recomputing
one in the backward costs its consumer a few more input reads, not a kernel
of its own. A cost model that charges every recomputed op a full roofline
time plus a launch (and every temporary its bytes) holds far more than
Inductor's own partitioner, which exploits exactly this: at budget 0.7 adacc
once held 1.30x the default's memory on a Llama, and on a GPT-2 loss graph
the unfused simulation counted 720 MB of ``sub``/``exp`` values that
Inductor never materialises.

The rules (`Realization`):

* ``eager`` (the ``adacc_eager`` backend): every op runs on its own and
  materialises its output.
* ``inductor``: a pointwise op (``torch.Tag.pointwise``) whose consumers are
  all pointwise ops or reductions (looking through views) is fused into them
  and never materialised; anything else (matmuls, attention, reductions,
  norms, random ops, collectives, custom ops, indexing) produces a buffer,
  and a pointwise value read by such an op, directly or through a view, must
  be materialised too. Views never allocate. A value fused into the one op
  that reads it reads its own inputs where that op's kernel runs
  (`memory_sim`). This is a static approximation of Inductor's scheduler
  (it may still realise a pointwise value with many readers); two Inductor
  behaviours it cannot follow, buffer reuse and fusing the backward's
  recomputations with far kernels, are turned off for adacc's graphs
  (`compat.inductor_compile`, `mark_placed`).

Costs (seconds, on a `DeviceProfile`): keeping a value costs writing it in
the forward (unless it is materialised there anyway) and reading it back in
the backward; recomputing a fused value costs reading its inputs; recomputing
anything else costs its roofline time plus a launch. Values the forward
computes only for the backward (PyTorch's "unclaimed" nodes) run once either
way: computing them in the backward instead adds nothing.
"""

from __future__ import annotations

import enum
from typing import Iterable

import torch
import torch.fx as fx

from .annotate import META_KEY, annotation, input_bytes
from .compress_rewrite import DECOMPRESSED
from .device_profile import DeviceProfile
from .op_class import OpClass, classify, is_realize_op, is_view_op


class Realization(str, enum.Enum):
    EAGER = "eager"
    INDUCTOR = "inductor"


_FUSIBLE_CLASSES = (OpClass.ELEMENTWISE, OpClass.ACTIVATION, OpClass.MASK, OpClass.VIEW)


def _op_class(node: fx.Node) -> OpClass:
    ann = node.meta.get(META_KEY)
    return ann.op_class if ann is not None else classify(node)  # nodes a rewrite added


def is_pointwise(node: fx.Node) -> bool:
    """A pointwise op Inductor can fuse (views are handled separately)."""
    if node.op != "call_function":
        return False
    return torch.Tag.pointwise in getattr(node.target, "tags", ()) and _op_class(node) in _FUSIBLE_CLASSES


def absorbs_producer(node: fx.Node) -> bool:
    """True when ``node`` can take a pointwise producer into its own kernel
    (pointwise ops and reductions). A view passes the producer on to its
    own consumers, so it absorbs it only if all of them do: a pointwise
    value viewed and then read by a matmul is materialised (Inductor's
    ``mm`` reads a buffer), as the SiLU backward's product feeding the
    gate projection's weight gradient is."""
    if node.op != "call_function" or is_realize_op(node):
        return False  # `compat.realize_op` writes its input to a buffer
    if is_view_op(node):
        return all(c.op != "output" and absorbs_producer(c) for c in node.users)
    tags = getattr(node.target, "tags", ())
    return torch.Tag.pointwise in tags or _op_class(node) is OpClass.REDUCTION


def materialised(node: fx.Node, consumers: Iterable[fx.Node], mode: Realization) -> bool:
    """Does computing ``node`` (for ``consumers``) allocate its output?"""
    if node.op != "call_function" or is_view_op(node):
        return False
    if mode is Realization.EAGER or not is_pointwise(node):
        return True
    return not all(absorbs_producer(c) for c in consumers if c.op != "output") or any(
        c.op == "output" for c in consumers
    )


PLACED = "adacc_placed"
"""Meta key on the backward nodes the plan placed (`mark_placed`): Inductor
fuses them only with their neighbours (`compat.inductor_compile`)."""


def mark_placed(bw_module: fx.GraphModule, forward_names: set[str]) -> None:
    """Tags the backward nodes the plan placed: recomputations (a forward
    node's name in the backward) and decompressions. The memory model runs
    them where they stand; Inductor fusing one with a far kernel that merely
    shares an input would run it elsewhere, with its buffers."""
    for node in bw_module.graph.nodes:
        if node.op == "call_function" and (node.name in forward_names or DECOMPRESSED in node.meta):
            node.meta[PLACED] = True


def keep_seconds(node: fx.Node, *, realised_in_forward: bool, profile: DeviceProfile, mode: Realization) -> float:
    """Time keeping ``node`` adds: the forward writes it (if it would
    otherwise stay fused) and the backward reads it back."""
    if mode is Realization.EAGER or is_view_op(node):
        return 0.0
    nbytes = annotation(node).storage_bytes
    written = 0 if realised_in_forward else nbytes
    return (written + nbytes) / profile.memory_bytes_per_s


def recompute_seconds(
    node: fx.Node, *, forward_needed: bool, realised_in_backward: bool, profile: DeviceProfile, mode: Realization
) -> float:
    """Time recomputing ``node`` in the backward adds (see module docstring)."""
    ann = annotation(node)
    if is_view_op(node) or not forward_needed:
        return 0.0
    if mode is Realization.INDUCTOR and is_pointwise(node) and not realised_in_backward:
        return input_bytes(node) / profile.memory_bytes_per_s
    return ann.runtime_s
