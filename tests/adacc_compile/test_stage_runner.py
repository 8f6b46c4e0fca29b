"""The stage runner: stage order and parts, skips, timings, and the
cyclic garbage collector paused while stages run."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from adacc_compile.passes.plan_timing import PlanTiming
from adacc_compile import stage_runner


@pytest.fixture
def recorded(monkeypatch):
    calls: list[tuple[str, bool]] = []

    def stage(name):
        return lambda state: calls.append((name, gc.isenabled()))

    monkeypatch.setattr(stage_runner, "STAGES", tuple((n, stage(n)) for n in ("first", "calibrate", "last")))
    return calls


@pytest.mark.parametrize("enabled", [True, False])
def test_stages_run_with_the_collector_paused_and_its_state_restored(recorded, enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        state = SimpleNamespace(stage_seconds={}, plan_timing=PlanTiming())
        stage_runner.run_pipeline(state)
        assert recorded == [("first", False), ("calibrate", False), ("last", False)]
        assert gc.isenabled() is enabled
        assert set(state.stage_seconds) == {"first", "calibrate", "last"}
    finally:
        (gc.enable if was else gc.disable)()


def test_collector_restored_when_a_stage_raises(monkeypatch):
    def broken(state):
        raise RuntimeError("stage failed")

    monkeypatch.setattr(stage_runner, "STAGES", (("broken", broken),))
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="stage failed"):
        stage_runner.run_pipeline(SimpleNamespace(stage_seconds={}, plan_timing=PlanTiming()))
    assert gc.isenabled()


def test_parts_and_skips(recorded):
    stage_runner.run_pipeline(SimpleNamespace(stage_seconds={}, plan_timing=PlanTiming()), after="first", skip=frozenset({"calibrate"}))
    assert [name for name, _ in recorded] == ["last"]
    with pytest.raises(ValueError, match="cannot skip"):
        stage_runner.run_pipeline(SimpleNamespace(stage_seconds={}, plan_timing=PlanTiming()), skip=frozenset({"first"}))
    with pytest.raises(ValueError, match="no stage"):
        stage_runner.run_pipeline(SimpleNamespace(stage_seconds={}, plan_timing=PlanTiming()), until="nowhere")
