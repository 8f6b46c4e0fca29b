"""What the caller keeps of the forward's outputs during the backward, and
which of their gradients (the backward's tangents) the step allocates.

Why: a Hugging Face model trained with ``labels=`` returns its loss and its
logits. Measured on an HF Llama's step (allocator trace per aten op, full
AC's plan, vocab 512):

* ``loss.backward()`` gives the loss a scalar gradient and the logits none,
  and autograd materialises zeros for the logits' gradient: the tangent is
  a dense logits-sized buffer from the backward's start to its last reader
  (the ``add`` that sums it into the logits' gradient). So every tangent is
  charged.
* A training loop keeps the loss, not the logits (Hugging Face's Trainer
  returns the loss from ``compute_loss``; torchtitan deletes ``pred``
  before the backward): beside a scalar loss, the other outputs are
  dropped at the boundary. The simulation once held them through the
  backward and left their tangent out, which cancelled up to the tangent's
  last reader and over-counted one logits buffer after it (526,332 bytes
  over the measured peak of full AC's plan, whose peak lies in a block's
  backward). A graph with no scalar output (a body before a graph break,
  logits whose loss is taken outside) hands its outputs to code adacc does
  not see, and they stay held.

A caller that keeps the logits through the backward (``out =
model(...)``; ``out.loss.backward()``) holds one logits buffer more than
this predicts; under a step budget the measured first step corrects the
plan (`adacc_compile.step_measure`).
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.fx as fx


def _scalar(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point()


def dropped_outputs(outputs: Iterable[fx.Node | None]) -> list[fx.Node]:
    """The forward's user outputs the caller drops at the boundary: beside
    a scalar loss, every other output; without one, none."""
    outputs = [o for o in outputs if isinstance(o, fx.Node)]
    if not any(_scalar(o) for o in outputs):
        return []
    return [o for o in outputs if not _scalar(o)]
