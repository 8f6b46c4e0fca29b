"""Lynx on tensor-parallel training: recomputation inside the backward's
all-reduce windows vs on demand.

Part 1, measured: a Megatron-style tensor-parallel GPT (`adacc_examples.tp_example`)
on 2 and 4 gloo ranks (CPU processes, one thread each), compiled twice with
the same options at a budget that forces recomputation -- once with
``overlap_recompute=True`` (recomputation placed after each all-reduce is
issued, before its wait) and once with ``False`` (the same plan, recomputed
right before first use). Step times are medians of interleaved repeats
(on, off, off, on, ...), each repeat the slowest rank's time; the ratio is
on-demand / overlapped from the same run.

Part 2, predicted: the cost model's all-reduce window times for a GPT-3-style
layer (175B: hidden 12288, sequence 2048, micro-batch 1, bf16) at TP = 2, 4,
8 on the NVLink profiles, next to the time to recompute that layer's
forward on an H100 (the built-in roofline profile): how much of a full
layer recompute two windows per layer can hide.

    python bench/bench_tp_overlap.py [--world-sizes 2 4] [--layers 4] [--d-model 256]
        [--seq-len 128] [--batch 4] [--repeats 15] [--budget 0.3] [--backend adacc_eager]

Prints markdown tables (nothing is written unless --json is given).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
import warnings

import torch

from adacc_compile.passes.comm_model import BUILTIN_LINKS, collective_seconds
from adacc_compile.passes.device_profile import BUILTIN_PROFILES


# --------------------------------------------------------------------------
# part 1: measured step time on gloo ranks
# --------------------------------------------------------------------------


def _worker(rank: int, world_size: int, port: int, out_dir: str, args: dict) -> None:
    import torch.distributed as dist

    import _examples_path  # noqa: F401  (examples/ on sys.path)
    from adacc_examples.models import GPTConfig, gpt_batch
    from adacc_examples.tp_example import build, init_gloo

    import faulthandler

    faulthandler.dump_traceback_later(args["watchdog_s"], exit=True)  # a hang prints where, then exits
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    group = init_gloo(rank, world_size, port)
    result: dict = {}
    try:
        cfg = GPTConfig(
            n_layer=args["layers"], d_model=args["d_model"], n_head=args["heads"],
            seq_len=args["seq_len"], vocab_size=512,
        )
        batch = gpt_batch(cfg, args["batch"], torch.Generator().manual_seed(0))
        options = {
            "memory_budget": args["budget"],
            "device_profile": args["device_profile"],
            "comm_profile": args["comm_profile"],
        }
        variants = {}
        for label, overlap in (("overlap", True), ("on_demand", False)):
            model, _dense = build(cfg, rank, world_size, group)
            variants[label] = (model, _compile(model, args["backend"], {**options, "overlap_recompute": overlap}))
        losses = {}
        for label, (model, (compiled, _)) in variants.items():
            start = time.perf_counter()
            for _ in range(2):  # compile + warm-up
                losses[label] = _step(model, compiled, batch)
            result[f"{label}_compile_s"] = time.perf_counter() - start
        times = {label: [] for label in variants}
        for repeat in range(args["repeats"]):
            order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
            for label in order:
                model, (compiled, _) = variants[label]
                dist.barrier()
                start = time.perf_counter()
                _step(model, compiled, batch)
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                times[label].append(float(elapsed))
        result["times"] = times
        result["losses"] = losses
        result["summaries"] = {label: p.reports[-1]["summary"] for label, (_, (_, p)) in variants.items()}
    except BaseException as error:  # reported by the parent
        import traceback

        result["error"] = f"{error}\n{traceback.format_exc()}"
    finally:
        if rank == 0:
            pathlib.Path(out_dir, "result.json").write_text(json.dumps(result, default=str))
        dist.destroy_process_group()


def _compile(model, backend: str, options: dict):
    from adacc_compile.config import AdaccConfig
    from adacc_compile.partitioner import AdaccPartitioner

    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    return torch.compile(model, backend=partitioner.backend(eager=backend != "adacc")), partitioner


def _step(model, compiled, batch) -> float:
    model.zero_grad(set_to_none=True)
    loss = compiled(*batch)
    loss.backward()
    return float(loss)


def measure(world_size: int, args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    from adacc_examples.tp_example import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, free_port(), out_dir, vars(args)), nprocs=world_size)
        result = json.loads(pathlib.Path(out_dir, "result.json").read_text())
    if "error" in result:
        raise RuntimeError(f"world size {world_size}: {result['error']}")
    return result


def measured_table(results: dict[int, dict]) -> str:
    lines = [
        "| ranks | recomputes (in windows) | windows (predicted) | predicted hidden | on-demand step | overlapped step "
        "| speedup (ratio of medians) | paired ratios: median [q1, q3] |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for world_size, result in results.items():
        on = statistics.median(result["times"]["overlap"])
        off = statistics.median(result["times"]["on_demand"])
        summary = result["summaries"]["overlap"]
        same = summary["decisions"] == result["summaries"]["on_demand"]["decisions"]
        assert same, "overlap on/off must share the plan"
        ratios = [a / b for a, b in zip(result["times"]["on_demand"], result["times"]["overlap"])]
        q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        lines.append(
            f"| {world_size} | {summary['decisions']['recompute']} ({summary['recomputes_in_windows']}) "
            f"| {summary['comm_windows']} ({summary['comm_window_seconds'] * 1e3:.1f} ms) "
            f"| {summary['overlapped_recompute_seconds'] * 1e3:.2f} ms "
            f"| {off * 1e3:.1f} ms | {on * 1e3:.1f} ms | {off / on:.3f}x | {median:.3f} [{q1:.3f}, {q3:.3f}] |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# part 2: predicted windows for GPT-3 at scale
# --------------------------------------------------------------------------

GPT3 = {"175B": dict(hidden=12288, heads=96, seq=2048), "13B": dict(hidden=5120, heads=40, seq=2048)}


def layer_forward_seconds(hidden: int, seq: int, batch: int, tp: int) -> float:
    """One transformer layer's forward per TP rank on the H100 roofline:
    QKV + projection + MLP matmuls (24·b·s·h² FLOPs) and attention
    (4·b·s²·h), split over ``tp`` ranks, bf16."""
    flops = (24 * batch * seq * hidden**2 + 4 * batch * seq**2 * hidden) / tp
    return flops / BUILTIN_PROFILES["h100"].matmul_rate(torch.bfloat16)


def predicted_table(model: str = "175B", batch: int = 1) -> str:
    shape = GPT3[model]
    nbytes = batch * shape["seq"] * shape["hidden"] * 2  # bf16 activation gradient
    lines = [
        "| TP | link | all-reduce (MiB) | window / all-reduce | windows / layer (x2) | layer forward recompute (H100) | hideable |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for tp in (2, 4, 8):
        recompute = layer_forward_seconds(shape["hidden"], shape["seq"], batch, tp)
        for key in ("nvlink3", "nvlink4"):
            window = collective_seconds("all_reduce", nbytes, tp, BUILTIN_LINKS[key])
            lines.append(
                f"| {tp} | {BUILTIN_LINKS[key].name} | {nbytes / 2**20:.1f} | {window * 1e6:.0f} µs "
                f"| {2 * window * 1e6:.0f} µs | {recompute * 1e6:.0f} µs | {min(1.0, 2 * window / recompute):.0%} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--backend", default="adacc_eager", choices=["adacc_eager", "adacc"])
    parser.add_argument("--device-profile", default="cpu", help="planner cost model (default: calibrated CPU)")
    parser.add_argument("--comm-profile", default="calibrate", help="window cost model (default: measured gloo)")
    parser.add_argument("--gpt3", default="175B", choices=sorted(GPT3))
    parser.add_argument("--json", help="also write raw results here")
    parser.add_argument("--watchdog-s", type=float, default=900, help="a rank stuck this long dumps its stack and exits")
    args = parser.parse_args(argv)

    print(f"# TP recompute overlap: {' '.join(sys.argv)}")
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; model: {args.layers} layers, d_model {args.d_model}, "
        f"seq {args.seq_len}, batch {args.batch}; budget {args.budget}; backend {args.backend}; "
        f"{args.repeats} interleaved repeats\n"
    )
    results = {}
    for world_size in args.world_sizes:
        results[world_size] = measure(world_size, args)
        losses = results[world_size]["losses"]
        assert abs(losses["overlap"] - losses["on_demand"]) < 1e-4 * max(1.0, abs(losses["on_demand"])), losses
    print("## Measured: gloo ranks on CPU\n")
    print(measured_table(results))
    print(f"\n## Predicted: GPT-3 {args.gpt3} layer, micro-batch 1, bf16\n")
    print(predicted_table(args.gpt3))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"measured": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
