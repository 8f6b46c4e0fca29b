"""Step time of a pipeline schedule, by replaying its actions.

Each rank runs its `schedules.rank_actions` in order; an action starts when
the rank is free and its inputs exist: a forward needs the previous
virtual stage's forward of the same micro-batch plus one point-to-point
transfer, a backward needs the next virtual stage's backward plus one
transfer. Transfers are asynchronous (a separate stream or thread), so
they delay the receiver but do not occupy the sender.

Recomputation is placed two ways:

* **on demand**: the backward recomputes what it needs when it starts, so
  recomputation sits on the chain of gradient dependencies;
* **ahead**: a recompute action precedes each backward on its rank and
  needs no gradient, so it runs while the rank waits for the gradient
  receive; the backward then waits for both. Work per micro-batch is the
  same; what changes is that the wait for the gradient is filled. That
  wait is the pipeline's bubble (warm-up and cool-down, and the slack of
  stages faster than the slowest), so the gain is bounded by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .schedules import Action, rank_actions

RECOMPUTE_MODES = ("on_demand", "ahead")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimes:
    """Per micro-batch seconds of one virtual stage (a chunk on a rank)."""

    forward: float
    backward: float
    """Without recomputation."""
    recompute: float = 0.0
    send: float = 0.0
    """Transfer of this stage's output to the next (and of the gradient
    back: same size)."""


@dataclass(slots=True, kw_only=True)
class Timeline:
    step_seconds: float
    busy_seconds: list[float]
    """Per rank: compute time (forward + backward + recompute)."""
    events: list[list[tuple[Action, float, float]]] = field(default_factory=list)
    """Per rank: (action, start, end)."""

    @property
    def bubble_fraction(self) -> float:
        ranks = len(self.busy_seconds)
        return 1.0 - sum(self.busy_seconds) / (ranks * self.step_seconds) if self.step_seconds else 0.0


def simulate(
    stages: Sequence[StageTimes], *, schedule: str, n_ranks: int, n_microbatches: int, recompute: str = "on_demand"
) -> Timeline:
    """Replays the schedule; ``stages`` is ordered by virtual stage (chunk
    ``c`` of rank ``r`` is virtual stage ``c * n_ranks + r``)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} is not one of {RECOMPUTE_MODES}")
    n_chunks = len(stages) // n_ranks
    if n_chunks * n_ranks != len(stages):
        raise ValueError("len(stages) must be a multiple of n_ranks")
    last = len(stages) - 1
    plans = []
    for rank in range(n_ranks):
        actions = rank_actions(schedule, rank, n_ranks, n_microbatches, n_chunks)
        if recompute == "ahead":
            actions = [a for b in actions for a in ((Action("R", b.chunk, b.microbatch), b) if b.kind == "B" else (b,))]
        plans.append(actions)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * n_ranks
    busy = [0.0] * n_ranks
    position = [0] * n_ranks
    events: list[list[tuple[Action, float, float]]] = [[] for _ in range(n_ranks)]
    remaining = sum(len(p) for p in plans)
    while remaining:
        progressed = False
        for rank in range(n_ranks):
            while position[rank] < len(plans[rank]):
                action = plans[rank][position[rank]]
                virtual = action.chunk * n_ranks + rank
                times = stages[virtual]
                ready = free[rank]
                if action.kind == "F" and virtual > 0:
                    upstream = done.get(("F", virtual - 1, action.microbatch))
                    if upstream is None:
                        break
                    ready = max(ready, upstream + stages[virtual - 1].send)
                if action.kind == "B" and virtual < last:
                    downstream = done.get(("B", virtual + 1, action.microbatch))
                    if downstream is None:
                        break
                    ready = max(ready, downstream + times.send)
                if action.kind == "F":
                    length = times.forward
                elif action.kind == "R":
                    length = times.recompute
                else:
                    length = times.backward + (times.recompute if recompute == "on_demand" else 0.0)
                end = ready + length
                done[(action.kind, virtual, action.microbatch)] = end
                events[rank].append((action, ready, end))
                free[rank] = end
                busy[rank] += length
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (inconsistent action lists)")
    return Timeline(step_seconds=max(free), busy_seconds=busy, events=events)
