"""The search for the model cap whose plan's simulated peak meets the budget
(`plan_search._CapBracket`): steps by the gap until the target is
bracketed (an over-budget plan's step starting at its own modelled peak),
then interpolates, halving where a cap would repeat or would fall to a cap
without any plan, and stops when a fitting plan is close enough or nothing
is left to try."""

from __future__ import annotations

from adacc_compile.passes.plan_search import _CapBracket


def test_a_plan_close_enough_under_the_target_stops_the_search():
    bracket = _CapBracket(1000)
    bracket.add(1000, 980)
    assert bracket.next_cap(0.03) is None


def test_slack_raises_the_cap_by_the_gap():
    bracket = _CapBracket(1000)
    bracket.add(1000, 800)
    assert bracket.next_cap(0.03) == 1200


def test_excess_lowers_the_cap_by_the_excess():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1100)
    assert bracket.next_cap(0.03) == 900


def test_a_bracketed_target_is_interpolated_between_fit_and_over():
    bracket = _CapBracket(1000)
    bracket.add(1000, 800)
    bracket.add(1200, 1200)  # over: the target lies between
    cap = bracket.next_cap(0.03)
    assert cap == 1000 + (1000 - 800) * 200 // 400 == 1100


def test_a_repeated_cap_is_replaced_by_the_midpoint_and_an_exhausted_bracket_stops():
    bracket = _CapBracket(1000)
    bracket.add(1000, 800)
    bracket.add(1200, 1200)
    bracket.add(1100, 1200)  # the interpolated cap gave a plan over the target
    assert bracket.next_cap(0.03) == 1050  # interpolation would give 1050 too: fresh, kept
    bracket.add(1050, 800)  # same plan as at 1000
    assert bracket.next_cap(0.03) == 1075
    tight = _CapBracket(1000)
    tight.add(1000, 800)
    tight.add(1001, 1200)
    assert tight.next_cap(0.03) is None


def test_no_plan_at_a_lower_cap_halves_the_gap_between_it_and_the_lowest_plan_over():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1100)
    bracket.add(900, None)  # the MILP found nothing under 900: a floor
    assert bracket.next_cap(0.03) == 950
    bracket.add(950, 1060)  # still over: stepping down by the excess would pass the floor
    assert bracket.next_cap(0.03) == 925
    bracket.add(925, 900)  # fits, 10% under: the target is bracketed between 925 and 950
    assert 925 < bracket.next_cap(0.03) < 950


def test_a_step_that_stays_above_the_floor_is_kept():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1100)
    bracket.add(800, None)
    assert bracket.next_cap(0.03) == 900  # above the floor: the excess, as without one


def test_no_cap_left_between_the_floor_and_the_lowest_plan_over_stops():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1100)
    bracket.add(999, None)
    assert bracket.next_cap(0.03) is None


def test_an_over_plan_steps_down_from_its_own_modelled_peak():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1010, modelled=950)  # every cap from 950 to 1000 gives this plan again
    assert bracket.next_cap(0.03) == 940
    bracket.add(940, 900)  # fits, 10% under: bracketed between 940 and 950, not 1000
    assert 940 < bracket.next_cap(0.03) < 950


def test_a_modelled_peak_above_the_cap_does_not_raise_it():
    bracket = _CapBracket(1000)
    bracket.add(1000, 1100, modelled=1000)
    assert bracket.next_cap(0.03) == 900


def test_an_excess_of_at_least_the_cap_leaves_no_cap_and_the_warning_says_why():
    from adacc_compile.passes.plan_search import _no_cap_left

    bracket = _CapBracket(1000)
    bracket.add(1000, 2100, modelled=900)  # 1100 over: more than the modelled peak 900
    assert bracket.next_cap(0.03) is None
    why = _no_cap_left(bracket, clamped=False)
    assert "1100 bytes over the budget" in why and "modelled peak 900" in why
    assert "reachable minimum" in _no_cap_left(bracket, clamped=True)
