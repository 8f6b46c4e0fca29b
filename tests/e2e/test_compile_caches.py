"""torch's compile caches on (its default): a second process with the same
cache directory plans every graph again and reports it as the first did
(summary, warnings, dumps, `adacc_compile.plans`, adaptation), and still
takes Inductor's code from the FX graph cache. Each process is a fresh
interpreter (`warm_cache_child`) with torch's default cache settings."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_child(cache_dir: pathlib.Path, dump_dir: pathlib.Path, *, head_only: bool = False) -> dict:
    dump_dir.mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    # The repo root first, so `adacc_compile` is the package, not tests/adacc_compile.
    env["PYTHONPATH"] = os.pathsep.join(str(_ROOT / p) for p in ("", "tests", "examples"))
    args = json.dumps({"dump_dir": str(dump_dir), "budget": 0.3, "head_only": head_only})
    done = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("warm_cache_child.py")), args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warm_cache_plans_and_reports_as_the_first_compile_did(tmp_path):
    cache = tmp_path / "torch_cache"
    cold = _run_child(cache, tmp_path / "dumps_cold")
    warm = _run_child(cache, tmp_path / "dumps_warm")
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0
    # Inductor's code comes from the cache (the dump folder is not in its key)...
    assert warm["fxgraph_cache_hit"] == cold["fxgraph_cache_miss"] and warm["fxgraph_cache_miss"] == 0
    # ... and adacc planned and reported every graph all the same.
    assert len(warm["plans"]) == 2 and warm["plans"] == cold["plans"]
    assert warm["warnings"] and warm["warnings"] == cold["warnings"]
    assert warm["dumps"] == cold["dumps"] == ["graph_000", "graph_001"]
    assert warm["current_plan_version"] >= 1  # adapt=True wrapped the graphs
    # The head after the break was planned with what the body holds.
    assert warm["plans"][1]["held_by_earlier_graphs"] > 0

    # The head compiled alone (nothing held before it) on the same warm
    # cache: planned for what is held now, not served the plan made beside
    # the body.
    alone = _run_child(cache, tmp_path / "dumps_head", head_only=True)["plans"]
    assert len(alone) == 1 and alone[0]["held_by_earlier_graphs"] == 0
    assert alone[0]["plan_hash"] != warm["plans"][1]["plan_hash"]
