"""`bench/bench_fused_steps.py`'s comparison at equal or lower measured
peak: for each recompute-only plan, the fastest mixed plan of any budget
that holds no more, timed against it round by round."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

from bench_fused_steps import (  # noqa: E402
    at_equal_or_lower_peak,
    fits_budget,
    inductor_patches,
    matched_variants,
    paired_ratio,
    recompute_only_of,
    step_budget_variants,
    table,
)

from adacc_examples.benchmarking import VariantResult  # noqa: E402


def _result(name: str, peak_mib: float, steps: list[float]) -> VariantResult:
    return VariantResult(name=name, peak_bytes=int(peak_mib * 2**20), step_seconds=steps)


def test_paired_ratio_is_the_median_of_per_round_ratios():
    a = _result("a", 1, [1.0, 2.0, 3.0])
    b = _result("b", 1, [2.0, 2.0, 1.0])
    assert paired_ratio(a, b) == 1.0  # rounds: 0.5, 1.0, 3.0


def test_the_fastest_mixed_plan_at_no_higher_peak_is_chosen_across_budgets():
    results = [
        _result("inductor (no adacc)", 50, [1.0, 1.0]),
        _result("recompute-only @0.5 [auto]", 30, [1.2, 1.2]),
        _result("recompute-only @0.4 [auto]", 25, [1.4, 1.4]),
        _result("mixed/balanced @0.5 [auto]", 31, [0.6, 0.6]),  # faster but holds more: never chosen for 0.5
        _result("mixed/aggressive @0.4 [auto]", 29, [1.08, 1.08]),
        _result("mixed/balanced @0.4 [auto]", 24, [1.3, 1.3]),
        _result("mixed/balanced @0.4 [h100]", 20, [0.1, 0.1]),  # another cost model: not compared
    ]
    rows = at_equal_or_lower_peak(results).splitlines()[2:]
    assert "mixed/aggressive @0.4 [auto]" in rows[0] and rows[0].endswith("| 0.90 |")
    assert "mixed/balanced @0.4 [auto]" in rows[1] and rows[1].endswith("| 0.93 |")


def test_a_recompute_only_plan_below_every_mixed_plan_says_none():
    results = [
        _result("recompute-only @0.4 [auto]", 20, [1.0]),
        _result("mixed/balanced @0.4 [auto]", 21, [0.5]),
    ]
    assert "| none |" in at_equal_or_lower_peak(results)


def _planned(name: str, activation_peaks: list[int]) -> VariantResult:
    result = _result(name, 0, [1.0])  # planned, not measured: the predicted step peaks are matched
    result.reports = [
        {"summary": {"predicted_activation_peak_bytes": b, "codecs": {}, "fits_budget": True},
         "plan": []}
        for b in activation_peaks
    ]
    return result


def test_mixed_plans_are_budgeted_at_each_recompute_only_plans_simulated_peak():
    variants = matched_variants([
        _planned("recompute-only @0.6 [auto]", [3_000_000, 1_000]),
        _result("recompute-only @0.5 [auto]", 1, [1.0]),  # failed to plan: no reports, no matched variant
    ])
    assert [v.name for v in variants] == [
        "mixed/balanced at peak of @0.6 [auto]", "mixed/aggressive at peak of @0.6 [auto]",
    ]
    assert all(v.options["memory_budget"] == 3_001_000 for v in variants)  # the step's graphs summed, as bytes
    assert all(v.options["device_profile"] == "auto" for v in variants)
    assert variants[0].options["accuracy"] == "balanced" and variants[1].options["accuracy"] == "aggressive"


def test_a_matched_plan_is_compared_with_the_recompute_only_plan_it_was_budgeted_at():
    assert recompute_only_of("mixed/balanced at peak of @0.6 [auto]") == "recompute-only @0.6 [auto]"
    assert recompute_only_of("mixed/balanced @0.5 [h100]") == "recompute-only @0.5 [h100]"
    assert recompute_only_of("inductor (no adacc)") is None
    rows = table([
        _result("inductor (no adacc)", 50, [1.0]),
        _result("recompute-only @0.6 [auto]", 30, [2.0]),
        _result("mixed/balanced at peak of @0.6 [auto]", 29, [1.5]),
    ]).splitlines()
    assert rows[-1].split("|")[6].strip() == "0.75"


def test_the_table_says_which_plans_are_over_their_budget():
    over = _planned("mixed/balanced @0.4 [auto]", [1_000, 2_000])
    over.reports[1]["summary"]["fits_budget"] = False  # one graph of the step over
    within = _planned("mixed/aggressive @0.4 [auto]", [1_000])
    reference = _result("inductor (no adacc)", 50, [1.0])
    assert fits_budget(over) is False and fits_budget(within) is True and fits_budget(reference) is None
    rows = table([reference, over, within]).splitlines()
    assert [row.split("|")[-2].strip() for row in rows[2:]] == ["", "no", "yes"]


def test_mixed_plans_get_each_measured_recompute_only_step_peak_as_a_step_budget():
    measured = _planned("recompute-only @0.4 [auto]", [3_000_000])
    measured.peak_bytes = 5_000_000
    unmeasured = _planned("recompute-only @0.5 [h100]", [3_000_000])  # planned only: no step peak to match
    variants = step_budget_variants([measured, unmeasured])
    assert [v.name for v in variants] == [
        "mixed/balanced at step budget of @0.4 [auto]", "mixed/aggressive at step budget of @0.4 [auto]",
    ]
    assert all(v.options["memory_budget"] == 5_000_000 and v.options["budget_scope"] == "step" for v in variants)
    assert all(v.options["device_profile"] == "auto" for v in variants)
    assert variants[0].options["accuracy"] == "balanced" and variants[1].options["accuracy"] == "aggressive"
    assert recompute_only_of(variants[0].name) == "recompute-only @0.4 [auto]"


def test_dropout_uses_atens_random_numbers_unless_inductors_are_asked_for():
    assert inductor_patches(False) == {"fallback_random": True}
    assert inductor_patches(True) == {"fallback_random": False}
