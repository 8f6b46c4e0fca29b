"""`bench/gpu_check.py --smoke` runs on CPU: the GPU check stays runnable
without a GPU (tiny sizes; Triton kernels under the interpreter)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).parents[2] / "bench" / "gpu_check.py"


def _run(tmp_path: pathlib.Path, *args: str) -> tuple[str, dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path)}
    subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", *args], check=True, env=env, timeout=1200, capture_output=True
    )
    return (tmp_path / "gpu_check.md").read_text(), json.loads((tmp_path / "gpu_check.json").read_text())


@pytest.mark.slow  # 24 s: keeps the default run under 15 minutes
def test_codec_section_on_cpu(tmp_path):
    markdown, data = _run(tmp_path, "--codecs", "int8_outlier", "bitmask", "--models")
    assert "## Codec kernels" in markdown
    rows = {row["codec"]: row for row in data["codecs"]}
    assert set(rows) == {"int8_outlier", "bitmask"}
    for row in rows.values():
        assert row["inductor_vs_reference"] == "exact"
        assert row["triton_vs_reference"] == "exact"  # under TRITON_INTERPRET=1
        assert row["inductor_compress"] > 0 and row["inductor_decompress"] > 0


@pytest.mark.slow
def test_whole_smoke_run(tmp_path):
    markdown, data = _run(tmp_path, "--budgets", "0.5")
    assert {row["codec"] for row in data["codecs"]} >= {"bitmask", "int8_outlier", "fp8_e4m3", "softmax_u8"}
    assert all(row["inductor_vs_reference"] == "exact" for row in data["codecs"])
    for model in ("gpt", "llama"):
        names = [row["name"] for row in data[f"model_{model}"]]
        assert names[:2] == ["no checkpointing", "full AC"] and "adacc balanced @0.5" in names
        assert f"### {model}:" in markdown
