"""adacc vs the baselines: measured and predicted peak memory, step time,
planning and compile time, for GPT-style and Llama-style models at several
budgets.

    python bench/bench_memory.py [--budgets 0.3 0.5 0.7] [--models gpt llama]
        [--layers 2] [--d-model 128] [--seq-len 128] [--batch 4] [--repeats 5]
        [--out bench/results/memory.md]

Baselines that do not depend on the budget (no checkpointing, full AC) run
once per model; every row's ratios are against "no checkpointing" of the
same model in the same run. Step times: medians of interleaved repeats.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import torch

import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.benchmarking import Variant, results_table, run_variants
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights


def model_and_batches(name: str, args: argparse.Namespace):
    common = dict(n_layer=args.layers, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab_size=512)
    if name == "gpt":
        cfg = GPTConfig(**common, dropout=0.1)
        model = GPT(cfg)
    else:
        cfg = LlamaConfig(**common, ffn_dim=int(args.d_model * 8 / 3))
        model = Llama(cfg)
    gen = torch.Generator().manual_seed(0)
    return init_weights(model), [gpt_batch(cfg, args.batch, gen) for _ in range(args.steps)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    parser.add_argument("--models", nargs="+", default=["gpt", "llama"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ilp", action="store_true", help="skip PyTorch's ilp solver")
    parser.add_argument("--out", default="bench/results/memory.md")
    args = parser.parse_args(argv)
    import torch._inductor.config as inductor_config

    sections = []
    raw = {}
    for name in args.models:
        model, batches = model_and_batches(name, args)
        variants = [Variant(name="no checkpointing", kind="inductor"), Variant(name="full AC", kind="full_ac")]
        for b in args.budgets:
            variants.append(Variant(name=f"torch dp @{b:g}", kind="torch_budget", budget=b, solver="dp"))
            if not args.no_ilp:
                variants.append(Variant(name=f"torch ilp @{b:g}", kind="torch_budget", budget=b, solver="ilp"))
            variants.append(Variant(name=f"adacc @{b:g}", kind="adacc", options={"memory_budget": b}))
        with inductor_config.patch(fallback_random=True):
            results = run_variants(model, batches, variants, timing_repeats=args.repeats)
        sections.append(f"### {name}: {args.layers} layers, d_model {args.d_model}, seq {args.seq_len}, batch {args.batch}\n\n"
                        + results_table(results, reference="no checkpointing"))
        raw[name] = [
            {k: getattr(r, k) for k in ("name", "peak_bytes", "predicted_peak_bytes", "planned_saved_bytes",
                                        "baseline_saved_bytes", "estimated_added_seconds", "planning_seconds",
                                        "compile_seconds", "step_seconds", "losses")}
            for r in results
        ]
        print(sections[-1], flush=True)
    header = (
        f"## Memory / speed vs baselines — {datetime.date.today()} — {platform.machine()} CPU, "
        f"{os.cpu_count()} cores, torch {torch.__version__}\n\n"
        f"Command: `python bench/bench_memory.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
        "peak = measured peak of one fw+bw step (profiler allocator trace); predicted = adacc's simulator; "
        "ratios vs no checkpointing of the same model in the same run; step ms = median of interleaved repeats.\n"
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(header + "\n" + "\n\n".join(sections) + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
