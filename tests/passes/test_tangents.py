"""Which tangents the step allocates (`passes.tangents`)."""

from __future__ import annotations

import torch
import torch.fx as fx

from adacc_compile.passes.tangents import charged_tangents


def _tangents(*shapes):
    graph = fx.Graph()
    nodes = []
    for i, shape in enumerate(shapes):
        node = graph.placeholder(f"tangents_{i + 1}")
        node.meta["val"] = torch.empty(shape)
        nodes.append(node)
    return nodes


def test_beside_a_scalar_loss_only_its_tangent_is_allocated():
    loss, logits = _tangents((), (4, 8, 16))
    assert charged_tangents([loss, logits]) == [loss]


def test_without_a_scalar_output_every_tangent_is_allocated():
    hidden, logits = _tangents((4, 8), (4, 8, 16))
    assert charged_tangents([hidden, logits]) == [hidden, logits]
