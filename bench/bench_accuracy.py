"""Accuracy study: a small character-level GPT trained on real English text
without checkpointing and with adacc lossless / balanced / aggressive plans,
from the same initial weights on the same batches.

    python bench/bench_accuracy.py [--steps 300] [--layers 2] [--d-model 128]
        [--seq-len 64] [--batch 8] [--lr 1e-3] [--budget 0.3] [--profile h100]
        [--variants eager lossless balanced aggressive] [--out-dir bench/results]

Text: the standard library's ``pydoc_data.topics`` help texts (nothing is
downloaded; `adacc_examples.text_data`). Optimiser: AdamW. adacc variants use
``backend="adacc_eager"`` (same partitioner as ``adacc``, graphs run
eagerly, codecs through their torch reference implementations) at
``memory_budget=--budget`` with ``device_profile=--profile``: the H100 cost
model makes compression cheap, so at a tight budget the planner compresses
(a study of what compression does to the loss, not of CPU speed).

Reported per variant: final train loss (mean of the last 20 steps) and its
relative difference to the uncompressed run, validation loss at the end,
what the plan compressed and with which codecs, and wall time. Outputs:
accuracy.md, accuracy.json, accuracy.png under --out-dir.

The activations here drift only as training moves them. The gradient error
per accuracy mode under a drift applied mid-run (attention sharpened, or
the MLP's layer norms scaled), with the re-plans and recompiles it caused,
is `bench/bench_sharp_attention.py`'s.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections import Counter
from typing import Any

import torch

from adacc_compile.config import AdaccConfig
import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.models import GPT, GPTConfig, count_parameters, init_weights
from adacc_compile.partitioner import AdaccPartitioner
from adacc_examples.text_data import load_char_corpus

ACCURACY_VARIANTS = ("lossless", "balanced", "aggressive")
COMPRESS_ONLY_VARIANTS = ("balanced_compress_only", "aggressive_compress_only")
"""Stress tests: ``allow_recompute=False``, so the plan compresses whatever
it can instead of recomputing (much more compression than the mixed plan)."""


def make_step_fn(model: torch.nn.Module, variant: str, args: argparse.Namespace):
    """The callable to train with, and the partitioner (None for eager)."""
    if variant in ("eager", "eager_bf16_init"):
        return model, None
    if variant == "inductor":  # no checkpointing; differs from eager only by fused-kernel rounding
        return torch.compile(model, backend="inductor"), None
    accuracy = variant.removesuffix("_compress_only")
    options = {"memory_budget": args.budget, "device_profile": args.profile, "accuracy": accuracy}
    if variant.endswith("_compress_only"):
        options["allow_recompute"] = False
    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    fn = torch.compile(model, backend=partitioner.backend(eager=True))
    return fn, partitioner


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches) -> float:
    model.eval()
    losses = [float(model(idx, tgt)) for idx, tgt in batches]
    model.train()
    return statistics.fmean(losses)


def plan_summary(partitioner: AdaccPartitioner | None) -> dict[str, Any]:
    if partitioner is None:
        return {}
    codecs: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    compressed_bytes = saved = baseline = 0
    for report in partitioner.reports:
        s = report["summary"]
        codecs.update(s["codecs"])
        decisions.update(s["decisions"])
        compressed_bytes += s["compressed_bytes_saved"]
        saved += s["planned_saved_bytes"]
        baseline += s["baseline_saved_bytes"]
        for r in report["plan"]:
            if r["decision"] == "compress":
                by_class[f"{r['op_class']}:{r['codec']}"] += 1
    return {
        "graphs": len(partitioner.reports),
        "codecs": dict(codecs),
        "decisions": dict(decisions),
        "compressed_by_op_class": dict(by_class),
        "compressed_bytes_saved": compressed_bytes,
        "planned_saved_bytes": saved,
        "baseline_saved_bytes": baseline,
        "estimated_added_seconds": sum(r["summary"]["estimated_added_seconds"] for r in partitioner.reports),
    }


def train(variant: str, base: torch.nn.Module, batches, val_batches, args: argparse.Namespace) -> dict[str, Any]:
    model = copy.deepcopy(base)
    if variant == "eager_bf16_init":
        # A perturbation nobody would call an accuracy loss (the init rounded
        # to bf16, <= 0.4% per weight): how far the final loss of this short
        # run moves by chaos alone, the scale to read the codecs' deltas on.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    torch._dynamo.reset()
    fn, partitioner = make_step_fn(model, variant, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    start = time.perf_counter()
    first_step = None
    for step, (idx, tgt) in enumerate(batches):
        torch.manual_seed(step)  # identical dropout masks, if any, in every variant
        optimizer.zero_grad(set_to_none=True)
        loss = fn(idx, tgt)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step == 0:
            first_step = time.perf_counter() - start
        if (step + 1) % 50 == 0:
            print(f"  {variant:10s} step {step + 1:4d} loss {statistics.fmean(losses[-20:]):.4f}", flush=True)
    wall = time.perf_counter() - start
    return {
        "variant": variant,
        "losses": losses,
        "final_loss": statistics.fmean(losses[-args.final_window:]),
        "val_loss": evaluate(model, val_batches),
        "wall_seconds": wall,
        "first_step_seconds": first_step,
        "plan": plan_summary(partitioner),
    }


def smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot(results: list[dict[str, Any]], path: str, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, diff_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    reference = results[0]["losses"]
    for i, r in enumerate(results):
        color = f"C{i}"
        ax.plot(smooth(r["losses"], window), label=f"{r['variant']} (final {r['final_loss']:.4f})", alpha=0.85, color=color)
        if r is not results[0]:
            rel = [100 * (a - b) / b for a, b in zip(r["losses"], reference)]
            diff_ax.plot(smooth(rel, window), label=r["variant"], alpha=0.85, color=color)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train loss (moving mean of {window})")
    ax.set_title("char-level GPT on pydoc_data.topics")
    ax.legend()
    ax.grid(alpha=0.3)
    diff_ax.axhline(0.5, color="gray", linestyle=":", label="+0.5%")
    diff_ax.axhline(-0.5, color="gray", linestyle=":")
    diff_ax.set_xlabel("step")
    diff_ax.set_ylabel(f"loss vs {results[0]['variant']} (%, moving mean of {window})")
    diff_ax.set_title("relative difference per step (same batches)")
    diff_ax.legend()
    diff_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(results: list[dict[str, Any]], final_window: int) -> str:
    ref = results[0]
    lines = [
        f"| variant | final train loss (mean last {final_window}) | vs uncompressed | val loss | vs uncompressed | compressed values (codecs) | decisions keep/rec/comp | compressed by op class | est. added us (H100 model) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        plan = r["plan"]
        codecs = ", ".join(f"{k} x{v}" for k, v in sorted(plan.get("codecs", {}).items())) or "-"
        by_class = ", ".join(f"{k} x{v}" for k, v in sorted(plan.get("compressed_by_op_class", {}).items())) or "-"
        d = plan.get("decisions", {})
        decisions = f"{d.get('keep', 0)}/{d.get('recompute', 0)}/{d.get('compress', 0)}" if d else "-"
        is_ref = r is ref
        train_rel = "reference" if is_ref else f"{100 * (r['final_loss'] - ref['final_loss']) / ref['final_loss']:+.3f}%"
        val_rel = "reference" if is_ref else f"{100 * (r['val_loss'] - ref['val_loss']) / ref['val_loss']:+.3f}%"
        compressed = f"{sum(plan['codecs'].values())} ({codecs})" if plan else "-"
        added = f"{1e6 * plan['estimated_added_seconds']:.1f}" if plan else "-"
        lines.append(
            f"| {r['variant']} | {r['final_loss']:.4f} | {train_rel} | {r['val_loss']:.4f} | {val_rel} "
            f"| {compressed} | {decisions} | {by_class} | {added} | {r['wall_seconds']:.0f} |"
        )
    return "\n".join(lines)


def seed_summary(by_seed: dict[int, list[dict[str, Any]]], variants: list[str]) -> tuple[str, list[str]]:
    """Per variant, the relative difference of final train / val loss to the
    reference variant, over seeds (mean, spread, worst)."""
    lines = [
        "| variant | Δ final train loss per seed | mean | max abs | Δ val loss per seed | mean | compressed values per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for i, variant in enumerate(variants[1:], start=1):
        train_rel, val_rel, comp = [], [], []
        for results in by_seed.values():
            ref, r = results[0], results[i]
            train_rel.append(100 * (r["final_loss"] - ref["final_loss"]) / ref["final_loss"])
            val_rel.append(100 * (r["val_loss"] - ref["val_loss"]) / ref["val_loss"])
            comp.append(sum(r["plan"].get("codecs", {}).values()) if r["plan"] else 0)
        mean_train = statistics.fmean(train_rel)
        worst = max(abs(v) for v in train_rel)
        lines.append(
            f"| {variant} | {', '.join(f'{v:+.3f}%' for v in train_rel)} | {mean_train:+.3f}% | {worst:.3f}% "
            f"| {', '.join(f'{v:+.3f}%' for v in val_rel)} | {statistics.fmean(val_rel):+.3f}% | {', '.join(map(str, comp))} |"
        )
        if variant.startswith("balanced"):
            verdicts.append(
                f"{variant}: mean Δ final loss {mean_train:+.3f}%, worst seed {worst:.3f}% — "
                + ("within 0.5% (the issue's bound for balanced) on every seed." if worst <= 0.5
                   else "NOT within 0.5% (the issue's bound for balanced) on every seed.")
            )
    return "\n".join(lines), verdicts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--variants", nargs="+", default=["eager", *ACCURACY_VARIANTS],
                        choices=["eager", "inductor", "eager_bf16_init", *ACCURACY_VARIANTS, *COMPRESS_ONLY_VARIANTS],
                        help="the first one is the reference; inductor = torch.compile without adacc (a "
                             "rounding-noise floor); eager_bf16_init = eager from the init rounded to "
                             "bf16 (a chaos-noise floor); *_compress_only = allow_recompute False")
    parser.add_argument("--final-window", type=int, default=20)
    parser.add_argument("--val-batches", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one run of every variant per seed (seed = init weights and batch order)")
    parser.add_argument("--tag", default="", help="suffix of the output file names")
    parser.add_argument("--out-dir", default="bench/results")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python bench/bench_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv)

    corpus = load_char_corpus()
    cfg = GPTConfig(
        vocab_size=corpus.vocab_size, seq_len=args.seq_len, n_layer=args.layers, n_head=args.heads,
        d_model=args.d_model, dropout=args.dropout,
    )
    val_batches = corpus.batches(batch=args.batch, seq_len=args.seq_len, steps=args.val_batches, seed=1, split="val")
    params = count_parameters(GPT(cfg))
    print(f"corpus: {corpus.train.numel() + corpus.val.numel()} chars, vocab {corpus.vocab_size}; "
          f"model {params / 1e6:.2f} M params", flush=True)
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        base = init_weights(GPT(cfg), seed=seed)
        batches = corpus.batches(batch=args.batch, seq_len=args.seq_len, steps=args.steps, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            by_seed[seed] = [train(variant, base, batches, val_batches, args) for variant in args.variants]
        torch._dynamo.reset()

    first = by_seed[args.seeds[0]]
    plot_path = os.path.join(args.out_dir, f"accuracy{args.tag}.png")
    plot(first, plot_path, window=10)
    sections = [f"### seed {seed}\n\n" + table(results, args.final_window) for seed, results in by_seed.items()]
    summary, verdicts = seed_summary(by_seed, args.variants)
    header = (
        f"## Accuracy: char-level GPT on pydoc_data.topics — {datetime.date.today()} — "
        f"{platform.machine()} CPU, torch {torch.__version__}\n\n"
        f"Command: `{command}`\n\n"
        f"Model: GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, seq {args.seq_len}, "
        f"vocab {corpus.vocab_size} (chars), dropout {args.dropout}, {params / 1e6:.2f} M params; "
        f"AdamW lr {args.lr}, batch {args.batch}, {args.steps} steps; per seed, every variant starts from the same "
        f"init and trains on the same batches (seeds {args.seeds}). "
        f"adacc variants: backend adacc_eager, memory_budget {args.budget}, device_profile {args.profile}. "
        f"Reference: {args.variants[0]}. Final loss = mean of the last {args.final_window} steps; "
        f"val loss = {args.val_batches} held-out batches after training. Plot (seed {args.seeds[0]}): `{plot_path}`.\n"
    )
    body = (header + "\n### Over seeds: relative difference to the reference\n\n" + summary + "\n\n"
            + "\n".join(verdicts) + "\n\n" + "\n\n".join(sections) + "\n")
    print(body)
    with open(os.path.join(args.out_dir, f"accuracy{args.tag}.md"), "w") as f:
        f.write(body)
    with open(os.path.join(args.out_dir, f"accuracy{args.tag}.json"), "w") as f:
        json.dump({"command": command, "args": vars(args), "results": {str(k): v for k, v in by_seed.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
