"""`bench/bench_planning.py` at a tiny size: every row has the planning
record's parts beside PyTorch's min-cut time on the same graph, block
reuse fired, and the tables are written (the script must not rot between
runs)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

pytest.importorskip("transformers")

import bench_planning  # noqa: E402


def test_the_planning_benchmark_runs_and_reports_each_part(tmp_path):
    code = bench_planning.main([
        "--families", "llama", "--layers", "2", "--budgets", "0.5", "min", "--modes", "inductor",
        "--d-model", "64", "--seq-len", "32", "--out-dir", str(tmp_path), "--tag", "_smoke",
    ])
    assert code == 0
    data = json.loads((tmp_path / "planning_smoke.json").read_text())
    assert [row["budget"] for row in data["rows"]] == ["0.5", "min"]
    for row in data["rows"]:
        planning = row["planning"]
        assert row["min_cut_seconds"] > 0 and planning["seconds"] > 0
        assert planning["solves"] >= 1 and planning["splits"] >= 1 and planning["rows"] > 0
        assert row["block_reuse"]["used"] and row["block_reuse"]["blocks"] == 2
    assert data["rows"][1]["budget_clamped_to_minimum"]
    assert "| llama | 2 | inductor | min |" in (tmp_path / "planning_smoke.md").read_text()
