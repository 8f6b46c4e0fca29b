"""`bench/bench_peak.py --step-budget`'s report line, and the harness
reporting the plan each graph runs after the warm-up steps (a graph split
by a graph break re-plans there under a step budget)."""

from __future__ import annotations

import pathlib
import sys
from types import SimpleNamespace

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

from bench_peak import step_budget_lines  # noqa: E402

from adacc_examples.benchmarking import VariantResult, _collect_plan  # noqa: E402


def _report(graph: int, saved: int) -> dict:
    return {"summary": {
        "graph_index": graph, "planned_saved_bytes": saved, "predicted_peak_bytes": 10 * saved,
        "baseline_saved_bytes": 2 * saved, "estimated_added_seconds": 0.5, "stage_seconds": {"plan": 1.0},
    }}


def test_the_harness_reports_each_graphs_latest_plan():
    result = VariantResult(name="adacc")
    reports = [_report(4, 100), _report(5, 30), _report(4, 60)]  # graph 4 re-planned
    _collect_plan(SimpleNamespace(partitioner=SimpleNamespace(reports=reports), result=result))
    assert [r["summary"]["planned_saved_bytes"] for r in result.reports] == [60, 30]
    assert result.planned_saved_bytes == 90 and result.predicted_peak_bytes == 900
    assert result.planning_seconds == 2.0


def test_the_step_budget_line_compares_with_full_ac_of_the_same_round():
    full = VariantResult(name="full AC", peak_bytes=100 * 2**20, step_seconds=[2.0, 2.0, 2.0])
    ours = VariantResult(name="adacc step budget 100.0 MiB (full AC's peak)", peak_bytes=90 * 2**20,
                         step_seconds=[1.5, 1.6, 1.7], reports=[_report(4, 2**20)])
    (line,) = step_budget_lines([full, ours])
    assert "measured 90.0 MiB against full AC's 100.0 MiB" in line
    assert "step time 0.80x full AC's" in line and "4 (saves 1.0 MiB)" in line


def test_the_json_keeps_each_strategy_with_its_round():
    from bench_peak import raw_entries

    first = [VariantResult(name="full AC", peak_bytes=100), VariantResult(name="adacc @0.15", peak_bytes=50)]
    second = [VariantResult(name="full AC", peak_bytes=101), VariantResult(name="adacc step budget", peak_bytes=99)]
    entries = raw_entries(first, second)
    assert [(e["name"], e["round"], e["peak_bytes"]) for e in entries] == [
        ("full AC", 1, 100), ("adacc @0.15", 1, 50), ("full AC", 2, 101), ("adacc step budget", 2, 99),
    ]


def test_compile_caches_are_torchs_unless_turned_off():
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    from adacc_examples.benchmarking import compile_caches

    with inductor_config.patch(fx_graph_cache=True), functorch_config.patch(enable_autograd_cache=True):
        with compile_caches(True):
            assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
        with compile_caches(False):
            assert not inductor_config.fx_graph_cache and not functorch_config.enable_autograd_cache
        assert inductor_config.fx_graph_cache
