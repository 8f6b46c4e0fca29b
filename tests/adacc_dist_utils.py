"""Helpers for tests that spawn gloo ranks on CPU processes.

Workers live here, in an importable module, because spawned children import
the function they run by name (pytest's importlib mode makes test modules
unimportable there). Each worker writes ``rank<r>.json`` into an output
folder; `spawn` runs them with a hard deadline so a bug can fail a test but
never hang the suite.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import time
import traceback
from typing import Any, Callable, Iterator

import torch

TP_OPTIONS = {
    "memory_budget": 0.3,
    # Fixed cost models: the plan must not depend on how loaded this machine is.
    "device_profile": "h100",
    "comm_profile": "gloo_cpu",
    # Overlap must not change numerics: compare against eager exactly.
    "accuracy": "lossless",
}


def spawn(worker: Callable[..., None], world_size: int, out_dir: str, *args: Any, timeout_s: float = 240) -> list[dict]:
    """Runs ``worker(rank, world_size, port, out_dir, *args)`` on
    ``world_size`` processes; returns each rank's result dict."""
    import torch.multiprocessing as mp

    from adacc_examples.tp_example import free_port

    context = mp.start_processes(
        worker, args=(world_size, free_port(), out_dir, *args), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"gloo ranks did not finish within {timeout_s} s")
    return [json.loads(pathlib.Path(out_dir, f"rank{r}.json").read_text()) for r in range(world_size)]


def _finish(out_dir: str, rank: int, result: dict) -> None:
    pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, indent=1, default=str))


@contextlib.contextmanager
def reporting(out_dir: str, rank: int, result: dict) -> Iterator[dict]:
    """A rank's body: a failure becomes its traceback in ``result["error"]``
    (the test reads it from ``rankN.json``) instead of killing the rank
    mid-collective; the result is written and the process group destroyed
    however the body ends."""
    import torch.distributed as dist

    try:
        yield result
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        _finish(out_dir, rank, result)
        dist.destroy_process_group()


def _setup(rank: int, world_size: int, port: int) -> str:
    torch.set_num_threads(1)
    os.environ.pop("ADACC_DUMP_DIR", None)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    from adacc_examples.tp_example import init_gloo

    return init_gloo(rank, world_size, port)


def _tiny_tp(rank: int, world_size: int, group: str, n_layer: int = 2):
    from adacc_examples.models import GPTConfig, gpt_batch
    from adacc_examples.tp_example import build

    cfg = GPTConfig(n_layer=n_layer, d_model=32, n_head=4, seq_len=16, vocab_size=64)
    model, dense = build(cfg, rank, world_size, group)
    return model, dense, gpt_batch(cfg, 2, torch.Generator().manual_seed(0))


def recomputes_between_all_reduce_and_wait(backward_py: str, recomputed: set[str]) -> dict[str, list[str]]:
    """all_reduce node -> recomputed nodes defined after it and before its
    wait_tensor, read from a dumped ``backward.py``."""
    defined = re.compile(r"^\s+(\w+)(?::\s*\"[^\"]*\")? = (.*)$")
    open_windows: dict[str, list[str]] = {}
    found: dict[str, list[str]] = {}
    for line in backward_py.splitlines():
        match = defined.match(line)
        if not match:
            continue
        name, rhs = match.groups()
        if "_c10d_functional.all_reduce" in rhs:
            open_windows[name] = []
            continue
        closes = [w for w in open_windows if re.search(rf"\b{w}\b", rhs)]
        if closes and ("wait_tensor" in rhs or "control_deps" in rhs):
            for window in closes:
                found[window] = open_windows.pop(window)
            continue
        for names in open_windows.values():
            if name in recomputed:
                names.append(name)
    return {k: v for k, v in found.items() if v}


def tp_overlap_worker(rank: int, world_size: int, port: int, out_dir: str, backend: str, recompile: bool) -> None:
    """Compiles the TP model, checks it against the dense model, reports."""
    import torch.distributed as dist

    from adacc_examples.tp_example import dense_grad_shard
    from adacc_test_utils import compile_with_reports

    result: dict[str, Any] = {"rank": rank}
    group = _setup(rank, world_size, port)
    with reporting(out_dir, rank, result):
        model, dense, (idx, targets) = _tiny_tp(rank, world_size, group)
        expected = dense(idx, targets)
        expected.backward()
        dump = os.path.join(out_dir, f"dump{rank}")
        compiled, partitioner = compile_with_reports(model, backend, {**TP_OPTIONS, "dump_dir": dump})
        loss = compiled(idx, targets)
        loss.backward()
        torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
        for name, param in model.named_parameters():
            torch.testing.assert_close(
                param.grad, dense_grad_shard(dense, name, rank, world_size), atol=1e-5, rtol=1e-4, msg=name
            )
        result["matches_dense"] = True
        result["summaries"] = [r["summary"] for r in partitioner.reports]
        folder = os.path.join(dump, "graph_000")
        plan = json.loads(pathlib.Path(folder, "plan.json").read_text())
        recomputed = {r["name"] for r in plan if r["decision"] == "recompute"}
        backward_py = pathlib.Path(folder, "backward.py").read_text()
        result["in_windows"] = recomputes_between_all_reduce_and_wait(backward_py, recomputed)
        result["summary_json"] = json.loads(pathlib.Path(folder, "summary.json").read_text())
        if recompile:  # overlap off: the same decisions, recomputed on demand
            torch._dynamo.reset()
            again, reports = compile_with_reports(model, backend, {**TP_OPTIONS, "overlap_recompute": False})
            again(idx, targets).backward()
            result["on_demand"] = reports.reports[-1]["summary"]
        dist.barrier()


def mismatch_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Ranks that plan differently, and a rank that never compiles: both are
    clear errors at compile time, not hangs."""
    import torch.distributed as dist

    from adacc_test_utils import compile_with_reports

    result: dict[str, Any] = {"rank": rank}
    group = _setup(rank, world_size, port)
    with reporting(out_dir, rank, result):
        model, _dense, (idx, targets) = _tiny_tp(rank, world_size, group, n_layer=1)
        budget = 0.3 if rank == 0 else 1.0  # rank-dependent options: different plans
        compiled, _ = compile_with_reports(model, "adacc_eager", {**TP_OPTIONS, "memory_budget": budget})
        try:
            compiled(idx, targets).backward()
            result["mismatch"] = "no error"
        except Exception as error:  # noqa: BLE001
            result["mismatch"] = f"{type(error).__name__}: {error}"
        dist.barrier()
        torch._dynamo.reset()
        if rank == 0:  # rank 1 never compiles this one
            compiled, _ = compile_with_reports(model, "adacc_eager", {**TP_OPTIONS, "plan_check_timeout_s": 3})
            start = time.monotonic()
            try:
                compiled(idx, targets).backward()
                result["missing_peer"] = "no error"
            except Exception as error:  # noqa: BLE001
                result["missing_peer"] = f"{type(error).__name__}: {error}"
            result["missing_peer_seconds"] = time.monotonic() - start
        dist.barrier()


def adaptive_rank_zero_worker(rank: int, world_size: int, port: int, out_dir: str, shift_at: int, steps: int) -> None:
    """Trains a small GPT with ``adapt`` on this rank's own batches (no
    gradient sync: the ranks' activations differ), scales six channels of
    block 1's ``ln_2`` weight at ``shift_at``; reports the plan versions,
    their hashes and the calibration each version planned with."""
    import torch.distributed as dist

    from adacc_compile.adaptation import graphs_of
    from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
    from adacc_test_utils import compile_with_reports

    result: dict[str, Any] = {"rank": rank}
    _setup(rank, world_size, port)
    with reporting(out_dir, rank, result):
        cfg = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=64, dropout=0.0)
        # int8_outlier: the shift overflows its exact-channel slots (see tests/e2e/test_adaptation.py).
        options = {"memory_budget": 0.5, "accuracy": "balanced", "codecs": ("int8_outlier",), "allow_recompute": False,
                   "device_profile": "h100", "adapt": True, "adapt_every": 3, "adapt_patience": 2}
        torch.manual_seed(0)
        model = init_weights(GPT(cfg))
        compiled, partitioner = compile_with_reports(model, "adacc_eager", options)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(1000 + rank)  # every rank its own data
        batches = [gpt_batch(cfg, 2, generator) for _ in range(6)]
        for step in range(steps):
            if step == shift_at:
                with torch.no_grad():
                    model.blocks[1].ln_2.weight[[3, 10, 17, 29, 40, 55]] *= 60.0
            compiled(*batches[step % len(batches)]).backward()
            optimizer.step()
            optimizer.zero_grad()
        graph = graphs_of(model)[0]
        result["versions"] = [[v.version, v.step, v.trigger] for v in graph.versions]
        result["hashes"] = [v.summary["plan_hash"] for v in graph.versions]
        result["calibration"] = [{r["name"]: r.get("calibration") for r in v.plan} for v in graph.versions]
        result["calibrated"] = [r["summary"].get("calibration", {}).get("used") for r in partitioner.reports]
        result["checks"] = len(graph.checks)
        result["compiles"] = graph.compiles
        dist.barrier()
