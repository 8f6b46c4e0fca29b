"""`lifetimes.backward_base`: what the backward's own values (gradients)
hold at each backward position, the constants of the memory rows when the
budget bounds the whole step."""

from __future__ import annotations

import torch
import torch.fx as fx

from adacc_compile.compat import JointGraphInfo
from adacc_compile.passes.fusion import Realization
from adacc_compile.passes.lifetimes import backward_base, step_orders, tangents

aten = torch.ops.aten


def _joint():
    """Forward a = 2w, loss = sum(a); backward g1 = 3t (a temporary read
    twice), w_grad = g1 * a (returned), view = g1.view (no storage of its
    own), late = view + 1 (returned, made last)."""
    g = fx.Graph()

    def op(name, target, *args, numel):
        node = g.create_node("call_function", target, args, {}, name=name)
        node.meta["val"] = torch.empty(numel)
        return node

    w = g.placeholder("primals_1")
    t = g.placeholder("tangents_1")
    a = op("mul", aten.mul.Tensor, w, 2, numel=8)
    loss = op("loss", aten.sum.default, a, numel=1)
    g1 = op("mul_1", aten.mul.Tensor, t, 3, numel=4)
    w_grad = op("mul_2", aten.mul.Tensor, g1, a, numel=8)
    view = op("view", aten.view.default, g1, [2, 2], numel=4)
    late = op("add", aten.add.Tensor, view, 1, numel=2)
    g.output((loss, w_grad, late))
    gm = fx.GraphModule(torch.nn.Module(), g)
    nodes = {n.name: n for n in gm.graph.nodes}
    forward = frozenset({nodes["primals_1"], nodes["mul"], nodes["loss"]})
    backward = frozenset({nodes[k] for k in ("tangents_1", "mul_1", "mul_2", "view", "add")})
    info = JointGraphInfo(forward_nodes=forward, backward_nodes=backward, static_lifetime_input_nodes=None,
                          forward_needed=forward)
    return gm, info


def test_a_gradient_lives_to_its_last_reader_and_a_returned_one_to_the_end():
    gm, info = _joint()
    orders = step_orders(gm, info)
    assert [n.name for n in orders.backward] == ["mul_1", "mul_2", "view", "add"]
    # mul_1 (16 B) is read through its view by add, the last node; mul_2
    # (32 B) and add (8 B) are returned; the view owns nothing.
    assert backward_base(orders, Realization.EAGER) == (16, 48, 48, 56)



def test_a_tangent_lives_from_the_backwards_start_to_its_last_reader():
    """After a graph break a tangent is the gradient of an activation the
    next graph read (HF GPT-2's logits: 411 MB), not a scalar loss's."""
    gm, info = _joint()
    orders = step_orders(gm, info)
    (tangent,) = tangents(gm)
    tangent.meta["val"] = torch.empty(25)  # 100 B, read by mul_1 only (the first backward node)
    assert backward_base(orders, Realization.EAGER, [tangent]) == (116, 48, 48, 56)
    # Read again by the last node: alive throughout.
    add = next(n for n in gm.graph.nodes if n.name == "add")
    add.args = (add.args[0], tangent)
    assert backward_base(orders, Realization.EAGER, [tangent]) == (116, 148, 148, 156)
