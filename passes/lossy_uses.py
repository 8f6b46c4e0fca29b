"""Backward uses that amplify a lossy value's error: where a codec's bound
on the value is no bound on the gradients computed from it.

Why: a codec declares the relative error of the value it restores. The
gradients inherit that bound where the backward's use of the value is
linear in it and sums no cancelling terms (a matmul's saved input). Some
uses subtract two nearly equal terms built from the value, and then a small
relative error in the value becomes a large one in the gradient: the
attention backward's ``D = rowsum(dO * O)`` against ``dP`` (measured,
eagerly, on a GPT-2 whose attention was sharpened to near one-hot: the
output compressed with int8_outlier at 0.5% error gave 5-9% error in the
query and key gradients), and a softmax backward's ``out * (g - sum(g *
out))``. A value with such a use is offered lossless codecs only
(`codec_options.make_compress_options`).

The rule is data: an op, the argument that reads the value, and why. A
use that Inductor's decompositions break into pointwise ops before adacc
sees the graph is not recognised here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import torch.fx as fx

from .op_class import is_view_op


@dataclass(frozen=True, slots=True, kw_only=True)
class AmplifyingUse:
    op: str
    """The aten op (overload packet name) of the backward reader."""
    argument: str
    """The schema name of the argument that reads the value."""
    reason: str


_ATTENTION = (
    "the backward's rowsum(dO * O) cancels against dP where attention is sharp: O's error is amplified in "
    "the query and key gradients (0.35% -> 5-9% with int8_outlier, eagerly, near one-hot attention)"
)
_SOFTMAX = "the backward computes out * (g - sum(g * out)): the difference cancels where the softmax is sharp"

AMPLIFYING_USES: tuple[AmplifyingUse, ...] = (
    *(
        AmplifyingUse(op=op, argument="out", reason=_ATTENTION)
        for op in (
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward",
            "_flash_attention_backward",
            "_efficient_attention_backward",
        )
    ),
    AmplifyingUse(op="_softmax_backward_data", argument="output", reason=_SOFTMAX),
    AmplifyingUse(op="_log_softmax_backward_data", argument="output", reason=_SOFTMAX),
)

_BY_OP = {use.op: use for use in AMPLIFYING_USES}


def amplifying_use(node: fx.Node, backward: Collection[fx.Node]) -> AmplifyingUse | None:
    """The first use in ``AMPLIFYING_USES`` by which a node of ``backward``
    (a set) reads ``node``, directly or through views of it; None if none."""
    seen, stack = set(), [node]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        for user in value.users:
            if is_view_op(user):
                stack.append(user)
            if user not in backward or not hasattr(user.target, "_schema"):
                continue
            use = _BY_OP.get(user.target._schema.name.split("::")[-1])
            if use is not None and _reads_as(user, value, use.argument):
                return use
    return None


def _reads_as(user: fx.Node, value: fx.Node, argument: str) -> bool:
    names = [a.name for a in user.target._schema.arguments]
    if argument in user.kwargs:
        return user.kwargs[argument] is value
    return argument in names and names.index(argument) < len(user.args) and user.args[names.index(argument)] is value
