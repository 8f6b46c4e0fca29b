"""What block reuse costs in plan quality: the plan solved over one block per
class (the first block differentiated deciding on its own), against the
MILP over every block, on the same Hugging Face graph.

    python bench/bench_folding.py [--families llama gpt2] [--layers 4 8]
        [--shares 1.0 0.75 0.5 0.25 0.1] [--d-model 128] [--seq-len 64]
        [--batch 2] [--tag T] [--out-dir bench/results]

For each model the joint graph of one training step (``labels=``, the
largest graph) is planned twice by adacc's pipeline, once with
``block_reuse`` and once without, so both problems carry the memory model
the planner would use. Each is then solved by HiGHS at byte budgets a
share of the way from the reachable minimum (the higher of the two
problems' lowest modelled peaks) to the default partitioner's peak, and
the plans are compared on the problem over every block: estimated
recomputation time (``added_seconds``), the exact rows' peak (is the folded
plan within the budget by the rows over every block?) and solve time.
Planning only: nothing is compiled or run.

Outputs under --out-dir: folding{tag}.md and folding{tag}.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import adacc_compile  # noqa: E402,F401  (first: drops the repo root, whose kernels/ shadows Hugging Face's)
from bench_planning import capture, copy_graph, model_arguments  # noqa: E402

from adacc_compile.config import AdaccConfig  # noqa: E402
from adacc_compile.passes.budget import modelled_peak  # noqa: E402
from adacc_compile.passes.fusion import Realization  # noqa: E402
from adacc_compile.passes.milp import SolverOptions, solve_milp  # noqa: E402
from adacc_compile.passes.plan_problem import PlanProblem, PlanSolution, added_seconds  # noqa: E402
from adacc_compile.stage_runner import run_pipeline  # noqa: E402
from adacc_compile.state import PartitionState  # noqa: E402


def planned_state(captured, *, reuse: bool, profile: str) -> PartitionState:
    """adacc's pipeline on a copy of the captured joint graph, at a ratio
    budget of 1.0 (the problems do not depend on the budget)."""
    config = AdaccConfig.from_options({"memory_budget": 1.0, "device_profile": profile, "block_reuse": reuse})
    kwargs = captured.kwargs
    state = PartitionState(
        joint=copy_graph(captured.gm), config=config, num_fwd_outputs=kwargs["num_fwd_outputs"],
        static_lifetime_input_indices=list(kwargs.get("static_lifetime_input_indices") or []),
        mode=Realization.INDUCTOR,
    )
    run_pipeline(state)
    return state


def _solve(problem: PlanProblem, budget: int | None, options: SolverOptions, **kw: Any) -> tuple[PlanSolution, float]:
    start = time.perf_counter()
    solution = solve_milp(dataclasses.replace(problem, budget_bytes=budget, boundary_budget_bytes=None), options, **kw)
    return solution, time.perf_counter() - start


def compare(family: str, layers: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    captured = capture(family, layers, args)
    unfolded_state = planned_state(captured, reuse=False, profile=args.profile)
    folded_state = planned_state(captured, reuse=True, profile=args.profile)
    full = unfolded_state.candidates.problem
    reduction = folded_state.reduction
    assert reduction.used and not unfolded_state.reduction.used
    options = SolverOptions()
    lowest, _ = _solve(full, None, options, minimize="peak")
    folded_lowest, _ = _solve(reduction.problem, None, options, minimize="peak")
    minimum_full = modelled_peak(full, lowest)
    minimum_folded = modelled_peak(full, reduction.expand(folded_lowest))
    minimum = max(minimum_full, minimum_folded)
    default = folded_state.budget.default_peak_bytes
    rows = []
    for share in args.shares:
        budget = int(minimum + share * (default - minimum))
        unfolded, unfolded_s = _solve(full, budget, options)
        folded_reduced, folded_s = _solve(reduction.problem, budget, options)
        folded = reduction.expand(folded_reduced)
        ok = bool(unfolded.choices and folded.choices)
        rows.append({
            "family": family, "layers": layers, "share": share, "budget_bytes": budget,
            "minimum_unfolded_bytes": minimum_full, "minimum_folded_bytes": minimum_folded,
            "candidates_unfolded": len(full.candidates), "candidates_folded": len(reduction.problem.candidates),
            "deciding_apart": list(getattr(reduction, "apart", ())),  # absent before blocks decided apart
            "unfolded_added_seconds": added_seconds(full, unfolded) if ok else None,
            "folded_added_seconds": added_seconds(full, folded) if ok else None,
            "folded_exact_peak_bytes": modelled_peak(full, folded) if folded.choices else None,
            "unfolded_solve_seconds": unfolded_s, "folded_solve_seconds": folded_s,
            "status": [unfolded.status, folded_reduced.status],
        })
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | layers | share | budget B | unfolded added µs | folded added µs | folded / unfolded "
        "| folded plan's exact peak ≤ budget | solve s unfolded / folded |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        if r["unfolded_added_seconds"] is None:
            lines.append(f"| {r['family']} | {r['layers']} | {r['share']} | {r['budget_bytes']} | - | - | - "
                         f"| - | {r['status']} |")
            continue
        ratio = r["folded_added_seconds"] / max(r["unfolded_added_seconds"], 1e-15)
        lines.append(
            f"| {r['family']} | {r['layers']} | {r['share']} | {r['budget_bytes']} "
            f"| {r['unfolded_added_seconds'] * 1e6:.2f} | {r['folded_added_seconds'] * 1e6:.2f} | {ratio:.4f} "
            f"| {'yes' if r['folded_exact_peak_bytes'] <= r['budget_bytes'] else 'no'} "
            f"({r['folded_exact_peak_bytes']}) "
            f"| {r['unfolded_solve_seconds']:.2f} / {r['folded_solve_seconds']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser, layers=[4, 8], d_model=128, seq_len=64)
    parser.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.75, 0.5, 0.25, 0.1])
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python bench/bench_folding.py " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = []
    for family in args.families:
        for layers in args.layers:
            rows.extend(compare(family, layers, args))
            print(table([r for r in rows if r["family"] == family and r["layers"] == layers]), flush=True)
    minima = sorted({(r["family"], r["layers"], r["minimum_unfolded_bytes"], r["minimum_folded_bytes"]) for r in rows})
    text = "\n".join([
        f"# Folded against unfolded plans ({datetime.date.today().isoformat()})", "",
        f"`{command}`", "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {platform.machine()}; d_model {args.d_model}, "
        f"seq {args.seq_len}, batch {args.batch}, cost model {args.profile}.", "",
        table(rows), "",
        "Reachable minimum (lowest modelled peak), unfolded / folded:", "",
        *[f"* {f} {n} layers: {a} / {b} bytes ({b / a:.4f}x)" for f, n, a, b in minima],
    ])
    with open(os.path.join(args.out_dir, f"folding{args.tag}.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(args.out_dir, f"folding{args.tag}.json"), "w") as fh:
        json.dump({"command": command, "rows": rows}, fh, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
