"""Adaptive re-planning: monitoring overhead and the loss of a shifted run (CPU).

    python bench/bench_adaptive.py [--backend adacc] [--steps 60] [--shift-at 20]
        [--accuracy aggressive] [--out-dir bench/results]

A char-level GPT (2 layers, d_model 128, seq 64, batch 8, fp32; the text of
``pydoc_data.topics``) trains with AdamW under ``memory_budget=0.5``,
keep-or-compress plans (``allow_recompute=False``: every saved value the
budget cannot keep is compressed, so drift matters), ``device_profile="h100"``.

1. Overhead: the step time without monitoring (median over the steps after
   the first, ``adapt=False``) and the time of one check (``adapt_every=1``,
   median of the checks), hence the overhead of a check every k steps,
   check / (k * step), for k in 1, 5, 10, 20, 50, 100 (the default
   ``adapt_every`` is 100).
2. Loss curves: at ``--shift-at`` six channels of block 1's ``ln_2`` weight
   are scaled 60x (the MLP's input grows six outlier channels; its int
   payload keeps ``C/64`` exact). Runs: *adapt* (``adapt=True``,
   ``adapt_every=5``), *static* (the step-0 plan throughout), *replanned
   at shift* (Dynamo reset and a fresh compile, calibrated on the shifted
   model, right at the shift: the plan made with the shifted statistics from
   the moment they exist) and *uncompressed* (eager PyTorch).

Writes adaptive.json, adaptive.md and adaptive.png (matplotlib) to --out-dir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _examples_path  # noqa: F401,E402  (examples/ on sys.path)
from adacc_examples.models import GPT, GPTConfig, init_weights  # noqa: E402
from adacc_examples.text_data import load_char_corpus  # noqa: E402

from adacc_compile.adaptation import graphs_of  # noqa: E402

SHIFTED_CHANNELS = [3, 10, 17, 29, 40, 55]
KS = (1, 5, 10, 20, 50, 100)


def options(args: argparse.Namespace, **extra) -> dict:
    return {"memory_budget": 0.5, "accuracy": args.accuracy, "allow_recompute": False,
            "device_profile": "h100", **extra}


def shift(model: GPT) -> None:
    with torch.no_grad():
        model.blocks[1].ln_2.weight[SHIFTED_CHANNELS] *= 60.0


def run(args, cfg, batches, *, mode: str, shift_at: int | None, opts: dict | None) -> dict:
    """Trains one copy of the model; returns per-step losses and times."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = init_weights(GPT(cfg))
    compiled = torch.compile(model, backend=args.backend, options=opts) if opts is not None else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses, seconds = [], []
    for step, (x, y) in enumerate(batches):
        if step == shift_at:
            shift(model)
            if mode == "replanned at shift":
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=args.backend, options=opts)
        start = time.perf_counter()
        loss = compiled(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    out = {"mode": mode, "losses": losses, "seconds": seconds}
    if opts is not None and opts.get("adapt"):
        graph = graphs_of(model)[0]
        out["replans"] = graph.replans
        out["compiles"] = graph.compiles
        out["versions"] = [v.to_json() for v in graph.versions]
        out["check_seconds"] = [c.seconds for c in graph.checks]
        out["checks"] = [{"step": c.step, "drifts": list(c.drifts), "action": c.action,
                          "worst_error_over_bound": max((v["error"] / v["bound"] for v in c.values.values()), default=0.0)}
                         for c in graph.checks]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="adacc", choices=("adacc", "adacc_eager"))
    parser.add_argument("--accuracy", default="aggressive", choices=("balanced", "aggressive"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--shift-at", type=int, default=20)
    parser.add_argument("--overhead-steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="adacc: memory budget")
    corpus = load_char_corpus()
    cfg = GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=64, vocab_size=corpus.vocab_size, dropout=0.0)
    batches = corpus.batches(batch=8, seq_len=cfg.seq_len, steps=max(args.steps, args.overhead_steps), seed=0)

    base = run(args, cfg, batches[: args.overhead_steps], mode="no monitoring", shift_at=None, opts=options(args))
    every = run(args, cfg, batches[: args.overhead_steps], mode="check every step", shift_at=None,
                opts=options(args, adapt=True, adapt_every=1, adapt_max_replans=0))
    step_s = statistics.median(base["seconds"][1:])
    check_s = statistics.median(every["check_seconds"][1:])
    overhead = {k: check_s / (k * step_s) for k in KS}
    default_k = next((k for k in KS if overhead[k] < 0.02), KS[-1])

    runs = [
        run(args, cfg, batches[: args.steps], mode="adapt", shift_at=args.shift_at,
            opts=options(args, adapt=True, adapt_every=5)),
        run(args, cfg, batches[: args.steps], mode="static", shift_at=args.shift_at, opts=options(args)),
        run(args, cfg, batches[: args.steps], mode="replanned at shift", shift_at=args.shift_at, opts=options(args)),
        run(args, cfg, batches[: args.steps], mode="uncompressed", shift_at=args.shift_at, opts=None),
    ]
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "args": vars(args),
        "model": {"n_layer": 2, "d_model": 128, "seq_len": 64, "batch": 8, "vocab": corpus.vocab_size},
        "overhead": {"step_seconds": step_s, "check_seconds": check_s,
                     "fraction_by_adapt_every": overhead, "smallest_k_under_2pct": default_k},
        "runs": runs,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "adaptive.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out_dir, "adaptive.md"), "w") as f:
        f.write(markdown(result))
    plot(result, os.path.join(args.out_dir, "adaptive.png"))
    print(markdown(result))


def markdown(result: dict) -> str:
    a = result["args"]
    o = result["overhead"]
    lines = [
        "# Adaptive re-planning (CPU)",
        "",
        f"`python bench/bench_adaptive.py --backend {a['backend']} --accuracy {a['accuracy']} --steps {a['steps']} "
        f"--shift-at {a['shift_at']}` ({result['date']}, torch {result['torch']}, {a['threads']} thread). "
        "Char-level GPT, 2 layers, d_model 128, seq 64, batch 8, memory_budget 0.5, keep-or-compress plans, "
        "h100 cost model.",
        "",
        "## Monitoring overhead",
        "",
        f"Step {o['step_seconds'] * 1e3:.1f} ms (median, no monitoring); one check {o['check_seconds'] * 1e3:.1f} ms "
        "(median: a no-grad forward of the planned graph and a round trip of every lossy compressed value).",
        "",
        "| adapt_every | overhead (check / (k x step)) |",
        "|---:|---:|",
    ]
    lines += [f"| {k} | {100 * v:.2f}% |" for k, v in o["fraction_by_adapt_every"].items()]
    lines += ["", f"Smallest k under 2%: {o['smallest_k_under_2pct']}.", "", "## Shifted run", "",
              f"Shift at step {a['shift_at']}: six channels of block 1's ln_2 weight x60.", "",
              "| run | loss before shift (mean of last 5) | final loss (mean of last 5) | re-plans | compiles |",
              "|---|---:|---:|---:|---:|"]
    for r in result["runs"]:
        before = statistics.mean(r["losses"][a["shift_at"] - 5 : a["shift_at"]])
        final = statistics.mean(r["losses"][-5:])
        lines.append(f"| {r['mode']} | {before:.4f} | {final:.4f} | {r.get('replans', '-')} | {r.get('compiles', '-')} |")
    adapt = result["runs"][0]
    lines += ["", "Plan versions of the adapt run:", ""]
    for v in adapt.get("versions", []):
        changed = ", ".join(f"{k}: {c}" for k, c in v["changed"].items()) or "no decision changed"
        lines.append(f"* v{v['version']} from step {v['step']} ({v['trigger']}): {changed}"
                     + (f"; {'; '.join(v['reasons'][:3])}" if v["reasons"] else ""))
    lines += ["", "Checks of the adapt run (step: worst error / bound, drifts):", ""]
    for c in adapt.get("checks", []):
        lines.append(f"* {c['step']}: {c['worst_error_over_bound']:.2f}" + (f", {'; '.join(c['drifts'][:2])} -> {c['action']}" if c["drifts"] else ""))
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result["runs"]:
        ax.plot(range(len(r["losses"])), r["losses"], label=r["mode"], linewidth=1.2)
    ax.axvline(result["args"]["shift_at"], color="grey", linestyle=":", label="shift")
    for v in result["runs"][0].get("versions", [])[1:]:
        ax.axvline(v["step"] - 1, color="red", linestyle="--", linewidth=0.8, label=f"re-plan v{v['version']}")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title("adacc adaptive re-planning: shifted run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
