"""Which outputs the caller drops at the boundary (`passes.tangents`), and
that the simulator charges the tangents and frees those outputs."""

from __future__ import annotations

import torch
import torch.fx as fx

from adacc_compile.passes.tangents import dropped_outputs


def _outputs(*shapes):
    graph = fx.Graph()
    nodes = []
    for i, shape in enumerate(shapes):
        node = graph.placeholder(f"out_{i}")
        node.meta["val"] = torch.empty(shape)
        nodes.append(node)
    return nodes


def test_beside_a_scalar_loss_the_other_outputs_are_dropped():
    loss, logits = _outputs((), (4, 8, 16))
    assert dropped_outputs([loss, logits, None]) == [logits]


def test_without_a_scalar_output_every_output_is_kept():
    hidden, logits = _outputs((4, 8), (4, 8, 16))
    assert dropped_outputs([hidden, logits]) == []


def test_an_integer_scalar_is_not_a_loss():
    count = fx.Graph().placeholder("count")
    count.meta["val"] = torch.empty((), dtype=torch.int64)
    (logits,) = _outputs((4, 8, 16))
    assert dropped_outputs([count, logits]) == []
