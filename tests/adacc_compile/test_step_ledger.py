"""The step ledger's bookkeeping for a budget shared by several graphs of
one training step: what earlier graphs hold, the room later graphs ask
them for, and when an earlier graph must re-plan."""

from __future__ import annotations

from adacc_compile.step_ledger import Holding, StepBudgetGraph, StepLedger


def _ledger_holding(*saved: int) -> StepLedger:
    ledger = StepLedger()
    for graph, nbytes in enumerate(saved):
        ledger.hold(Holding(graph=graph, saved_bytes=nbytes, default_saved_bytes=nbytes))
        ledger.planned_under(graph, cap=None, later_gradients=0, peak=1000, budget=1000)
    return ledger


def test_room_is_asked_of_the_holding_graphs_in_proportion_to_what_they_hold():
    ledger = _ledger_holding(300, 100)
    caps = ledger.ask_room(asker=2, over_bytes=40, gradient_bytes=0)
    assert caps == {0: 270, 1: 90} == {g: ledger.cap_for(g) for g in (0, 1)}
    assert ledger.needs_room(0) and ledger.needs_room(1)
    # A later, smaller request keeps the lower cap; a graph that holds nothing is not asked.
    assert ledger.ask_room(asker=3, over_bytes=4, gradient_bytes=0) == {0: 270, 1: 90}
    assert StepLedger().ask_room(asker=0, over_bytes=10, gradient_bytes=0) == {}


def test_a_graph_that_fits_asks_nothing_but_its_gradients_are_charged_where_they_do_not_fit():
    ledger = _ledger_holding(300)
    ledger.planned_under(0, cap=None, later_gradients=0, peak=900, budget=1000)
    assert ledger.ask_room(asker=1, over_bytes=-5, gradient_bytes=100) == {}
    assert ledger.cap_for(0) is None and ledger.later_gradient_bytes(0) == 100
    assert not ledger.needs_room(0)  # 900 + 100 still within 1000
    ledger.ask_room(asker=2, over_bytes=0, gradient_bytes=1)
    assert ledger.later_gradient_bytes(0) == 101 and ledger.needs_room(0)


def test_a_settled_graph_is_not_asked_again_until_a_lower_cap_comes():
    ledger = _ledger_holding(300)
    ledger.ask_room(asker=1, over_bytes=30, gradient_bytes=0)
    ledger.settle(0)
    assert not ledger.needs_room(0)
    ledger.ask_room(asker=1, over_bytes=30, gradient_bytes=0)  # the same request again
    assert not ledger.needs_room(0)
    ledger.ask_room(asker=2, over_bytes=60, gradient_bytes=0)
    assert ledger.cap_for(0) == 240 and ledger.needs_room(0)


def test_a_step_budget_graph_re_plans_once_when_asked_and_keeps_its_plan_where_none_comes_out():
    ledger = _ledger_holding(300)
    calls = []
    graph = StepBudgetGraph(lambda *a: ("old", a), lambda args: calls.append(args) or (lambda *a: ("new", a)), 0, ledger)
    assert graph(1) == ("old", (1,)) and not calls
    ledger.ask_room(asker=1, over_bytes=30, gradient_bytes=0)
    assert graph(2) == ("new", (2,)) and calls == [(2,)]
    assert graph(3) == ("new", (3,)) and calls == [(2,)] and graph.replans == 1
    kept = StepBudgetGraph(lambda *a: "old", lambda args: None, 0, ledger)
    ledger.ask_room(asker=1, over_bytes=90, gradient_bytes=0)
    assert kept() == "old" and kept() == "old" and kept.replans == 1
