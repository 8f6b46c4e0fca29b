"""Drift tests on hand-made statistics: error over the declared bound,
outlier channels beyond what the payload holds, hysteresis, churn."""

from __future__ import annotations

from adacc_compile.passes.drift import DriftDetector, DriftRule, ValueObservation, ValueReference, failures

REF = ValueReference(value="x", codec="int8_outlier", bound=0.015, error=0.006, abs_max=3.0,
                     outlier_channels=(7,), outlier_slots=1)


def obs(error: float = 0.006, outliers: tuple[int, ...] = (7,)) -> ValueObservation:
    return ValueObservation(value="x", codec="int8_outlier", error=error, abs_max=3.0, outlier_channels=outliers)


def test_within_the_plan_nothing_fails():
    assert failures(REF, obs(), DriftRule()) == []
    assert failures(REF, obs(error=0.015, outliers=(1, 7)), DriftRule()) == []  # limit 1 + 1 = 2


def test_error_over_the_bound_and_too_many_outliers_fail():
    found = failures(REF, obs(error=0.02, outliers=(1, 2, 7)), DriftRule())
    assert [(d.test, d.observed, d.limit) for d in found] == [("error", 0.02, 0.015), ("outliers", 3.0, 2.0)]
    assert found[1].describe() == "x (int8_outlier): 3 outlier channels > 2"
    assert failures(REF, obs(error=float("nan")), DriftRule())[0].test == "error"


def test_outliers_count_only_once_the_error_used_half_the_headroom():
    assert failures(REF, obs(error=0.010, outliers=(1, 2, 7)), DriftRule()) == []  # midpoint 0.0105
    assert [d.test for d in failures(REF, obs(error=0.011, outliers=(1, 2, 7)), DriftRule())] == ["outliers"]


def test_outlier_limit_starts_from_the_larger_of_slots_and_calibrated_count():
    rule = DriftRule(outlier_margin=0.5)
    many = ValueReference(value="x", codec="int8_outlier", bound=0.015, error=0.01, abs_max=1.0,
                          outlier_channels=tuple(range(6)), outlier_slots=2)
    assert rule.outlier_limit(many) == 9
    assert rule.outlier_limit(REF) == 2
    no_slots = ValueReference(value="x", codec="fp8_e4m3", bound=0.03, error=0.02, abs_max=1.0)
    assert rule.outlier_limit(no_slots) is None


def test_hysteresis_needs_consecutive_failures():
    detector = DriftDetector({"x": REF}, DriftRule(patience=2))
    assert detector.check([obs(error=0.02)]) == []
    assert detector.check([obs()]) == []  # a pass resets the streak
    assert detector.check([obs(error=0.02)]) == []
    fired = detector.check([obs(error=0.03)])
    assert [(d.value, d.test) for d in fired] == [("x", "error")]


def test_observations_of_other_values_or_codecs_are_ignored():
    detector = DriftDetector({"x": REF}, DriftRule(patience=1))
    other = ValueObservation(value="y", codec="int8_outlier", error=1.0, abs_max=1.0)
    recoded = ValueObservation(value="x", codec="fp8_e4m3", error=1.0, abs_max=1.0)
    assert detector.check([other, recoded]) == []


def test_churn_is_the_share_of_new_outlier_channels():
    assert obs(outliers=(7, 8, 9, 10)).churn(REF) == 0.75
    assert obs(outliers=()).churn(REF) == 0.0


def test_an_error_far_over_its_bound_fires_at_the_first_check():
    """In proportion: 5x the bound, or a non-finite error (an fp8 scale far
    past its headroom), re-plans without waiting for patience."""
    for error in (5 * REF.bound, float("inf"), float("nan")):
        detector = DriftDetector({"x": REF}, DriftRule(patience=3))
        fired = detector.check([obs(error=error)])
        assert [(d.value, d.test) for d in fired] == [("x", "error")], error
    detector = DriftDetector({"x": REF}, DriftRule(patience=3))
    assert detector.check([obs(error=4 * REF.bound)]) == []  # over, but not far: patience applies


def test_gradient_error_over_the_bound_fails_even_where_the_value_error_does_not():
    import dataclasses

    amplified = dataclasses.replace(obs(), gradient_error=0.04)
    (found,) = failures(REF, amplified, DriftRule())
    assert (found.test, found.observed, found.limit) == ("gradient", 0.04, 0.015)
    assert found.describe() == "x (int8_outlier): gradient error 0.04 > bound 0.015"
    assert failures(REF, dataclasses.replace(obs(), gradient_error=0.01), DriftRule()) == []


def test_a_gradient_error_far_over_the_bound_fires_at_once():
    import dataclasses

    detector = DriftDetector({"x": REF}, DriftRule(patience=2, urgent_factor=5.0))
    assert detector.check([dataclasses.replace(obs(), gradient_error=0.03)]) == []  # 2x: patience
    fired = detector.check([dataclasses.replace(obs(), gradient_error=0.08)])  # over 5x: at once
    assert [d.test for d in fired] == ["gradient"]
    fresh = DriftDetector({"x": REF}, DriftRule(patience=2, urgent_factor=5.0))
    assert [d.test for d in fresh.check([dataclasses.replace(obs(), gradient_error=0.08)])] == ["gradient"]
