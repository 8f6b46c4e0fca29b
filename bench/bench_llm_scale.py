"""Planning at LLM scale without the memory: a Llama-7B-shaped model planned
entirely under fake tensors on this CPU, with identical-block reuse (Lynx
HEU) and with the full MILP.

    python bench/bench_llm_scale.py [--micro-batches 1 4] [--budget 60GiB]
        [--accuracy balanced] [--profile h100] [--small-layers 32]
        [--profile-run] [--out-dir bench/results]

What runs: Dynamo + AOTAutograd trace the model (32 layers, hidden 4096,
32 heads, FFN 11008, vocab 32000, sequence 4096, bf16) built inside a
``FakeTensorMode``, so nothing is allocated; the joint graph is captured
once per micro-batch and adacc's whole pipeline (`AdaccPartitioner`) runs on
a copy of it, once with ``block_reuse=True`` and once with ``False``. The
same is done for a 32-layer small Llama (d_model 256), where both are cheap.

Reported: the pipeline's stage times (``stage_seconds``); "planning" =
structure + budget + plan (the brief's definition), split into the parts of
the plan stage (MILP solves, torch's fw/bw extraction, codec rewrite, memory
simulation) by timing wrappers around the functions `pipeline.plan_stage`
calls; the decisions and codecs; the simulated peak (``predicted_peak_bytes``
and the activation peak) against the budget. With ``--profile-run`` one more
block-reuse plan of the largest micro-batch runs under cProfile and its top
functions are written to llm_scale_profile.txt.

Outputs under --out-dir: llm_scale.md, llm_scale.json (and the profile).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import datetime
import functools
import gc
import io
import json
import os
import platform
import pstats
import sys
import time
import warnings
from collections import defaultdict
from typing import Any, Iterator

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pareto import CapturedJoint, build_model, capture_joint  # noqa: E402

from adacc_compile import compat  # noqa: E402
from adacc_compile.passes import plan_search  # noqa: E402
from adacc_compile.config import parse_bytes  # noqa: E402
import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.models import LlamaConfig, count_parameters, gpt_batch  # noqa: E402

# Functions the plan search calls by their module-level names in
# `passes.plan_search`; each is wrapped to time the parts of the plan stage.
PLAN_PARTS = ("check_solution", "saved_values_for", "split_joint_graph", "apply_compression", "simulate_step", "simulate")


@contextlib.contextmanager
def timed_plan_parts() -> Iterator[dict[str, float]]:
    """Times the parts of the plan stage (`plan_search`: the policy it gets too)."""
    seconds: dict[str, float] = defaultdict(float)

    def wrap(name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start

        return timed

    originals = {name: getattr(plan_search, name) for name in (*PLAN_PARTS, "get_policy")}
    try:
        for name in PLAN_PARTS:
            setattr(plan_search, name, wrap(name, originals[name]))
        setattr(plan_search, "get_policy", lambda planner: wrap("policy (MILP solve)", originals["get_policy"](planner)))
        yield seconds
    finally:
        for name, fn in originals.items():
            setattr(plan_search, name, fn)


def llama7b_config(seq_len: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=32000, seq_len=seq_len, n_layer=32, n_head=32, d_model=4096, ffn_dim=11008)


def small_config(layers: int, seq_len: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=512, seq_len=seq_len, n_layer=layers, n_head=4, d_model=256, ffn_dim=688)


def plan_once(captured: CapturedJoint, options: dict[str, Any]) -> dict[str, Any]:
    with timed_plan_parts() as parts, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu_start = time.process_time()
        report = captured.plan(options)
        cpu = time.process_time() - cpu_start
    s = report["summary"]
    stages = s["stage_seconds"]
    return {
        "options": {k: str(v) for k, v in options.items()},
        "wall_seconds": report["wall_seconds"],
        "cpu_seconds": cpu,
        "stage_seconds": stages,
        "planning_seconds": stages["structure"] + stages["budget"] + stages["plan"],
        "rewrite_seconds": parts.get("split_joint_graph", 0.0) + parts.get("apply_compression", 0.0),
        "decide_seconds": stages["structure"] + stages["budget"] + stages["plan"]
        - parts.get("split_joint_graph", 0.0) - parts.get("apply_compression", 0.0),
        "plan_parts_seconds": dict(parts),
        "solve_seconds": s["solve_seconds"],
        "solver_status": s["solver_status"],
        "replans": s["replans"],
        "decisions": s["decisions"],
        "codecs": s["codecs"],
        "num_candidates": s["num_candidates"],
        "block_reuse": s["block_reuse"],
        "budget_bytes": s["budget_bytes"],
        "budget_clamped_to_minimum": s["budget_clamped_to_minimum"],
        "baseline_saved_bytes": s["baseline_saved_bytes"],
        "minimum_activation_peak_bytes": s["minimum_activation_peak_bytes"],
        "modelled_activation_peak_bytes": s["modelled_activation_peak_bytes"],
        "planned_saved_bytes": s["planned_saved_bytes"],
        "compressed_bytes_saved": s["compressed_bytes_saved"],
        "predicted_peak_bytes": s["predicted_peak_bytes"],
        "predicted_activation_peak_bytes": s["predicted_activation_peak_bytes"],
        "activation_peak_fits_budget": s["activation_peak_fits_budget"],
        "estimated_added_seconds": s["estimated_added_seconds"],
        "estimated_step_seconds": s["estimated_step_seconds"],
        "matmul_recomputes": sum(1 for r in report["plan"] if r["decision"] == "recompute" and r["op_class"] == "matmul"),
        "warnings": sorted({str(w.message)[:300] for w in caught}),
    }


def time_default_partition(
    captured: CapturedJoint, min_cut: bool = False, copy_graph: Any = copy.deepcopy
) -> float:
    """Seconds of PyTorch's own `default_partition` (or, ``min_cut=True``,
    the min-cut partitioner Inductor uses) on a copy of the same joint graph
    (made by ``copy_graph``): the fw/bw extraction any partitioner pays.
    Under lazy graph modules, as Inductor's ``compile_fx`` runs every
    partitioner (and as adacc's pipeline runs): new GraphModules generate
    their code on first call."""
    from functorch.compile import default_partition, min_cut_rematerialization_partition

    gm = copy_graph(captured.gm)
    partition = min_cut_rematerialization_partition if min_cut else default_partition
    with compat.lazy_graph_modules():
        start = time.perf_counter()
        partition(gm, captured.joint_inputs, **captured.kwargs)
        return time.perf_counter() - start


def profile_plan(captured: CapturedJoint, options: dict[str, Any], path: str, top: int = 30) -> str:
    profiler = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profiler.enable()
        captured.plan(options)
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    with open(path, "w") as f:
        f.write(f"cProfile of one plan, options {options}\n\n" + out.getvalue())
    return out.getvalue()


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | micro-batch | block reuse | candidates (solved) | planning s (structure+budget+plan) | decide s (planning - rewrite) | MILP solve s (budget + policy) | rewrite s (torch fw/bw split + codec insert) | simulate s | other stages s | pipeline wall s (cpu s) | torch default_partition s / min-cut s (same graph) | replans | keep/rec/comp | codecs | matmul rec | est. added ms (% of step) | default saved | planned saved | act. peak | step peak | + weights | budget | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        st = r["stage_seconds"]
        parts = r["plan_parts_seconds"]
        solve = st["budget"] + parts.get("policy (MILP solve)", 0.0)
        other = sum(v for k, v in st.items() if k not in ("structure", "budget", "plan"))
        br = r["block_reuse"]
        d = r["decisions"]
        codecs = ", ".join(f"{k} x{v}" for k, v in sorted(r["codecs"].items())) or "-"
        lines.append(
            f"| {r['model']} | {r['micro_batch']} | {'yes' if br.get('used') else 'no'} "
            f"| {br.get('candidates_full', r['num_candidates'])} ({br.get('candidates_solved', r['num_candidates'])}) "
            f"| {r['planning_seconds']:.2f} | {r['decide_seconds']:.2f} | {solve:.2f} | {r['rewrite_seconds']:.2f} "
            f"| {parts.get('simulate_step', 0.0) + parts.get('simulate', 0.0):.2f} | {other:.2f} | {r['wall_seconds']:.1f} ({r['cpu_seconds']:.1f}) "
            f"| {r.get('default_partition_seconds', float('nan')):.1f} / {r.get('min_cut_seconds', float('nan')):.1f} "
            f"| {r['replans']} | {d['keep']}/{d['recompute']}/{d['compress']} | {codecs} | {r['matmul_recomputes']} "
            f"| {1e3 * r['estimated_added_seconds']:.3f} ({100 * r['estimated_added_seconds'] / max(r['estimated_step_seconds'], 1e-12):.1f}%) "
            f"| {gib(r['baseline_saved_bytes'])} | {gib(r['planned_saved_bytes'])} | {gib(r['predicted_activation_peak_bytes'])} "
            f"| {gib(r['predicted_peak_bytes'])} | {gib(r['predicted_peak_bytes'] + 2 * r['params'])} "
            f"| {gib(r['budget_bytes'])} | {'yes' if r['activation_peak_fits_budget'] else 'NO'} |"
        )
    return "\n".join(lines)


def stage_table(rows: list[dict[str, Any]]) -> str:
    names = list(rows[0]["stage_seconds"]) if rows else []
    parts = sorted({k for r in rows for k in r["plan_parts_seconds"]})
    lines = [
        "| model | mb | block reuse | " + " | ".join(names) + " | plan: " + " | plan: ".join(parts) + " |",
        "|---|---|---|" + "---|" * (len(names) + len(parts)),
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['micro_batch']} | {'yes' if r['block_reuse'].get('used') else 'no'} | "
            + " | ".join(f"{r['stage_seconds'].get(n, 0.0):.2f}" for n in names)
            + " | "
            + " | ".join(f"{r['plan_parts_seconds'].get(p, 0.0):.2f}" for p in parts)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batches", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--budget", default="60GiB", help="activation memory_budget of the 7B plans")
    parser.add_argument("--accuracy", default="lossless")
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--solver-time-limit", type=float, default=60.0)
    parser.add_argument("--small-layers", type=int, default=32, help="layers of the small Llama (0 = skip)")
    parser.add_argument("--small-seq-len", type=int, default=256)
    parser.add_argument("--small-batch", type=int, default=4)
    parser.add_argument("--small-budget", default="0.5")
    parser.add_argument("--no-full-milp", action="store_true", help="skip the block_reuse=False plans of the 7B model")
    parser.add_argument("--profile-run", action="store_true", help="cProfile one block-reuse 7B plan")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="also plan once more after gc.freeze() (is Python's cyclic GC a cost?)")
    parser.add_argument("--tag", default="", help="suffix of the output file names")
    parser.add_argument("--out-dir", default="bench/results")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python bench/bench_llm_scale.py " + " ".join(sys.argv[1:] if argv is None else argv)

    rows: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    notes: list[str] = []
    profile_text = ""
    base_options = {"accuracy": args.accuracy, "device_profile": args.profile,
                    "solver_time_limit_s": args.solver_time_limit}

    warmed = []

    def run(model: str, cfg: LlamaConfig, micro_batch: int, budget: str, reuse_modes: list[bool]) -> CapturedJoint:
        start = time.perf_counter()
        captured = capture_joint(lambda: build_model("llama", cfg, torch.bfloat16), lambda: gpt_batch(cfg, micro_batch))
        if not warmed:  # one-time costs (imports, codec registration, calibration) out of the timings
            warm_cfg = small_config(2, 64)
            warm = capture_joint(lambda: build_model("llama", warm_cfg, torch.bfloat16), lambda: gpt_batch(warm_cfg, 1))
            plan_once(warm, {**base_options, "memory_budget": 0.5})
            warmed.append(True)
        with torch._subclasses.FakeTensorMode():
            params = count_parameters(build_model("llama", cfg, torch.bfloat16))
        traces.append({"model": model, "micro_batch": micro_batch, "trace_seconds": captured.trace_seconds,
                       "joint_nodes": len(captured.gm.graph.nodes), "params": params})
        print(f"{model} mb{micro_batch}: traced under fake tensors in {time.perf_counter() - start:.1f} s, "
              f"{len(captured.gm.graph.nodes)} joint nodes, {params / 1e9:.2f} B params", flush=True)
        default_seconds = time_default_partition(captured)
        min_cut_seconds = time_default_partition(captured, min_cut=True)
        for reuse in reuse_modes:
            row = plan_once(captured, {**base_options, "memory_budget": budget, "block_reuse": reuse})
            rows.append({"model": model, "micro_batch": micro_batch, "trace_seconds": captured.trace_seconds,
                         "params": params, "default_partition_seconds": default_seconds,
                         "min_cut_seconds": min_cut_seconds, **row})
            print(table([rows[-1]]).splitlines()[-1], flush=True)
        return captured

    if args.small_layers:
        cfg = small_config(args.small_layers, args.small_seq_len)
        run(f"Llama {args.small_layers}L d256", cfg, args.small_batch, args.small_budget, [True, False])
    cfg = llama7b_config(args.seq_len)
    last = None
    for mb in args.micro_batches:
        last = run("Llama-7B shape", cfg, mb, args.budget, [True] if args.no_full_milp else [True, False])
    if args.gc_freeze and last is not None:
        gc.collect()
        gc.freeze()
        row = plan_once(last, {**base_options, "memory_budget": args.budget, "block_reuse": True})
        gc.unfreeze()
        rows.append({"model": "Llama-7B shape, gc.freeze()", "micro_batch": args.micro_batches[-1],
                     "trace_seconds": 0.0, "params": traces[-1]["params"], **row})
        print(table([rows[-1]]).splitlines()[-1], flush=True)
    if args.profile_run and last is not None:
        path = os.path.join(args.out_dir, f"llm_scale_profile{args.tag}.txt")
        profile_text = profile_plan(last, {**base_options, "memory_budget": args.budget, "block_reuse": True}, path)
        notes.append(f"cProfile of a block-reuse plan (micro-batch {args.micro_batches[-1]}): `{path}`.")

    budget_bytes = parse_bytes(args.budget) if not args.budget.replace(".", "").isdigit() else None
    for r in rows:
        if r["model"].startswith("Llama-7B") and r["params"]:
            weights = 2 * r["params"]  # bf16 parameters (graph inputs, not in the simulated peak)
            r["peak_plus_weights_bytes"] = r["predicted_peak_bytes"] + weights
    header = (
        f"## LLM-scale planning under fake tensors — {datetime.date.today()} — {platform.machine()} CPU, "
        f"{os.cpu_count()} cores (shared with other jobs), torch {torch.__version__}\n\n"
        f"Command: `{command}`\n\n"
        f"Llama-7B shape: 32 layers, hidden 4096, 32 heads, FFN 11008, vocab 32000, seq {args.seq_len}, bf16, "
        f"memory_budget {args.budget}"
        + (f" ({budget_bytes / 1e9:.1f} GB)" if budget_bytes else "")
        + f", accuracy {args.accuracy}, device_profile {args.profile}. "
        f"Small: Llama {args.small_layers} layers, d_model 256, 4 heads, FFN 688, seq {args.small_seq_len}, "
        f"batch {args.small_batch}, bf16, memory_budget {args.small_budget}. "
        "planning s = stage_seconds structure + budget + plan; decide s = planning minus the graph rewrite "
        "(what adacc adds to any partitioner: block folding, budget, MILP solves, memory simulation, re-plans); "
        "rewrite s = `split_joint_graph` + `apply_compression`; torch default_partition s = PyTorch's own "
        "partitioner on a copy of the same joint graph (its fw/bw extraction is the same work as the split); MILP solve s = budget stage (the fastest plan, and PyTorch's min-cut choice as the anchor) + "
        "the policy's solve in the plan stage; the split is PyTorch's "
        "`_extract_fwd_bwd_modules` + autograd-order reordering on lazily compiled FX modules; "
        "pipeline wall s = every stage (cpu s = process CPU time, less sensitive to the shared machine's load). "
        "act. peak = predicted_activation_peak_bytes (what the budget caps); step peak = predicted_peak_bytes "
        "(activations + gradients + temporaries; parameters, being graph inputs, are not counted; "
        "+ weights = step peak plus the bf16 parameters, what the GPU holds at the peak without optimizer state).\n"
    )
    trace_lines = ["| model | micro-batch | Dynamo+AOT trace s (fake) | joint nodes | params |", "|---|---|---|---|---|"]
    trace_lines += [f"| {t['model']} | {t['micro_batch']} | {t['trace_seconds']:.1f} | {t['joint_nodes']} | {t['params'] / 1e9:.3f} B |" for t in traces]
    body = (
        header + "\n### Plans\n\n" + table(rows) + "\n\n### Stage seconds\n\n" + stage_table(rows)
        + "\n\n### Tracing\n\n" + "\n".join(trace_lines) + "\n\n"
        + "".join(f"- {n}\n" for n in notes)
        + "".join(f"- warning ({r['model']}, mb {r['micro_batch']}, block reuse {r['block_reuse'].get('used')}): {w}\n"
                  for r in rows for w in r["warnings"] if not any(k in w for k in ("hashes produced", "LeafSpec")))
    )
    print(body)
    if profile_text:
        print("\n".join(profile_text.splitlines()[:60]))
    with open(os.path.join(args.out_dir, f"llm_scale{args.tag}.md"), "w") as f:
        f.write(body)
    with open(os.path.join(args.out_dir, f"llm_scale{args.tag}.json"), "w") as f:
        json.dump({"command": command, "traces": traces, "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
