"""Pipeline schedules as data: each rank's ordered list of actions, and
how many micro-batches each stage holds in flight.

The memory a stage needs is its activations times the micro-batches whose
forward has run and whose backward has not; under 1F1B that count is what
makes early stages the tight ones (stage ``s`` of ``S`` holds ``S - s``),
so an even layer split gives the first stage the most to recompute. The
same action lists drive the step-time simulator (`simulate`), so memory and
time are read from one description of the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("1f1b", "interleaved_1f1b")


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of work on a rank."""

    kind: str
    """"F" (forward), "B" (backward) or "R" (recompute ahead of a backward)."""
    chunk: int
    """Model chunk on this rank (0 unless interleaved)."""
    microbatch: int


def rank_actions(schedule: str, rank: int, n_ranks: int, n_microbatches: int, n_chunks: int = 1) -> list[Action]:
    """The forward/backward order of ``rank``: 1F1B (PipeDream-flush:
    ``n_ranks - rank - 1`` warm-up forwards, then one forward and one
    backward alternately, then the cool-down backwards), or Megatron's
    interleaved 1F1B with ``n_chunks`` model chunks per rank (warm-up
    ``2(n_ranks - rank - 1) + (n_chunks - 1) n_ranks`` chunk forwards,
    micro-batches taken ``n_ranks`` at a time through each chunk)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {SCHEDULES}")
    if schedule == "1f1b":
        n_chunks = 1
    total = n_microbatches * n_chunks
    if schedule == "1f1b":
        warmup = min(n_ranks - rank - 1, n_microbatches)
    else:
        if n_microbatches % n_ranks:
            raise ValueError("interleaved 1F1B needs n_microbatches to be a multiple of n_ranks")
        warmup = min(2 * (n_ranks - rank - 1) + (n_chunks - 1) * n_ranks, total)

    def forward_at(k: int) -> Action:
        group, within = divmod(k, n_ranks * n_chunks)
        chunk, offset = divmod(within, n_ranks) if n_chunks > 1 else (0, within)
        mb = group * n_ranks + offset if n_chunks > 1 else k
        return Action("F", chunk, mb)

    def backward_at(k: int) -> Action:
        f = forward_at(k)
        return Action("B", n_chunks - 1 - f.chunk, f.microbatch)

    actions = [forward_at(k) for k in range(warmup)]
    f = warmup
    for b in range(total):
        if f < total:
            actions.append(forward_at(f))
            f += 1
        actions.append(backward_at(b))
    return actions


def in_flight(schedule: str, rank: int, n_ranks: int, n_microbatches: int, n_chunks: int = 1) -> list[int]:
    """Per chunk of ``rank``: the most micro-batches whose forward has run
    and backward has not, over the rank's action order. Under 1F1B this is
    ``min(n_ranks - rank, n_microbatches)``."""
    live = [0] * (1 if schedule == "1f1b" else n_chunks)
    peak = list(live)
    for action in rank_actions(schedule, rank, n_ranks, n_microbatches, n_chunks):
        live[action.chunk] += 1 if action.kind == "F" else -1
        peak = [max(p, x) for p, x in zip(peak, live)]
    return peak


def in_flight_1f1b(stage: int, n_stages: int, n_microbatches: int | None = None) -> int:
    """Stage ``stage`` of ``n_stages`` under 1F1B holds ``n_stages - stage``
    micro-batches (fewer if there are fewer micro-batches)."""
    count = n_stages - stage
    return count if n_microbatches is None else min(count, n_microbatches)
