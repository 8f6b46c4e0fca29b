"""Planning time against depth: adacc's planner beside PyTorch's min-cut
partitioner (Inductor's default) on the same joint graph.

    python bench/bench_planning.py [--families llama gpt2] [--layers 4 8 16 32]
        [--budgets 1.0 0.5 0.3 min] [--d-model 256] [--seq-len 256] [--batch 2]
        [--modes inductor eager] [--inductor-compile-layers 4] [--tag T]

For each Hugging Face family (random weights from a config, nothing
downloaded) and depth, Dynamo and AOTAutograd trace one training step under
fake tensors and the joint graph with the decoder layers is kept (real
tensors: Hugging Face models do not build under fake ones); then, on copies of that
graph:

* PyTorch's min-cut partitioner (``min_cut_rematerialization_partition``,
  what Inductor runs by default), timed;
* adacc's whole pipeline at each budget, for each realization: "inductor"
  (the planner as ``backend="adacc"`` runs it: fusion-aware simulation) and
  "eager" (``backend="adacc_eager"``). Reported: the planning time (the
  structure, budget and plan stages) and its parts from the summary
  (``planning``: MILP build, HiGHS solves and their count, fw/bw splits,
  memory simulation), the MILP's size, whether block reuse fired, and the
  whole pipeline's wall time. Budget "min" asks for 1 byte: the planner
  warns and plans its reachable minimum.

With ``--inductor-compile-layers N``, Inductor's whole compile of one
training step of the N-layer model (real tensors, caches off, default
partitioner) is timed once, for scale: the partitioner runs inside it.

Outputs under --out-dir: planning{tag}.md and planning{tag}.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import warnings
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adacc_compile  # noqa: E402,F401  (first: drops the repo root, whose kernels/ shadows Hugging Face's)
from bench_llm_scale import time_default_partition  # noqa: E402
from bench_pareto import CapturedJoint  # noqa: E402

from adacc_compile.config import AdaccConfig  # noqa: E402
from adacc_compile.partitioner import AdaccPartitioner  # noqa: E402

VOCAB = 8192


def hf_model(family: str, layers: int, d_model: int, seq_len: int) -> torch.nn.Module:
    import transformers

    heads = max(d_model // 64, 1)
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=d_model, intermediate_size=int(d_model * 8 / 3) // 16 * 16,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=seq_len,
        )
        return transformers.LlamaForCausalLM(config)
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=d_model, n_layer=layers, n_head=heads, n_positions=seq_len,
        )
        return transformers.GPT2LMHeadModel(config)
    raise ValueError(f"unknown family {family!r}; choose llama or gpt2")


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose nodes' metadata dicts are copies (the values
    in them shared): ``copy.deepcopy`` fails on an HF graph's fake tensors."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}), type_expr=None)
    return torch.fx.GraphModule(gm, graph)


def capture(family: str, layers: int, args: argparse.Namespace) -> CapturedJoint:
    """The joint graph of one training step of the model, with its decoder
    layers (the largest graph, where a loss follows a graph break). Real
    tensors: Hugging Face models do not build under a ``FakeTensorMode``."""
    from functorch.compile import default_partition
    from torch._dynamo.backends.common import aot_autograd

    captured: dict[str, Any] = {}

    def partition(gm, joint_inputs, **kwargs):
        if len(gm.graph.nodes) > len(captured["gm"].graph.nodes if "gm" in captured else ()):
            captured.update(gm=copy_graph(gm), joint_inputs=joint_inputs, kwargs=kwargs)
        return default_partition(gm, joint_inputs, **kwargs)

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_model(family, layers, args.d_model, args.seq_len)
    ids = torch.randint(0, VOCAB, (args.batch, args.seq_len))
    start = time.perf_counter()
    identity = lambda gm, example_inputs: gm  # noqa: E731
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=identity, bw_compiler=identity,
                                                         partition_fn=partition))
    compiled(input_ids=ids, labels=ids)
    seconds = time.perf_counter() - start
    torch._dynamo.reset()
    return CapturedJoint(captured["gm"], captured["joint_inputs"], captured["kwargs"], seconds)


def plan(captured: CapturedJoint, options: dict[str, Any], *, eager: bool) -> dict[str, Any]:
    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    partitioner.eager = eager
    gm = copy_graph(captured.gm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        partitioner(gm, captured.joint_inputs, **captured.kwargs)
        wall = time.perf_counter() - start
    summary = partitioner.reports[-1]["summary"]
    return {
        "wall_seconds": wall,
        "planning": summary["planning"],
        "stage_seconds": summary["stage_seconds"],
        "block_reuse": summary["block_reuse"],
        "solver_status": summary["solver_status"],
        "replans": summary["replans"],
        "plan_source": summary["plan_source"],
        "fits_budget": summary["fits_budget"],
        "budget_clamped_to_minimum": summary["budget_clamped_to_minimum"],
        "budget_bytes": summary["budget_bytes"],
        "predicted_activation_peak_bytes": summary["predicted_activation_peak_bytes"],
        "estimated_added_seconds": summary["estimated_added_seconds"],
        "warnings": sorted({str(w.message)[:200] for w in caught if "adacc" in str(w.message)}),
    }


def inductor_compile_seconds(family: str, layers: int, args: argparse.Namespace) -> float:
    """Inductor's whole compile of one training step (forward and backward
    graphs), default partitioner, caches off."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = hf_model(family, layers, args.d_model, args.seq_len)
    ids = torch.randint(0, VOCAB, (args.batch, args.seq_len))
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        compiled = torch.compile(model)
        start = time.perf_counter()
        compiled(ids).logits.float().mean().backward()
        seconds = time.perf_counter() - start
    torch._dynamo.reset()
    return seconds


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | layers | mode | budget | planning s | min-cut s | ratio | solves | HiGHS s | splits | split s "
        "| MILP rows x cols | reuse | fits |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        p = r["planning"]
        reuse = r["block_reuse"]
        lines.append(
            f"| {r['family']} | {r['layers']} | {r['mode']} | {r['budget']} | {p['seconds']:.2f} "
            f"| {r['min_cut_seconds']:.2f} | {p['seconds'] / r['min_cut_seconds']:.2f} | {p['solves']} "
            f"| {p['build_s'] + p['solve_s']:.2f} | {p['splits']} | {p['split_s']:.2f} "
            f"| {p['rows']} x {p['columns']} | {reuse['blocks'] if reuse['used'] else 'no'} "
            f"| {'yes' if r['fits_budget'] else 'no'}{' (min)' if r['budget_clamped_to_minimum'] else ''} |"
        )
    return "\n".join(lines)


def model_arguments(parser: argparse.ArgumentParser, *, layers: list[int], d_model: int, seq_len: int) -> None:
    """The options that say which HF models to capture, and where results go."""
    parser.add_argument("--families", nargs="+", default=["llama", "gpt2"])
    parser.add_argument("--layers", type=int, nargs="+", default=layers)
    parser.add_argument("--d-model", type=int, default=d_model)
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--profile", default="h100", help="device_profile of the plans")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", default="bench/results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser, layers=[4, 8, 16, 32], d_model=256, seq_len=256)
    parser.add_argument("--budgets", nargs="+", default=["1.0", "0.5", "0.3", "min"])
    parser.add_argument("--modes", nargs="+", default=["inductor", "eager"], choices=["inductor", "eager"])
    parser.add_argument("--inductor-compile-layers", type=int, nargs="*", default=[])
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python bench/bench_planning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows: list[dict[str, Any]] = []
    compiles: list[dict[str, Any]] = []
    warm: list[bool] = []
    for family in args.families:
        for layers in args.layers:
            captured = capture(family, layers, args)
            if not warm:  # one-time costs (imports, codec registration) out of the timings
                plan(captured, {"memory_budget": 1.0, "device_profile": args.profile}, eager=False)
                warm.append(True)
            min_cut = time_default_partition(captured, min_cut=True, copy_graph=copy_graph)
            print(f"{family} {layers}L: {len(captured.gm.graph.nodes)} joint nodes, traced in "
                  f"{captured.trace_seconds:.1f} s, min-cut {min_cut:.2f} s", flush=True)
            for mode in args.modes:
                for budget in args.budgets:
                    value: Any = "1B" if budget == "min" else float(budget)
                    options = {"memory_budget": value, "device_profile": args.profile}
                    row = {"family": family, "layers": layers, "mode": mode, "budget": budget,
                           "joint_nodes": len(captured.gm.graph.nodes), "trace_seconds": captured.trace_seconds,
                           "min_cut_seconds": min_cut, **plan(captured, options, eager=mode == "eager")}
                    rows.append(row)
                    print(table([row]).splitlines()[-1], flush=True)
            if layers in args.inductor_compile_layers:
                seconds = inductor_compile_seconds(family, layers, args)
                compiles.append({"family": family, "layers": layers, "inductor_compile_seconds": seconds})
                print(f"{family} {layers}L: Inductor's whole compile {seconds:.1f} s", flush=True)
    meta = {
        "date": datetime.date.today().isoformat(), "command": command, "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "d_model": args.d_model, "seq_len": args.seq_len,
        "batch": args.batch, "vocab": VOCAB, "profile": args.profile,
    }
    text = [f"# Planning time against depth ({meta['date']})", "", f"`{command}`", "",
            f"torch {meta['torch']}, {meta['cpus']} CPUs; d_model {args.d_model}, seq {args.seq_len}, "
            f"batch {args.batch}, vocab {VOCAB}, cost model {args.profile}.", "", table(rows), ""]
    if compiles:
        text += ["| family | layers | Inductor's whole compile s |", "|---|---:|---:|"]
        text += [f"| {c['family']} | {c['layers']} | {c['inductor_compile_seconds']:.1f} |" for c in compiles]
    with open(os.path.join(args.out_dir, f"planning{args.tag}.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    with open(os.path.join(args.out_dir, f"planning{args.tag}.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "inductor_compiles": compiles}, f, indent=1)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
