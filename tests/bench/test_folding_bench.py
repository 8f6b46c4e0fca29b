"""`bench/bench_folding.py` at a tiny size: both problems plan, every share
gives a row with both plans' times, the folded plan is priced on the
problem over every block, and the tables are written (the script must not
rot between runs)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

pytest.importorskip("transformers")

import bench_folding  # noqa: E402


def test_the_folding_benchmark_compares_both_plans_at_each_share(tmp_path):
    code = bench_folding.main([
        "--families", "llama", "--layers", "3", "--shares", "1.0", "0.5", "--d-model", "64", "--seq-len", "32",
        "--out-dir", str(tmp_path), "--tag", "_smoke",
    ])
    assert code == 0
    rows = json.loads((tmp_path / "folding_smoke.json").read_text())["rows"]
    assert [row["share"] for row in rows] == [1.0, 0.5]
    for row in rows:
        assert row["candidates_folded"] < row["candidates_unfolded"]
        assert row["deciding_apart"] == ["model.layers.2"]
        assert row["unfolded_added_seconds"] is not None and row["folded_added_seconds"] is not None
        # The unfolded MILP is optimal over every plan (to its gap), the folded one among fewer.
        assert row["folded_added_seconds"] >= row["unfolded_added_seconds"] * 0.99 - 1e-12
    assert "| llama | 3 | 0.5 |" in (tmp_path / "folding_smoke.md").read_text()
