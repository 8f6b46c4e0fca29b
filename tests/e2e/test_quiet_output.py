"""adacc's output is its own: no solver banner, no profiler log lines, no
third-party warnings (captured from a fresh interpreter, where a banner
printed once per process would show). The fast test runs the library calls
the main job makes (compile, plan with HiGHS, group blocks with networkx,
measure a step's peak with the profiler); the slow one runs the main job."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]

NOISE = re.compile(
    r"Running HiGHS|THIRD_PARTY_NOTICES|Copyright \(c\)"  # HiGHS banner
    r"|USDT:|STAGE:|profiler_start|profiler_stop"  # kineto's profiler log
    r"|Warning|warnings\.warn"  # any warning, third-party or adacc's own at sane defaults
)

LIBRARY_CALLS = """
import torch
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_compile.measure import measure_peak_bytes

cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=16, vocab_size=64, dropout=0.0)
model = init_weights(GPT(cfg))
ids, labels = gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
compiled = torch.compile(model, backend="adacc_eager", options={"memory_budget": 1.0})
def step():
    compiled(ids, labels).backward()
step()
print("peak bytes", measure_peak_bytes(step))
"""


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    return env


def _noise(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in (proc.stdout + proc.stderr).splitlines() if NOISE.search(line)]


def test_library_calls_print_no_banner_profiler_lines_or_warnings():
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY_CALLS], capture_output=True, text=True, timeout=300, env=_quiet_env(), cwd=ROOT
    )
    noisy = _noise(proc)
    assert not noisy, "\n".join(noisy[:20])
    assert "peak bytes" in proc.stdout


@pytest.mark.slow
def test_main_job_prints_no_banner_profiler_lines_or_warnings():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--layers", "1", "--d-model", "32",
         "--seq-len", "16", "--batch", "2", "--steps", "1", "--repeats", "1", "--budget", "1.0"],
        capture_output=True, text=True, timeout=1200, env=_quiet_env(), cwd=ROOT,
    )
    noisy = _noise(proc)
    assert not noisy, "\n".join(noisy[:20])
    assert "measured peak memory" in proc.stdout
