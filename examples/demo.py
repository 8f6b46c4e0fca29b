"""The main job: a small GPT compiled with ``backend="adacc"`` trains a few
steps; prints the plan and the memory saved against the baselines.

    python examples/demo.py [--budget 0.5] [--steps 4] [--layers 4] [--accuracy lossless]

Every variant starts from the same weights and sees the same batches, so
the loss columns must agree: adacc's default plan is lossless. With
``--accuracy balanced`` (int8 with outlier channels, declared error 1.5%) or
``aggressive`` (fp8, int4, 8-bit softmax, few-bit GELU/SiLU) it may also
compress saved activations lossily; in the accuracy study (bench/RESULTS.md)
that moved the final loss by at most 0.48% (balanced) / 0.76% (aggressive).
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from adacc_examples.benchmarking import run_variants, standard_variants
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_compile.report import plan_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.5, help="memory budget ratio (0, 1]")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant")
    parser.add_argument(
        "--accuracy", default="lossless", choices=("lossless", "balanced", "aggressive"),
        help="codecs adacc may use: lossless (default, same gradients as eager), balanced (+int8), "
        "aggressive (+fp8/int4/...); see README 'Compression'",
    )
    parser.add_argument("--show-plan", action="store_true", help="print the full plan table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = GPTConfig(
        n_layer=args.layers, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab_size=512, dropout=0.1
    )
    model = init_weights(GPT(cfg)).to(device)
    gen = torch.Generator().manual_seed(0)
    batches = [tuple(t.to(device) for t in gpt_batch(cfg, args.batch, gen)) for _ in range(args.steps)]
    print(
        f"adacc demo: GPT {cfg.n_layer} layers, d_model {cfg.d_model}, seq {cfg.seq_len}, batch {args.batch}, "
        f"dropout {cfg.dropout}, budget {args.budget:g}, device {device}, torch {torch.__version__}"
    )
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fallback_random=True):
        results = run_variants(
            model, batches, standard_variants(args.budget, include_ilp=False, accuracy=args.accuracy),
            timing_repeats=args.repeats, device=device,
        )
    adacc = next(r for r in results if r.name.startswith("adacc"))
    for report in adacc.reports:
        s = report["summary"]
        print(
            f"\nplan (graph {s['graph_index']}): saved activations {s['baseline_saved_bytes'] / 2**20:.2f} MiB -> "
            f"{s['planned_saved_bytes'] / 2**20:.2f} MiB (budget {s['budget_bytes'] / 2**20:.2f} MiB), "
            f"est. +{1e3 * s['estimated_added_seconds']:.2f} ms recompute, "
            f"solver {s['solver_status']} in {s['solve_seconds']:.3f} s; decisions {s['decisions']}"
        )
        if args.show_plan:
            print(plan_table(report["plan"]))
    print("\nloss per step:")
    print("  step  " + "  ".join(f"{r.name:>22}" for r in results))
    for step in range(args.steps):
        print(f"  {step:>4}  " + "  ".join(f"{r.losses[step]:>22.5f}" for r in results))
    ref = results[0]
    print(f"\nmeasured peak memory of one training step and median step time ({args.repeats} interleaved repeats):")
    print(f"  {'variant':<24} {'peak MiB':>9} {'vs no-AC':>9} {'step ms':>9} {'vs no-AC':>9}")
    for r in results:
        print(
            f"  {r.name:<24} {r.peak_bytes / 2**20:>9.2f} {r.peak_bytes / ref.peak_bytes:>9.2f} "
            f"{1e3 * r.median_step_seconds:>9.1f} {r.median_step_seconds / ref.median_step_seconds:>9.2f}"
        )
    saved = 1 - adacc.peak_bytes / ref.peak_bytes
    print(f"\nadacc saves {100 * saved:.1f}% of the peak memory of no checkpointing.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
