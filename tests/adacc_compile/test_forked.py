"""Work forked onto a second core returns what the caller would compute,
and falls back to the caller where the child cannot deliver."""

from __future__ import annotations

import os

import pytest

from adacc_compile import forked
from adacc_compile.forked import Forked

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")


@needs_fork
def test_result_comes_from_the_child():
    parent = os.getpid()
    job = Forked(lambda: (os.getpid(), [1, 2, 3]))
    pid, value = job.result()
    assert job.ran_in_child and pid != parent and value == [1, 2, 3]


@needs_fork
def test_a_failing_child_is_rerun_here():
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
def test_a_silent_child_is_killed_and_rerun_here():
    import time

    parent = os.getpid()
    job = Forked(lambda: time.sleep(30) if os.getpid() != parent else "here", timeout_s=0.5)
    assert job.result() == "here" and not job.ran_in_child


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("ADACC_NO_FORK", "1")
    assert not forked.fork_available()
    job = Forked(os.getpid)
    assert job.result() == os.getpid() and not job.ran_in_child


def test_preview_baselines_equal_forked_or_computed_here():
    """`plan_preview.preview` simulates the baselines in a child while it
    plans; the parent's own computation after the plan (the fallback) gives
    the same figures."""
    import torch

    from adacc_compile import plan_preview
    from adacc_compile.config import AdaccConfig
    from adacc_compile.model_source import resolve_model

    source = resolve_model("adacc_cli_factories:tiny_gpt")
    config = AdaccConfig.from_options({"memory_budget": 0.5, "device_profile": "h100", "calibrate_codecs": False})
    result = plan_preview.preview(plan_preview.trace(source, batch=2, seq=16, dtype=torch.float32), config)

    def figures(strategies):
        return [(s.name, s.saved_bytes, s.activation_peak_bytes, s.step_peak_bytes, round(s.step_seconds, 12))
                for s in strategies]

    forked_here = figures(result.strategies[1:])
    assert figures(plan_preview.baselines(result.state)) == forked_here
    assert any(name.startswith("PyTorch memory budget") for name, *_ in forked_here)
