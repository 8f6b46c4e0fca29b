"""Dumps, structured logs, TORCH_LOGS, and the entry points in a fresh
interpreter that never imports adacc_compile."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import torch

from adacc_examples.models import MLP, init_weights
from adacc_test_utils import compile_with_reports, loss_and_grads

SUMMARY_KEYS = {
    "budget_bytes",
    "baseline_saved_bytes",
    "planned_saved_bytes",
    "predicted_peak_bytes",
    "estimated_added_seconds",
    "solve_seconds",
    "solver_status",
    "decisions",
}
DUMP_FILES = {
    "joint_graph.py",
    "annotations.csv",
    "milp.lp",
    "plan.json",
    "forward.py",
    "backward.py",
    "summary.json",
    "memory_timeline.json",
}


def _mlp_and_batch():
    model = init_weights(MLP(d_in=8, d_hidden=32, depth=2))
    return model, (torch.randn(4, 8), torch.randn(4))


def test_dump_dir_option_writes_every_artifact(tmp_path):
    model, batch = _mlp_and_batch()
    compiled, _ = compile_with_reports(model, "adacc_eager", {"memory_budget": 0.5, "dump_dir": str(tmp_path)})
    loss_and_grads(model, compiled, *batch)
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == ["graph_000"]
    folder = tmp_path / "graph_000"
    assert DUMP_FILES <= {p.name for p in folder.iterdir()}
    summary = json.loads((folder / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["planned_saved_bytes"] <= summary["budget_bytes"]
    plan = json.loads((folder / "plan.json").read_text())
    assert plan and {"name", "op", "bytes", "decision", "cost_seconds"} <= set(plan[0])
    assert sum(summary["decisions"].values()) == len(plan)
    lp_text = (folder / "milp.lp").read_text()
    assert "\nmin\n" in lp_text and "budget" in lp_text
    assert "def forward" in (folder / "backward.py").read_text()


def test_env_var_dump_dir_numbers_graphs_in_compile_order(tmp_path, monkeypatch):
    monkeypatch.setenv("ADACC_DUMP_DIR", str(tmp_path))
    for _ in range(2):
        torch._dynamo.reset()
        model, batch = _mlp_and_batch()
        compiled, _ = compile_with_reports(model, "adacc_eager", {})
        loss_and_grads(model, compiled, *batch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph_000", "graph_001"]


def test_the_summary_names_its_dump_folder_and_keeps_the_graphs_own_index(tmp_path):
    """A dump_dir that already holds earlier runs' folders: the plan goes to
    the next free folder, named in ``dump_folder``, and ``graph_index``
    stays the graph's index in the step, the one the partitioner's step
    bookkeeping uses (it was overwritten with the folder's number)."""
    for index in range(7):
        (tmp_path / f"graph_{index:03d}").mkdir()
    model, batch = _mlp_and_batch()
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"dump_dir": str(tmp_path)})
    loss_and_grads(model, compiled, *batch)
    summary = partitioner.reports[-1]["summary"]
    assert summary["dump_folder"] == "graph_007"
    assert list(partitioner.latest) == [summary["graph_index"]]
    dumped = json.loads((tmp_path / "graph_007" / "summary.json").read_text())
    assert (dumped["dump_folder"], dumped["graph_index"]) == ("graph_007", summary["graph_index"])


def _run(code: str, env: dict[str, str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, cwd=cwd, capture_output=True, text=True, timeout=600,
    )


FRESH = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    x = torch.randn(4, 8)
    expected = model(x).square().sum()
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="{backend}", options={{"memory_budget": 0.5}})
    loss = compiled(x).square().sum()
    loss.backward()
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)
    for p, g in zip(model.parameters(), grads):
        assert torch.allclose(p.grad, g, atol=1e-5, rtol=1e-4)
    import sys
    print("OK", "adacc_compile" in sys.modules)
"""


def test_entry_point_in_fresh_interpreter_with_torch_logs(tmp_path):
    """``backend="adacc_eager"`` works without importing adacc_compile, and
    TORCH_LOGS=+adacc_compile prints the summary line and the plan table."""
    result = _run(FRESH.format(backend="adacc_eager"), {"TORCH_LOGS": "+adacc_compile"}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout
    assert "activations" in result.stderr and "est. time" in result.stderr
    assert "decision" in result.stderr  # plan table header at DEBUG


def test_torch_trace_contains_adacc_artifacts(tmp_path):
    trace_dir = tmp_path / "trace"
    result = _run(FRESH.format(backend="adacc_eager"), {"TORCH_TRACE": str(trace_dir)}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = "".join(p.read_text() for p in trace_dir.iterdir())
    assert '"name": "adacc_summary"' in text and '"name": "adacc_plan"' in text
