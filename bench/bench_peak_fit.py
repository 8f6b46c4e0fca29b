"""What the peak-fit search buys: plans with ``peak_fit_solves`` 0 and 3 side by side.

    python bench/bench_peak_fit.py [--models gpt llama] [--budgets 0.6 0.5 0.4]
        [--profile auto] [--solves 0 3] [--out-dir bench/results]

Planning only (no training step): each model's joint graph is traced once
under fake tensors (`bench_pareto.capture_joint`, the 2-layer d_model 256
models of bench_pareto and bench_fused_steps) and adacc's whole pipeline
plans it for every (family, budget, solves). For each plan the table gives
the budget, the MILP model's activation peak, the split graphs' simulated
activation and step peaks (what `memory_sim` predicts, within about 1 MiB
of Inductor's measured peak on these models: bench/RESULTS.md), the cost
model's added seconds, the re-solves and the planning wall time. With
``solves=0`` the model's plan is used as it is; with more, the search of
`passes.plan_search` moves the model's cap until the simulated activation
peak is within the budget and no more than 3% under it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_pareto import FAMILIES, build_model, capture_joint, model_config  # noqa: E402

import _examples_path  # noqa: F401,E402  (examples/ on sys.path)
from adacc_examples.models import gpt_batch  # noqa: E402

MIB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt", "llama"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.6, 0.5, 0.4])
    parser.add_argument("--families", nargs="+", default=["recompute-only", "mixed/balanced", "mixed/aggressive"])
    parser.add_argument("--profile", default="auto")
    parser.add_argument("--solves", type=int, nargs="+", default=[0, 3])
    parser.add_argument("--out-dir", default="bench/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shape = argparse.Namespace(layers=2, d_model=256, seq_len=256, batch=4)
    command = "python bench/bench_peak_fit.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = []
    for name in args.models:
        cfg = model_config(name, shape)
        captured = capture_joint(lambda: build_model(name, cfg), lambda: gpt_batch(cfg, shape.batch))
        for family in args.families:
            for budget in args.budgets:
                for solves in args.solves:
                    options = {**FAMILIES[family], "memory_budget": budget, "device_profile": args.profile,
                               "peak_fit_solves": solves}
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        report = captured.plan(options)
                    s = report["summary"]
                    rows.append({
                        "model": name, "family": family, "budget": budget, "solves": solves,
                        "budget_bytes": s["budget_bytes"],
                        "modelled_activation_peak_bytes": s["modelled_activation_peak_bytes"],
                        "predicted_activation_peak_bytes": s["predicted_activation_peak_bytes"],
                        "predicted_peak_bytes": s["predicted_peak_bytes"],
                        "estimated_added_seconds": s["estimated_added_seconds"],
                        "replans": s["replans"], "clamped": s["budget_clamped_to_minimum"],
                        "codecs": s["codecs"], "wall_seconds": report["wall_seconds"],
                    })
                    print(_row(rows[-1]), flush=True)
    header = (
        f"## Peak-fit search, planning only — {datetime.date.today()} — {platform.machine()} CPU, "
        f"torch {torch.__version__}, profile {args.profile}\n\nCommand: `{command}`\n\n"
        "| model | family | budget | solves | budget MiB | modelled act. MiB | simulated act. MiB "
        "| simulated step MiB | est. added ms | re-solves | planning s |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "peak_fit.md"), "w") as f:
        f.write(header + "\n".join(_row(r) for r in rows) + "\n")
    with open(os.path.join(args.out_dir, "peak_fit.json"), "w") as f:
        json.dump({"command": command, "rows": rows}, f, indent=1)
    return 0


def _row(r: dict) -> str:
    clamp = " (clamped)" if r["clamped"] else ""
    return (
        f"| {r['model']} | {r['family']} | {r['budget']:g}{clamp} | {r['solves']} | {r['budget_bytes'] / MIB:.2f} "
        f"| {r['modelled_activation_peak_bytes'] / MIB:.2f} | {r['predicted_activation_peak_bytes'] / MIB:.2f} "
        f"| {r['predicted_peak_bytes'] / MIB:.2f} | {1e3 * r['estimated_added_seconds']:.1f} | {r['replans']} "
        f"| {r['wall_seconds']:.1f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
