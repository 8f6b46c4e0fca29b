"""Op classes: the coarse kind of an FX node, which decides what is legal.

Recomputation legality (random ops, collectives) and codec applicability
(linear inputs, softmax probabilities, masks, activation inputs) are both
decided by op class, so classification lives in one small rule table
(tinygrad style: rules as data) instead of if-chains spread over passes.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import torch
import torch.fx as fx


class OpClass(str, enum.Enum):
    MATMUL = "matmul"
    ATTENTION = "attention"
    NORM = "norm"
    ACTIVATION = "activation"
    SOFTMAX = "softmax"
    MASK = "mask"
    DROPOUT = "dropout"
    RANDOM = "random"
    COLLECTIVE = "collective"
    VIEW = "view"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    PLACEHOLDER = "placeholder"
    OUTPUT = "output"
    OTHER = "other"


# Rules by op-packet name (``aten.mm``), tried in order.
_NAME_RULES: tuple[tuple[OpClass, frozenset[str]], ...] = (
    (OpClass.DROPOUT, frozenset({"native_dropout", "dropout", "native_dropout_backward"})),
    (
        OpClass.ATTENTION,
        frozenset(
            {
                "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_cudnn_attention",
                "_scaled_dot_product_flash_attention_for_cpu",
                "_scaled_dot_product_attention_math",
                "scaled_dot_product_attention",
                "_flash_attention_forward",
                "_efficient_attention_forward",
            }
        ),
    ),
    (
        OpClass.MATMUL,
        frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "convolution", "_scaled_mm"}),
    ),
    (
        OpClass.NORM,
        frozenset(
            {
                "native_layer_norm",
                "layer_norm",
                "rms_norm",
                "_fused_rms_norm",
                "native_batch_norm",
                "_native_batch_norm_legit_functional",
                "native_group_norm",
            }
        ),
    ),
    (
        OpClass.ACTIVATION,
        frozenset(
            {"gelu", "silu", "relu", "tanh", "sigmoid", "elu", "leaky_relu", "hardswish", "mish", "softplus"}
        ),
    ),
    # _safe_softmax: what scaled_dot_product_attention decomposes to (rows
    # that are all masked give 0, not NaN; still probabilities in [0, 1]).
    (OpClass.SOFTMAX, frozenset({"_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax"})),
    (
        OpClass.REDUCTION,
        frozenset({"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "prod", "argmax"}),
    ),
)

_MASK_DTYPES = (torch.bool,)


def op_name(node: fx.Node) -> str:
    """``aten.mm`` style name of a call_function node's op packet."""
    try:
        return _target_name(node.target)
    except TypeError:  # an unhashable target
        return _target_name.__wrapped__(node.target)


def is_view_op(node: fx.Node) -> bool:
    """True when the node's output aliases its first input's storage."""
    if node.op != "call_function":
        return False
    try:
        return _target_is_view(node.target)
    except TypeError:  # an unhashable target
        return _target_is_view.__wrapped__(node.target)


REALIZE_OP = "prims.inductor_force_stride_order"
"""`compat_inductor.realize_op`'s name: an alias of its input in eager, and under
Inductor the one buffer the input is written to (`fusion.absorbs_producer`)."""


def is_realize_op(node: fx.Node) -> bool:
    return node.op == "call_function" and _target_name(node.target) == REALIZE_OP


@functools.lru_cache(maxsize=4096)
def _target_name(target: Any) -> str:
    # Cached per op: formatting an overload packet's name is the slowest
    # part of classifying a 32-layer joint graph node by node.
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return str(packet).removeprefix("torch.ops.")
    return getattr(target, "__name__", str(target))


@functools.lru_cache(maxsize=4096)
def _target_is_view(target: Any) -> bool:
    if target.__module__ == "_operator" and getattr(target, "__name__", "") == "getitem":
        return True
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    if _target_name(target) in ("aten._unsafe_view", "aten.alias"):
        return True
    if _target_name(target) == REALIZE_OP:
        return True  # shares its input's storage (`is_realize_op`)
    returns = schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def classify(node: fx.Node) -> OpClass:
    """The op class of ``node`` (see module docstring)."""
    if node.op == "placeholder":
        return OpClass.PLACEHOLDER
    if node.op == "output":
        return OpClass.OUTPUT
    if node.op != "call_function":
        return OpClass.OTHER
    name = op_name(node)
    namespace, _, short = name.rpartition(".")
    if namespace in ("_c10d_functional", "c10d_functional", "_dtensor") or short == "wait_tensor":
        return OpClass.COLLECTIVE
    target = node.target
    tags = getattr(target, "tags", ())
    for op_class, names in _NAME_RULES[:2]:
        if short in names:
            if op_class is OpClass.ATTENTION and _dropout_p(node) > 0:
                return OpClass.RANDOM
            return op_class
    if torch.Tag.nondeterministic_seeded in tags:
        return OpClass.RANDOM
    if is_view_op(node):
        return OpClass.VIEW
    for op_class, names in _NAME_RULES[2:]:
        if short in names:
            return op_class
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype in _MASK_DTYPES:
        return OpClass.MASK
    if torch.Tag.pointwise in tags:
        return OpClass.ELEMENTWISE
    return OpClass.OTHER


def _dropout_p(node: fx.Node) -> float:
    """The ``dropout_p`` argument of an attention op (0.0 when absent)."""
    if "dropout_p" in node.kwargs:
        return float(node.kwargs["dropout_p"])
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return 0.0
    for index, arg in enumerate(schema.arguments):
        if arg.name == "dropout_p" and index < len(node.args):
            value = node.args[index]
            return float(value) if isinstance(value, (int, float)) else 1.0
    return 0.0
