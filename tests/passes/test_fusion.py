"""Which values the Inductor realization counts as materialised."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile.passes.fusion import Realization, materialised


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def _product_then(reader):
    def fn(x, y, w):
        h = x * y  # pointwise
        return reader(h.view(64, 32), w)

    return make_fx(fn, tracing_mode="fake")(torch.randn(32, 64), torch.randn(32, 64), torch.randn(32, 8))


def test_pointwise_read_by_a_matmul_through_a_view_is_materialised():
    # Inductor's mm reads a buffer: the product is written out even though
    # the matmul sees it only through a view (the SiLU backward's product
    # feeding a weight gradient in a Llama MLP).
    gm = _product_then(lambda v, w: v.t() @ v)
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert materialised(mul, mul.users, Realization.INDUCTOR)


def test_pointwise_read_by_pointwise_through_a_view_stays_fused():
    gm = _product_then(lambda v, w: (v * 2).sum())
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert not materialised(mul, mul.users, Realization.INDUCTOR)
    assert materialised(mul, mul.users, Realization.EAGER)


def test_pointwise_returned_through_a_view_is_materialised():
    gm = _product_then(lambda v, w: v.t())
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert materialised(mul, mul.users, Realization.INDUCTOR)
