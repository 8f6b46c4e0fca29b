"""A hand-written 1F1B step over point-to-point sends, with a hook between
posting the gradient receive and waiting on it.

`torch.distributed.pipelining.Schedule1F1B` runs compiled adacc stages
fine (the tests use it as the reference), but it posts each gradient
receive together with the previous forward's send and waits on both at
once inside private helpers; running work between "posted" and "waited"
there would delay that send, i.e. the next stage. This loop follows the
same action order as the simulator (`schedules.rank_actions`: warm-up
forwards, then one forward and one backward alternately, then the
cool-down backwards), sends asynchronously, and before each gradient wait
calls ``before_gradient_wait`` (`RecomputeAheadBackend.recompute_ahead`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from .schedules import rank_actions

FORWARD_TAG, BACKWARD_TAG = 0, 1


@dataclass(slots=True, kw_only=True)
class StepRecord:
    """What one rank did in one step (``time.time()`` stamps)."""

    losses: list[float] = field(default_factory=list)
    gradient_waits: list[tuple[int, float, float]] = field(default_factory=list)
    """(micro-batch, receive posted, receive completed)."""
    gradient_sends: list[tuple[int, float]] = field(default_factory=list)
    """(micro-batch, input gradient computed and its send posted)."""
    seconds: float = 0.0


def run_1f1b(
    stage: Callable[[torch.Tensor], torch.Tensor],
    *,
    rank: int,
    n_ranks: int,
    inputs: Sequence[torch.Tensor] | None,
    targets: Sequence[torch.Tensor] | None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    activation_shape: Sequence[int],
    activation_dtype: torch.dtype = torch.float32,
    n_microbatches: int,
    before_gradient_wait: Callable[[], Any] | None = None,
    group: Any = None,
) -> StepRecord:
    """One training step (forwards and backwards of every micro-batch,
    gradients accumulated in the stage's parameters). The first rank
    reads ``inputs[mb]``, the last ``targets[mb]``; the loss of each
    micro-batch is divided by ``n_microbatches`` so the accumulated
    gradients are those of the mean loss over the whole batch."""
    first, last = rank == 0, rank == n_ranks - 1
    record = StepRecord()
    stashed: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    sends: list[tuple[Any, torch.Tensor]] = []
    """Posted sends and their payloads (kept alive until completed)."""
    start = time.time()
    for action in rank_actions("1f1b", rank, n_ranks, n_microbatches):
        mb = action.microbatch
        if action.kind == "F":
            if first:
                x = inputs[mb]  # type: ignore[index]
                received = None
            else:
                received = torch.empty(activation_shape, dtype=activation_dtype)
                dist.recv(received, src=rank - 1, tag=FORWARD_TAG, group=group)
                received.requires_grad_(True)
                x = received
            out = stage(x)
            if last:
                out = loss_fn(out, targets[mb]) / n_microbatches  # type: ignore[index]
                record.losses.append(float(out.detach()) * n_microbatches)
            else:
                payload = out.detach()
                sends.append((dist.isend(payload, dst=rank + 1, tag=FORWARD_TAG, group=group), payload))
            stashed[mb] = (received, out)
        else:
            received, out = stashed.pop(mb)
            if last:
                if before_gradient_wait is not None:
                    before_gradient_wait()  # nothing to wait for; keeps the plans' order identical
                out.backward()
            else:
                grad = torch.empty_like(out)
                posted = time.time()
                work = dist.irecv(grad, src=rank + 1, tag=BACKWARD_TAG, group=group)
                if before_gradient_wait is not None:
                    before_gradient_wait()
                work.wait()
                record.gradient_waits.append((mb, posted, time.time()))
                out.backward(grad)
            if not first:
                assert received is not None and received.grad is not None
                record.gradient_sends.append((mb, time.time()))
                sends.append((dist.isend(received.grad, dst=rank - 1, tag=BACKWARD_TAG, group=group), received.grad))
            del out, received
    for work, _payload in sends:
        work.wait()
    record.seconds = time.time() - start
    return record
