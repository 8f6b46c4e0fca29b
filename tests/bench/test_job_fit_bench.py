"""`bench/bench_job_fit.py` on a tiny config: one fresh ``adacc plan
--json`` process per setup, its answer in the table (the script must not
rot between runs)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

pytest.importorskip("transformers")

import bench_job_fit  # noqa: E402

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 64,
}


# Slow: one fresh CLI process per setup (37 s); the CLI's answers are
# tested in the default run by tests/adacc_compile/test_job_memory.py.
@pytest.mark.slow
def test_the_job_fit_benchmark_answers_each_setup(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    code = bench_job_fit.main([
        "--models", str(config), "--setups", "1", "2-fsdp", "--batch", "1", "--seq", "16",
        "--out-dir", str(tmp_path), "--tag", "_smoke",
    ])
    assert code == 0
    rows = json.loads((tmp_path / "job_fit_smoke.json").read_text())
    assert [r["setup"] for r in rows] == ["1", "2-fsdp"] and all(r["fits_gpu"] for r in rows)
    assert rows[1]["weights_bytes"] == -(-rows[0]["weights_bytes"] // 2)
    assert "| yes |" in (tmp_path / "job_fit_smoke.md").read_text()
