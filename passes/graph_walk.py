"""Two walks over an FX graph that the passes running real values share.

Why: calibration (`calibrate`) and the gradient check
(`gradient_sensitivity`) both run parts of the joint graph on real tensors:
each needs the ancestors of what it wants computed, and the tensor a
``get_attr`` node names.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch.fx as fx


def ancestors(nodes: Iterable[fx.Node]) -> set[fx.Node]:
    """``nodes`` and every node they depend on."""
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


def get_attr(gm: fx.GraphModule, target: str) -> Any:
    """The attribute of ``gm`` a ``get_attr`` node's dotted ``target`` names."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
