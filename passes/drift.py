"""Drift tests: has a compressed activation left what its plan assumed?

Reads: nothing on a graph. Plain data only: the statistics a plan was
calibrated on (`ValueReference`, one per lossy compressed value, from
`calibrate.Calibration`) and the same statistics measured later in training
(`ValueObservation`, from `adacc_compile.monitor`). Writes: nothing; the
`DriftDetector` keeps the per-value counters its hysteresis needs.

Why these tests: a plan chose a codec for a value because, on the batch it
was compiled for, the codec's error was within its declared bound and its
payload (sized from the shape alone) held the value well. Training moves
activations: outlier channels appear and grow, ranges shift. Three things
can then break the plan's promise:

* the round-trip error exceeds the codec's declared bound (the promise
  itself; `accuracy` modes are defined by these bounds);
* the error the round trip causes in a backward op reading the value
  exceeds the same bound (`gradient_sensitivity`): a drift that leaves the
  value's own error where it was can still make the backward amplify it
  (attention that sharpens to near one-hot, read by its backward's
  cancelling rowsum);
* more outlier channels than the payload has exact slots for (int8/int4
  outlier codecs keep K = C / 64 channels exact): the early sign that the
  error will grow, measured on the channel statistics alone. The threshold
  is the larger of the slots and the count at calibration (a value that
  already had more outliers than slots and was within its bound is not
  news), plus a margin; and it counts only once the error has used more
  than half the headroom the plan had (calibrated error to bound): outlier
  counts grow on their own as a model trains (measured on a char-level GPT,
  bench/results/adaptive.md), and while the codec still holds them well a
  re-plan would change nothing.

Hysteresis: a value must fail on `DriftRule.patience` consecutive checks,
so that one unusual batch does not re-plan; a pass resets its counter. The
reaction is in proportion: an error `DriftRule.urgent_factor` times its
bound or more (or not finite: an fp8 scale far past its headroom) fires at
the first check, because the steps patience would wait train on gradients
that far off (an fp8 saturation trained 7 steps at 58% gradient error
before the patient re-plan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueReference:
    """What the plan assumed of one compressed value."""

    value: str
    codec: str
    bound: float
    """The codec's declared relative-error bound."""
    error: float
    """Relative error measured at calibration."""
    abs_max: float
    outlier_channels: tuple[int, ...] = ()
    outlier_slots: int | None = None
    """Exact channels the payload holds (outlier codecs); None otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueObservation:
    """The same statistics, measured on a later step."""

    value: str
    codec: str
    error: float
    abs_max: float
    outlier_channels: tuple[int, ...] = ()
    gradient_error: float | None = None
    """The worst relative error the round trip causes in a backward op
    reading the value (`gradient_sensitivity`); None where not measured."""

    def churn(self, reference: ValueReference) -> float:
        """Share of today's outlier channels that were not outliers at
        calibration (0 when there are none)."""
        if not self.outlier_channels:
            return 0.0
        new = set(self.outlier_channels) - set(reference.outlier_channels)
        return len(new) / len(self.outlier_channels)


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftRule:
    """Thresholds of the drift tests."""

    patience: int = 2
    """Consecutive failing checks before a value counts as drifted."""
    outlier_margin: float = 0.5
    """Outlier count threshold: max(slots, calibrated count) times
    (1 + margin), at least one channel more."""
    urgent_factor: float = 5.0
    """An error this many times its bound (or not finite) fires at once."""

    def urgent(self, drift: "Drift") -> bool:
        return drift.test in ("error", "gradient") and (
            not math.isfinite(drift.observed) or drift.observed >= self.urgent_factor * drift.limit
        )

    def outlier_limit(self, reference: ValueReference) -> int | None:
        if reference.outlier_slots is None:
            return None
        base = max(reference.outlier_slots, len(reference.outlier_channels))
        return base + max(1, math.ceil(base * self.outlier_margin))


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """One value over a threshold (on `patience` consecutive checks)."""

    value: str
    codec: str
    test: str
    """"error", "gradient" or "outliers"."""
    observed: float
    limit: float

    def describe(self) -> str:
        if self.test == "error":
            return f"{self.value} ({self.codec}): error {self.observed:.4g} > bound {self.limit:.4g}"
        if self.test == "gradient":
            return f"{self.value} ({self.codec}): gradient error {self.observed:.4g} > bound {self.limit:.4g}"
        return f"{self.value} ({self.codec}): {int(self.observed)} outlier channels > {int(self.limit)}"


def failures(reference: ValueReference, observed: ValueObservation, rule: DriftRule) -> list[Drift]:
    """The tests ``observed`` fails on this check alone (no hysteresis)."""
    out = []
    if not math.isfinite(observed.error) or observed.error > reference.bound:
        out.append(Drift(value=reference.value, codec=reference.codec, test="error",
                         observed=observed.error, limit=reference.bound))
    gradient = observed.gradient_error
    if gradient is not None and (not math.isfinite(gradient) or gradient > reference.bound):
        out.append(Drift(value=reference.value, codec=reference.codec, test="gradient",
                         observed=gradient, limit=reference.bound))
    limit = rule.outlier_limit(reference)
    headroom_used = observed.error > (reference.error + reference.bound) / 2
    if limit is not None and len(observed.outlier_channels) > limit and headroom_used:
        out.append(Drift(value=reference.value, codec=reference.codec, test="outliers",
                         observed=float(len(observed.outlier_channels)), limit=float(limit)))
    return out


@dataclass(slots=True)
class DriftDetector:
    """Hysteresis over successive checks of one plan's compressed values."""

    references: dict[str, ValueReference]
    rule: DriftRule = field(default_factory=DriftRule)
    streak: dict[tuple[str, str], int] = field(default_factory=dict)
    """(value, test) -> consecutive failing checks so far."""

    def check(self, observations: list[ValueObservation]) -> list[Drift]:
        """Updates the counters with one check; returns the drifts that have
        now failed `rule.patience` times in a row, and those far enough over
        their bound to fire at once (`DriftRule.urgent`)."""
        fired = []
        seen: set[tuple[str, str]] = set()
        for obs in observations:
            ref = self.references.get(obs.value)
            if ref is None or ref.codec != obs.codec:
                continue
            for drift in failures(ref, obs, self.rule):
                key = (drift.value, drift.test)
                seen.add(key)
                self.streak[key] = self.streak.get(key, 0) + 1
                if self.streak[key] >= self.rule.patience or self.rule.urgent(drift):
                    fired.append(drift)
        for key in list(self.streak):
            if key not in seen:
                del self.streak[key]
        return fired
