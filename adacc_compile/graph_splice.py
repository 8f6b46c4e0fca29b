"""Copying a traced graph's nodes into another graph.

Why one helper: two rewrites insert small traced aten graphs into the
graph they rewrite, the codecs' compress and decompress forms
(`passes.compress_rewrite`) and the decompositions of ops Inductor would
otherwise run whole (`compat_inductor.decompose_whole_ops`). Both bind the traced
graph's placeholders to existing nodes, copy its calls in order with their
fake values, and read its outputs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch.fx as fx


def traced_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes a traced graph returns, in order."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out.args[0]
    return list(flat) if isinstance(flat, (list, tuple)) else [flat]


def splice_graph(
    graph: fx.Graph,
    traced: fx.GraphModule,
    inputs: Sequence[fx.Node],
    before: fx.Node,
    *,
    name: Callable[[int], str],
    meta: Mapping[str, Any] | None = None,
) -> list[fx.Node]:
    """Copies the calls of ``traced`` into ``graph`` right before ``before``,
    its placeholders bound to ``inputs``; returns the nodes it outputs.

    The copies keep their fake values (``meta["val"]``: traced under the
    same fake mode), take ``meta`` besides, and the i-th is named
    ``name(i)``. A count of placeholders other than ``len(inputs)`` is a
    ``ValueError``."""
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise ValueError(f"the traced graph takes {len(placeholders)} inputs, given {len(inputs)}")
    env: dict[fx.Node, fx.Node] = dict(zip(placeholders, inputs))
    with graph.inserting_before(before):
        for index, node in enumerate(n for n in traced.graph.nodes if n.op == "call_function"):
            copy = graph.create_node(
                "call_function", node.target, fx.map_arg(node.args, env.__getitem__),
                fx.map_arg(node.kwargs, env.__getitem__), name=name(index),
            )
            copy.meta.update(meta or {})
            copy.meta["val"] = node.meta.get("val")
            env[node] = copy
    return [env[n] for n in traced_outputs(traced)]
