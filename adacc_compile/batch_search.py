"""The smallest budget that can be met, and the largest batch that fits,
when the asked-for batch's plan does not fit (``adacc plan``).

The smallest budget is the activation peak of the lowest-peak plan at that
batch (the plan for the reachable minimum the budget stage computes,
simulated on its split graphs). A batch fits when that is within the
budget.

Activation memory is close to linear in the batch (every activation has
the batch as a dimension; what does not, position tables for instance, is
small), so the minimum is ``m(b) = a + c * b``. From the one point known,
``a = 0`` gives the first guess ``floor(budget / m(B) * B)``; every guess is
verified by tracing and planning that batch for its minimum, and each new
point refits ``a`` and ``c`` (through the two points nearest the budget).
The search ends when a fitting batch and the next one, which does not fit,
are both planned, or after `MAX_PLANS` plans (the answer is then the
largest fitting batch planned, reported as such).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from adacc_compile.report import human_bytes

MAX_PLANS = 4
"""Plans (each a trace and a pipeline run) the search may make."""


@dataclass(slots=True, kw_only=True)
class BatchSearch:
    budget_bytes: int
    asked_batch: int
    minimum_bytes: int
    """The reachable minimum at the asked-for batch: the smallest budget
    that can be met there."""
    minimum_by_batch: dict[int, int] = field(default_factory=dict)
    """Every batch planned -> its reachable minimum (bytes)."""

    def fits(self, batch: int) -> bool:
        return self.minimum_by_batch[batch] <= self.budget_bytes

    @property
    def largest(self) -> int | None:
        """The largest planned batch that fits (None: not even batch 1)."""
        fitting = [b for b in self.minimum_by_batch if self.fits(b)]
        return max(fitting) if fitting else None

    @property
    def exact(self) -> bool:
        """The batch after `largest` was planned and does not fit (or
        nothing fits and batch 1 was planned)."""
        if self.largest is None:
            return 1 in self.minimum_by_batch
        return self.largest + 1 in self.minimum_by_batch

    def explain(self) -> str:
        tried = ", ".join(
            f"batch {b}: {human_bytes(m)}" + ("" if self.fits(b) else " (over)")
            for b, m in sorted(self.minimum_by_batch.items())
        )
        return (
            "the bounded peak is close to linear in the batch; each guess from a linear fit of the reachable "
            f"minimum, verified by tracing and planning that batch (minimum: {tried})"
        )


def largest_batch(minimum_at: Callable[[int], int], *, asked_batch: int, minimum_bytes: int,
                  budget_bytes: int) -> BatchSearch:
    """``minimum_at(b)`` traces and plans batch ``b`` and returns its
    reachable minimum."""
    search = BatchSearch(budget_bytes=budget_bytes, asked_batch=asked_batch, minimum_bytes=minimum_bytes)
    search.minimum_by_batch[asked_batch] = minimum_bytes
    guess = math.floor(budget_bytes / minimum_bytes * asked_batch)
    for _ in range(MAX_PLANS):
        guess = _bracketed(search, guess)
        if guess is None:
            break
        search.minimum_by_batch[guess] = minimum_at(guess)
        guess = _linear_guess(search)
    return search


def _bracketed(search: BatchSearch, guess: int) -> int | None:
    """``guess`` moved into the open interval between the largest fitting
    and the smallest failing batch planned (None: nothing left to plan)."""
    fitting = [b for b in search.minimum_by_batch if search.fits(b)]
    failing = [b for b in search.minimum_by_batch if not search.fits(b)]
    low = max(fitting, default=0)
    high = min(failing, default=None)
    if high is not None and high <= low + 1:
        return None
    guess = max(guess, low + 1)
    if high is not None:
        guess = min(guess, high - 1)
    if guess < 1:
        return None
    return guess


def _linear_guess(search: BatchSearch) -> int:
    """The largest batch the affine fit of the two planned points nearest
    the budget puts within it."""
    points = sorted(search.minimum_by_batch.items(), key=lambda p: abs(p[1] - search.budget_bytes))[:2]
    (b0, m0), (b1, m1) = sorted(points)
    slope = (m1 - m0) / (b1 - b0) if b1 != b0 else m0 / b0
    if slope <= 0:
        return b1 + 1
    return math.floor(b0 + (search.budget_bytes - m0) / slope)
