"""What the passes running parts of the joint graph on real values share.

Why: calibration (`calibrate`) and the gradient check
(`gradient_sensitivity`) both run parts of the joint graph on real tensors:
each needs the ancestors of what it wants computed, the tensor a
``get_attr`` node names, and a run whose random ops draw the same values
in every process and leave the caller's generators as they were.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat


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


@contextlib.contextmanager
def seeded_real_run(real_inputs: Sequence[Any], seed: int) -> Iterator[None]:
    """Real tensors, no autograd, and every generator the inputs' devices
    use forked and seeded with ``seed``: the run's random ops (dropout)
    draw the same values on every rank and in every process, and the
    caller's random state is untouched."""
    devices = sorted({t.device.index or 0 for t in real_inputs if isinstance(t, torch.Tensor) and t.is_cuda})
    with compat.real_tensors(), torch.no_grad(), torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        for index in devices:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield
