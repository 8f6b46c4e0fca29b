"""Work forked onto a second core returns what the caller would compute,
and falls back to the caller where the child cannot deliver."""

from __future__ import annotations

import os

import pytest

from adacc_compile import forked
from adacc_compile.forked import Forked

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


@pytest.fixture
def as_if_single_threaded(monkeypatch):
    """The test run's process has helper threads (tqdm's monitor, started by
    earlier traces), so `fork_available` refuses; these children run a few
    lines of plain Python, which no lock of another thread can block."""
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)


@needs_fork
def test_result_comes_from_the_child(as_if_single_threaded):
    parent = os.getpid()
    job = Forked(lambda: (os.getpid(), [1, 2, 3]))
    pid, value = job.result()
    assert job.ran_in_child and pid != parent and value == [1, 2, 3]


@needs_fork
def test_a_failing_child_is_rerun_here(as_if_single_threaded):
    calls = []

    def work():
        calls.append(os.getpid())
        if len(calls) == 1 and os.getpid() != parent:
            raise RuntimeError("only in the child")
        return "done"

    parent = os.getpid()
    job = Forked(work)
    assert job.result() == "done" and not job.ran_in_child
    assert calls == [parent]  # the child's attempt left no trace here


@needs_fork
def test_a_silent_child_is_killed_and_rerun_here(as_if_single_threaded):
    import time

    parent = os.getpid()
    job = Forked(lambda: time.sleep(30) if os.getpid() != parent else "here", timeout_s=0.5)
    assert job.result() == "here" and not job.ran_in_child


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("ADACC_NO_FORK", "1")
    assert not forked.fork_available()
    job = Forked(os.getpid)
    assert job.result() == os.getpid() and not job.ran_in_child


_PREVIEW_SCRIPT = """
import json, torch
from adacc_compile import forked, plan_preview
from adacc_compile.config import AdaccConfig
from adacc_compile.model_source import resolve_model

made = []

class Recording(forked.Forked):
    def __init__(self, fn, **kwargs):
        super().__init__(fn, **kwargs)
        made.append(self)

plan_preview.Forked = Recording
forked.no_monitor_threads()  # as adacc plan does

def figures(strategies):
    return [[s.name, s.saved_bytes, s.activation_peak_bytes, s.step_peak_bytes, round(s.step_seconds, 12)]
            for s in strategies]

source = resolve_model("adacc_cli_factories:tiny_gpt")
config = AdaccConfig.from_options({"memory_budget": 0.5, "device_profile": "h100", "calibrate_codecs": False})
result = plan_preview.preview(plan_preview.trace(source, batch=2, seq=16, dtype=torch.float32), config, fork=True)
print(json.dumps({"forked": [f.ran_in_child for f in made], "child": figures(result.strategies[1:]),
                  "here": figures(plan_preview.baselines(result.state))}))
"""


@needs_fork
def test_preview_baselines_equal_forked_or_computed_here():
    """``adacc plan`` (a fresh process, as here) simulates the baselines in a
    child while it plans; the parent's own computation after the plan (the
    fallback) gives the same figures."""
    import json
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / d) for d in ("tests", "examples"))}
    env.pop("ADACC_NO_FORK", None)
    done = subprocess.run([sys.executable, "-c", _PREVIEW_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(root / "tests"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["forked"] == [True]
    assert out["child"] == out["here"]
    assert any(name.startswith("PyTorch memory budget") for name, *_ in out["child"])


def test_preview_does_not_fork_unless_asked(monkeypatch):
    """Inside a long-lived process (this test run) the preview computes the
    baselines itself: forking it could hang the child (`forked`)."""
    import torch

    from adacc_compile import plan_preview
    from adacc_compile.config import AdaccConfig
    from adacc_compile.model_source import resolve_model

    def refuse(*args, **kwargs):
        raise AssertionError("preview forked without fork=True")

    monkeypatch.setattr(plan_preview, "Forked", refuse)
    source = resolve_model("adacc_cli_factories:tiny_gpt")
    config = AdaccConfig.from_options({"memory_budget": 0.5, "device_profile": "h100", "calibrate_codecs": False})
    result = plan_preview.preview(plan_preview.trace(source, batch=2, seq=16, dtype=torch.float32), config)
    assert [s.name for s in result.strategies][1].startswith("no checkpointing")


def test_no_fork_while_other_threads_run():
    import threading

    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not forked.fork_available()
        job = Forked(os.getpid)
        assert job.result() == os.getpid() and not job.ran_in_child
    finally:
        release.set()
        worker.join()
