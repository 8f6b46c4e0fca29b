"""Same graph, same options, same machine: the same plan, byte for byte, in
a new process. The default cost model measures this machine; the
measurement is cached on disk (`adacc_compile.passes.profile_cache`), so the
second process plans from the figures the first one measured."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path[:0] = [{tests!r}, {examples!r}]
    from adacc_test_utils import build, loss_and_grads
    model, batch = build("gpt")
    compiled = torch.compile(model, backend="adacc_eager", options={{"memory_budget": 0.3, "dump_dir": sys.argv[1]}})
    loss_and_grads(model, compiled, *batch)
    """
)


def _plan_in_fresh_process(tmp_path: pathlib.Path, run: str, cache: pathlib.Path) -> bytes:
    tests = str(pathlib.Path(__file__).parents[1])
    examples = str(pathlib.Path(__file__).parents[2] / "examples")
    env = {**os.environ, "ADACC_CACHE_DIR": str(cache)}
    env.pop("ADACC_REMEASURE", None)
    out = tmp_path / run
    subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests, examples=examples), str(out)], check=True, env=env, timeout=600,
        capture_output=True,
    )
    return (out / "graph_000" / "plan.json").read_bytes()


def test_two_processes_write_the_same_plan(tmp_path):
    cache = tmp_path / "cache"
    first = _plan_in_fresh_process(tmp_path, "first", cache)
    assert list(cache.glob("device_profile-*.json")), "the first process cached its measured profile"
    second = _plan_in_fresh_process(tmp_path, "second", cache)
    assert first == second
    assert b'"decision": "recompute"' in first, "a plan with decisions to disagree on"
