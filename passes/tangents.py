"""Which of the backward's tangents (the gradients of the forward's
outputs) the step really allocates.

Why: a Hugging Face model trained with ``labels=`` returns its loss and its
logits; ``loss.backward()`` gives the loss a scalar gradient and the logits
none, and AOTAutograd's backward then allocates nothing for the logits'
tangent (measured: an HF Llama's step under full AC's plan peaked 526,336
bytes, one logits buffer, under the simulation that charged it; at vocab
32k, seq 4096, batch 8 in bf16 that buffer is 2 GiB). So where a graph
returns a scalar loss, the gradients of its other outputs are taken as
never materialised. A graph with no scalar output (a body before a graph
break, logits whose loss is taken outside) keeps every tangent charged:
its outputs' gradients come from code adacc does not see. Where that guess
is wrong (a second loss term on an output beside the scalar one), a step
budget's measured first step corrects the plan (`adacc_compile.step_measure`).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.fx as fx


def _scalar(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point()


def charged_tangents(tangents: Iterable[fx.Node]) -> list[fx.Node]:
    """The tangents the step allocates: all of them, or, beside a scalar
    loss's tangent, that one alone."""
    tangents = list(tangents)
    scalars = [t for t in tangents if _scalar(t)]
    return scalars if scalars else tangents
