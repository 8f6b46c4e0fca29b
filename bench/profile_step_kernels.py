"""Where a training step's time goes, kernel by kernel, for a few plans side by side (CPU, Inductor).

    python bench/profile_step_kernels.py [--model gpt] [--budget 0.6]
        [--families recompute-only mixed/balanced] [--profile auto]
        [--steps 5] [--top 12] [--out FILE.md]

Why: the planner picks a codec over recomputing a matmul when its cost
model says the codec is cheaper; when the measured step disagrees (a mixed
plan slower than recompute-only although its estimate was lower), the
question is which kernels took the time. Timed steps only say *that* they
differ. This compiles the plans of ``--families`` at ``--budget`` (as
`bench_fused_steps` does) with Inductor's per-kernel profiling on
(``cpp.enable_kernel_profile``), runs ``--steps`` steps of each under the
profiler and reports self CPU time per step in three groups:

    matmul     the extern BLAS calls (aten::mm / addmm / bmm / baddbmm)
    generated  Inductor's C++ kernels (graph_N_cpp_fused_*): every codec lives here,
               fused with its producer or reader
    other      everything else (the optimizer, autograd, copies, allocation)

then the largest generated kernels of each plan, and the planner's
estimate of what each plan adds, so the two can be set side by side. The
profiler's own overhead is in every figure alike; read the differences.
One profile of a few steps is not a benchmark: `bench_fused_steps` gives
the step times (interleaved medians).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_pareto import FAMILIES, build_model, model_config  # noqa: E402

import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.benchmarking import Variant, VariantResult, run_variants  # noqa: E402
from adacc_examples.models import gpt_batch, init_weights  # noqa: E402

MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
GROUPS = ("matmul", "generated", "other")


def group_of(name: str) -> str:
    """Which of `GROUPS` a profiler event belongs to, by its name."""
    if name in MATMUL_OPS:
        return "matmul"
    if "cpp_fused" in name or "cpp_kernel" in name:  # e.g. "graph_0_cpp_fused_gelu_mean_pow_0"
        return "generated"
    return "other"


def grouped_seconds(kernel_seconds: dict[str, float]) -> dict[str, float]:
    """Seconds per step in each of `GROUPS`, and their total."""
    out = dict.fromkeys(GROUPS, 0.0)
    for name, seconds in kernel_seconds.items():
        out[group_of(name)] += seconds
    out["total"] = sum(out[g] for g in GROUPS)
    return out


def groups_table(results: list[VariantResult]) -> str:
    """One row per plan: ms per step in each group, and the difference to
    the first plan; the planner's estimated added ms beside them."""
    base = grouped_seconds(results[0].kernel_seconds)
    lines = [
        "| plan | matmul ms | generated ms | other ms | total ms | total vs first, ms | planner's estimated added ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        g = grouped_seconds(r.kernel_seconds)
        est = "" if r.estimated_added_seconds is None else f"{r.estimated_added_seconds * 1e3:.1f}"
        lines.append(
            f"| {r.name} | {g['matmul'] * 1e3:.1f} | {g['generated'] * 1e3:.1f} | {g['other'] * 1e3:.1f} "
            f"| {g['total'] * 1e3:.1f} | {(g['total'] - base['total']) * 1e3:+.1f} | {est} |"
        )
    return "\n".join(lines)


def top_kernels_table(result: VariantResult, top: int) -> str:
    """The ``top`` largest generated kernels and matmul ops of one plan."""
    rows = sorted(
        ((s, n) for n, s in result.kernel_seconds.items() if group_of(n) != "other"), reverse=True
    )[:top]
    lines = ["| kernel | group | ms per step |", "|---|---|---:|"]
    lines += [f"| `{name}` | {group_of(name)} | {seconds * 1e3:.2f} |" for seconds, name in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt", choices=["gpt", "llama"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--budget", type=float, default=0.6)
    parser.add_argument("--families", nargs="+", default=["recompute-only", "mixed/balanced"], choices=list(FAMILIES))
    parser.add_argument("--profile", default="auto")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    cfg = model_config(args.model, args)
    model = init_weights(build_model(args.model, cfg))
    gen = torch.Generator().manual_seed(0)
    batches = [gpt_batch(cfg, args.batch, gen) for _ in range(2)]
    planned = [
        Variant(
            name=f"{family} @{args.budget:g} [{args.profile}]",
            kind="adacc",
            options={**FAMILIES[family], "memory_budget": args.budget, "device_profile": args.profile},
        )
        for family in args.families
    ]
    with inductor_config.patch({"fallback_random": True, "cpp.enable_kernel_profile": True}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_variants(model, batches, planned, timing_repeats=1, kernel_profile_steps=args.steps)
    command = "python bench/profile_step_kernels.py " + " ".join(sys.argv[1:] if argv is None else argv)
    parts = [
        f"## Kernel profile of training steps — {datetime.date.today()} — {platform.machine()} CPU, "
        f"{args.threads} thread(s), torch {torch.__version__}\n\nCommand: `{command}`\n\n"
        f"{args.model}: {args.layers} layers, d_model {args.d_model}, seq {args.seq_len}, batch {args.batch}, "
        f"fp32; self CPU ms per step, mean of {args.steps} profiled steps.\n",
        groups_table(results),
    ]
    for r in results:
        parts.append(f"### {r.name}\n\n" + top_kernels_table(r, args.top))
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
