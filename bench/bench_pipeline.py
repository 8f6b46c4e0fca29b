"""Pipeline parallelism with adacc: recompute ahead of the gradient receive
vs on demand, and recompute-aware stage partitioning vs the even split.

Part 1, measured: a GPT (`adacc_examples.models.GPT`) cut into 2 (and 4)
stages on gloo CPU ranks (one thread each), each stage compiled by
`adacc_compile.pipelining.RecomputeAheadBackend` (adacc_eager planning) and
run by the hand-written 1F1B loop (`one_f_one_b.run_1f1b`). Two partitions,
both from per-layer costs of adacc's own plans (`layer_cost`, the measured
"cpu" device profile) under one memory budget per device:

* **even**: equal block counts, each stage's plan the cheapest that fits;
* **adacc**: `partition()`'s split points and plans.

The budget per device is 1.1x the least at which the even split fits at
all (bisection over `plan_split`), so its first stages, which hold the
most micro-batches, must recompute nearly everything. Each
stage is compiled with the byte budget its partition allows one micro-batch
(`StagePlan.microbatch_activation_bytes`). Both partitions are compiled in
the same processes; repeats interleave (even/adacc x ahead/on demand, with
ahead switched on the same compiled graphs), each repeat the slowest rank's
step; medians and ratios come from the same run.

Part 2, predicted: a GPT-3-style model (24 layers d=2048 on 4 stages and
48 layers d=4096 on 8, sequence 2048, micro-batch 1, bf16, H100 profile,
16 micro-batches) -- even vs adacc partitioning and recompute ahead vs on
demand, simulated over NVLink 4 and InfiniBand NDR point-to-point links,
with the partition search time.

    python bench/bench_pipeline.py [--world-sizes 2 4] [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import _examples_path  # noqa: F401

import argparse
import dataclasses
import json
import pathlib
import platform
import statistics
import tempfile
import time
import traceback
import warnings
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from adacc_compile.passes.comm_model import link_by_name
from adacc_compile.pipelining import (
    CostOptions, LayerCost, Partition, balanced_split, even_split, fuse, layer_cost, partition, plan_split,
)
from adacc_compile.pipelining.predict import compare_partitions
from adacc_examples.models import GPTBlock, GPTConfig


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def gpt_layer_costs(cfg: GPTConfig, batch: int, dtype: torch.dtype, options: CostOptions) -> list[LayerCost]:
    """One `LayerCost` per block, the embedding fused into the first and the
    head into the last (stages always start and end on blocks, as
    `gpt_stages` cuts them). Identical blocks are traced once."""
    def ids():
        return (torch.zeros(batch, cfg.seq_len, dtype=torch.long),)

    def hidden():
        return (torch.zeros(batch, cfg.seq_len, cfg.d_model, requires_grad=True),)

    embed = layer_cost("embedding", lambda: Embedding(cfg), ids, dtype=dtype, options=options)
    block = layer_cost("block", lambda: GPTBlock(cfg), hidden, dtype=dtype, options=options)
    head = layer_cost("head", lambda: Head(cfg), lambda: (*hidden(), *ids()), dtype=dtype, options=options)
    blocks = [block.renamed(f"block{i}") for i in range(cfg.n_layer)]
    blocks[0] = fuse(embed, blocks[0], "embedding+block0")
    blocks[-1] = fuse(blocks[-1], head, f"block{cfg.n_layer - 1}+head")
    return blocks


def tight_budget(layers: list[LayerCost], n_stages: int, n_microbatches: int, slack: float) -> int:
    """The memory per device: ``slack`` times the least at which the even
    split fits at all (found by bisection), so that its early stages,
    holding the most micro-batches, must recompute nearly everything."""
    points = even_split(layers, n_stages)
    low, high = 1, sum(layer.static_bytes + n_stages * layer.levels[0].saved_bytes + layer.levels[-1].working_bytes
                      for layer in layers)
    while low < high:
        mid = (low + high) // 2
        if plan_split(layers, points, mid, n_microbatches=n_microbatches).feasible:
            high = mid
        else:
            low = mid + 1
    return int(low * slack)


# ---------------------------------------------------------------- measured


def _worker(rank: int, world_size: int, port: int, out_dir: str, spec: dict) -> None:
    import torch.distributed as dist

    from adacc_examples.gpt_stages import gpt_stages
    from adacc_compile.pipelining.one_f_one_b import run_1f1b
    from adacc_compile.pipelining.recompute_ahead import RecomputeAheadBackend
    from adacc_examples.models import GPT, gpt_batch, init_weights
    from adacc_examples.tp_example import init_gloo

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {"rank": rank}
    init_gloo(rank, world_size, port)
    try:
        cfg = GPTConfig(**spec["cfg"])
        model = init_weights(GPT(cfg), seed=0)
        n_mb = spec["n_microbatches"]
        idx, targets = gpt_batch(cfg, spec["microbatch"] * n_mb, torch.Generator().manual_seed(0))
        inputs, target_mbs = list(idx.chunk(n_mb)), list(targets.chunk(n_mb))
        first, last = rank == 0, rank == world_size - 1

        def loss_fn(logits, tgt):
            return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())

        runs = {}
        for method, part in spec["partitions"].items():
            stage = gpt_stages(model, part["split_points"])[rank]
            budget = part["stages"][rank]["microbatch_activation_bytes"]
            backend = RecomputeAheadBackend({"memory_budget": int(budget), "device_profile": spec["profile"],
                                             "accuracy": "lossless"},
                                            max_ahead_bytes=max(part["stages"][rank]["working_bytes"], 0))
            runs[method] = (stage, torch.compile(stage, backend=backend), backend)

        def step(method: str, ahead: bool) -> float:
            stage, compiled, backend = runs[method]
            backend.enabled = ahead
            stage.zero_grad(set_to_none=True)
            backend.new_step()
            dist.barrier()
            record = run_1f1b(compiled, rank=rank, n_ranks=world_size, inputs=inputs if first else None,
                              targets=target_mbs if last else None, loss_fn=loss_fn,
                              activation_shape=(spec["microbatch"], cfg.seq_len, cfg.d_model),
                              n_microbatches=n_mb, before_gradient_wait=backend.recompute_ahead)
            seconds = torch.tensor([record.seconds], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            return float(seconds)

        order = [(m, a) for m in runs for a in (True, False)]
        for key in order:  # compile + warm-up
            step(*key)
        times: dict[str, list[float]] = {f"{m}/{'ahead' if a else 'on_demand'}": [] for m, a in order}
        for rep in range(spec["repeats"]):
            for key in (order if rep % 2 == 0 else order[::-1]):
                times[f"{key[0]}/{'ahead' if key[1] else 'on_demand'}"].append(step(*key))
        result["times"] = times
        result["summaries"] = {m: [r["summary"] for r in b.reports] for m, (_s, _c, b) in runs.items()}
        result["max_held_bytes"] = {m: b.max_held_bytes for m, (_s, _c, b) in runs.items()}
        result["split"] = {m: b.split_summary() for m, (_s, _c, b) in runs.items()}
        dist.barrier()
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, default=str))
        dist.destroy_process_group()


def measure(world_size: int, args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    from adacc_examples.tp_example import free_port

    n_layer = args.layers_per_rank * world_size
    cfg = GPTConfig(n_layer=n_layer, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab_size=256)
    options = CostOptions(device_profile=args.profile, state_bytes_per_parameter=16)
    start = time.perf_counter()
    layers = gpt_layer_costs(cfg, args.microbatch, torch.float32, options)
    cost_seconds = time.perf_counter() - start
    budget = tight_budget(layers, world_size, args.microbatches, args.slack)
    even = plan_split(layers, even_split(layers, world_size), budget, n_microbatches=args.microbatches,
                      method="even")
    balanced = plan_split(layers, balanced_split(layers, world_size), budget, n_microbatches=args.microbatches,
                          method="balanced")
    searched = partition(layers, world_size, budget, n_microbatches=args.microbatches)
    candidates = {"even": even, "balanced": balanced, "adacc": searched}
    distinct: dict[str, Partition] = {}
    same_as: dict[str, str] = {}
    for name, part in candidates.items():
        twin = next((n for n, p in distinct.items() if p.split_points == part.split_points), None)
        if twin is None:
            distinct[name] = part
        else:
            same_as[name] = twin  # same split: same stage plans, not measured twice
    spec = {
        "cfg": {"n_layer": n_layer, "d_model": args.d_model, "n_head": 4, "seq_len": args.seq_len,
                "vocab_size": 256},
        "n_microbatches": args.microbatches, "microbatch": args.microbatch, "repeats": args.repeats,
        "profile": args.profile,
        "partitions": {name: part.to_json() for name, part in distinct.items()},
    }
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(world_size, free_port(), out, spec), nprocs=world_size,
                           start_method="spawn")
        ranks = [json.loads(pathlib.Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    for r in ranks:
        if "error" in r:
            raise RuntimeError(r["error"])
    times = ranks[0]["times"]
    return {
        "world_size": world_size, "n_layer": n_layer, "budget_bytes": budget, "cost_seconds": cost_seconds,
        "partitions": {name: part.to_json() for name, part in candidates.items()}, "same_as": same_as,
        "search_seconds": searched.search_seconds, "times": times,
        "medians": {k: statistics.median(v) for k, v in times.items()},
        "paired_ratios": {m: _quartiles([o / a for o, a in zip(times[f"{m}/on_demand"], times[f"{m}/ahead"])])
                          for m in spec["partitions"]},
        "summaries": [r["summaries"] for r in ranks],
        "max_held_bytes": [r["max_held_bytes"] for r in ranks],
        "split": [r["split"] for r in ranks],
    }


def _quartiles(values: list[float]) -> list[float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return [q[0], statistics.median(values), q[2]]


# ---------------------------------------------------------------- predicted


def predict(n_layer: int, d_model: int, n_stages: int, args: argparse.Namespace) -> dict:
    cfg = GPTConfig(n_layer=n_layer, d_model=d_model, n_head=d_model // 128, seq_len=2048, vocab_size=50304)
    start = time.perf_counter()
    layers = gpt_layer_costs(cfg, 1, torch.bfloat16, CostOptions(device_profile="h100"))
    cost_seconds = time.perf_counter() - start
    budget = tight_budget(layers, n_stages, args.predict_microbatches, args.slack)
    links = {"NVLink 4": link_by_name("nvlink4"), "InfiniBand NDR": link_by_name("ib_ndr")}
    rows, parts = compare_partitions(layers, n_stages, budget, links, n_microbatches=args.predict_microbatches)
    return {"n_layer": n_layer, "d_model": d_model, "n_stages": n_stages, "budget_bytes": budget,
            "cost_seconds": cost_seconds, "rows": [dataclasses.asdict(r) for r in rows],
            "partitions": parts,
            "levels": [{"name": lv.name, "saved_bytes": lv.saved_bytes, "recompute_seconds": lv.recompute_seconds,
                        "working_bytes": lv.working_bytes} for lv in layers[1].levels],
            "block_seconds": {"forward": layers[1].forward_seconds, "backward": layers[1].backward_seconds}}


# ---------------------------------------------------------------- report


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def report(measured: list[dict], predicted: list[dict]) -> str:
    out = []
    if measured:
        out.append("| ranks | layers | budget / device | partition | split points | fits (modelled) | bottleneck (modelled) "
                   "| on-demand step | ahead step | on-demand / ahead (ratio of medians) | paired ratios: median [q1, q3] "
                   "| even / this (on-demand) | held ahead (max over ranks) |")
        out.append("|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for m in measured:
            md = m["medians"]
            for method, part in m["partitions"].items():
                run = m["same_as"].get(method, method)
                on, ah = md[f"{run}/on_demand"], md[f"{run}/ahead"]
                note = f" (= {run})" if run != method else ""
                q = m["paired_ratios"][run]
                out.append(
                    f"| {m['world_size']} | {m['n_layer']} | {_mib(m['budget_bytes'])} | {method}{note} "
                    f"| {part['split_points']} | {'yes' if part['feasible'] else 'no'} "
                    f"| {part['bottleneck_seconds'] * 1e3:.2f} ms | {on * 1e3:.1f} ms | {ah * 1e3:.1f} ms "
                    f"| {on / ah:.3f}x | {q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}] | {md['even/on_demand'] / on:.3f}x "
                    f"| {max(h[run] for h in m['max_held_bytes']) / 1024:.0f} KiB |"
                )
    if predicted:
        out.append("")
        out.append("| model | stages | budget / device | link | partition | split points | fits | bottleneck / micro-batch "
                   "| on-demand step | ahead step | on-demand / ahead | even / this (ahead) | search (slower mode) |")
        out.append("|---|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|")
        for p in predicted:
            rows = p["rows"]

            def pick(link, method, mode):
                return next(r for r in rows if r["link"] == link and r["method"] == method and r["recompute"] == mode)

            for link in dict.fromkeys(r["link"] for r in rows):
                even_ahead = pick(link, "even", "ahead")["step_seconds"]
                for method in ("even", "balanced", "adacc", "adacc simulated"):
                    on, ah = pick(link, method, "on_demand"), pick(link, method, "ahead")
                    search = p["partitions"]["simulated_search_seconds" if method == "adacc simulated"
                                             else "search_seconds"]
                    out.append(
                        f"| {p['n_layer']} layers, d={p['d_model']} | {p['n_stages']} | {_gib(p['budget_bytes'])} "
                        f"| {link} | {method} | {list(on['split_points'])} | {'yes' if on['feasible'] else 'no'} "
                        f"| {on['bottleneck_seconds'] * 1e3:.2f} ms "
                        f"| {on['step_seconds'] * 1e3:.1f} ms | {ah['step_seconds'] * 1e3:.1f} ms "
                        f"| {on['step_seconds'] / ah['step_seconds']:.3f}x | {even_ahead / ah['step_seconds']:.3f}x "
                        f"| {search * 1e3:.1f} ms |"
                    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--layers-per-rank", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--microbatch", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", default="cpu", help="device profile for planning the CPU runs")
    parser.add_argument("--slack", type=float, default=1.1,
                        help="memory per device, as a multiple of the least at which the even split fits")
    parser.add_argument("--predict-microbatches", type=int, default=16)
    parser.add_argument("--no-predict", action="store_true")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    measured = [measure(w, args) for w in args.world_sizes]
    predicted = [] if args.no_predict else [predict(24, 2048, 4, args), predict(48, 4096, 8, args)]
    text = report(measured, predicted)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "torch": torch.__version__,
            "args": {k: str(v) for k, v in vars(args).items()}, "measured": measured, "predicted": predicted,
            "table": text,
        }, indent=1, default=str))


if __name__ == "__main__":
    main()
