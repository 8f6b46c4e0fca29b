"""`bench/bench_step_timeline.py` at a tiny size: the simulated step lines
up with the allocator's op by op, and the report is written (the script
must not rot between runs)."""

from __future__ import annotations

import argparse
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

pytest.importorskip("transformers")

import bench_step_timeline  # noqa: E402


# Slow (24 s): simulated against measured peaks are checked in the default
# run by tests/e2e/test_inductor_peak_prediction.py and test_peak_budget.py.
@pytest.mark.slow
def test_the_step_timeline_lines_up_simulation_and_measurement(tmp_path):
    args = argparse.Namespace(
        family="llama", layers=2, d_model=32, vocab=256, seq_len=32, batch=2, labels=True,
        planner="full_ac", budget="1B", tag="_smoke", out_dir=str(tmp_path),
    )
    result = bench_step_timeline.run(args)
    (graph,) = result["graphs"]
    rows = graph["rows"]
    aligned = [r for r in rows if r.measured is not None]
    assert len(aligned) >= 0.9 * len(rows) and any(r.phase == "backward" for r in aligned)
    peak = max(level for _, level in result["ours"])
    # Full AC's plan with the loss in the graph: simulated as it runs.
    assert abs(graph["simulated_peak"] - peak) <= 0.02 * peak, (graph["simulated_peak"], peak)
    text = bench_step_timeline.report(args, result)
    assert "| full AC (HF checkpointing) |" in text and "## adacc's ops around its measured peak" in text
    assert bench_step_timeline.main([
        "--layers", "2", "--d-model", "32", "--vocab", "256", "--seq-len", "32", "--batch", "2",
        "--out-dir", str(tmp_path), "--tag", "_main",
    ]) == 0
    assert (tmp_path / "step_timeline_llama_main.md").exists()
