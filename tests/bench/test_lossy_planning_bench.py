"""`bench/bench_lossy_planning.py` plans a balanced HF Llama and writes its
table and JSON (two layers here: every block is measured, none stands in)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
pytest.importorskip("transformers")


# Slow (12-23 s): a bench smoke run; the sampled calibration it times is
# tested in the default run by tests/passes/test_calibration_sample.py.
@pytest.mark.slow
def test_the_bench_reports_calibration_and_planning_per_depth(tmp_path):
    import bench_lossy_planning

    out = tmp_path / "lossy.md"
    bench_lossy_planning.main(["--layers", "2", "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    (row,) = data["rows"]
    assert row["layers"] == 2 and row["values"] > 0 and row["stand_ins"] == 0
    assert row["calibrate_s"] > 0 and row["plan_s"] > 0 and row["classes"] == 1 and row["blocks"] == 2
    assert "| 2 |" in out.read_text() and data["meta"]["accuracy"] == "balanced"
