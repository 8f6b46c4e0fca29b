"""What ``adacc plan`` prints and, with ``--dump``, writes next to the usual
per-graph artifacts: the strategies side by side (``strategies.json``), the
report text (``report.txt``) and their simulated memory over the step
(``strategies_memory.png``, with matplotlib)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from adacc_compile.batch_search import BatchSearch
from adacc_compile.job_memory import JobMemory, TrainingSetup, profile_of
from adacc_compile.model_source import ModelSource
from adacc_compile.passes.device_profile import BUILTIN_PROFILES
from adacc_compile.plan_preview import Preview, Strategy
from adacc_compile.report import folded_plan_table, human_bytes


gib = human_bytes


def bounded_peak(strategy: Strategy, scope: str) -> int:
    """The peak of ``strategy`` the budget bounds under ``scope``
    (`AdaccConfig.budget_scope`): its step peak or its activation peak."""
    return strategy.step_peak_bytes if scope == "step" else strategy.activation_peak_bytes


def largest_batch_estimates(strategies: list[Strategy], budget: int, batch: int, scope: str) -> dict[str, int]:
    """Strategy name -> the largest batch whose bounded peak stays within
    ``budget``, estimated from the traced ``batch`` as a peak linear in the
    batch through zero (`batch_search`'s first guess; what does not grow
    with the batch, gradients under a step budget, makes it conservative).
    adacc's is at least full AC's: full AC's plan is one of its plans
    (`plan_search._full_ac_if_lower`). Estimates, not planned batches: the
    verified search runs only where the asked batch does not fit."""

    def estimate(peak: int) -> int:
        return max(budget, 0) * batch // peak if peak > 0 else 0

    out = {x.name: estimate(bounded_peak(x, scope)) for x in strategies}
    full_ac = next((x for x in strategies if x.name.startswith("full AC")), None)
    if full_ac is not None:
        out[strategies[0].name] = max(out[strategies[0].name], out[full_ac.name])
    return out


def _scope_label(scope: str) -> str:
    return "step peak" if scope == "step" else "activation peak"


def report_text(*, source: ModelSource, args: argparse.Namespace, result: Preview,
                search: BatchSearch | None) -> str:
    s = result.summary
    traced = result.traced
    budget = int(s["requested_budget_bytes"])
    scope = s.get("budget_scope", "activations")
    lines = [
        f"adacc plan: {source.description}",
        f"  batch {traced.batch} x seq {traced.seq}, {args.dtype}, parameters {gib(traced.parameter_bytes)}, "
        f"GPU profile {profile_of(args.gpu)} ({BUILTIN_PROFILES[profile_of(args.gpu)].name}), accuracy {args.accuracy}",
        f"  budget ({_scope_label(scope)}): {gib(budget)}" + _budget_origin(args.budget),
        f"  traced in {traced.trace_seconds:.1f} s ({len(traced.joint.gm.graph.nodes)} joint-graph nodes), "
        f"planned in {result.plan_seconds:.1f} s (MILP {s['solve_seconds']:.2f} s, {s['solver_status']}), "
        f"strategies simulated in {result.compare_seconds:.1f} s",
    ]
    fold = s.get("depth_fold") or {}
    fold_repeat = result.state.fold.repeat if result.state.fold is not None else None
    if fold.get("used"):
        traced_blocks, planned = fold["traced_blocks"], fold["planned_blocks"]
        lines.append(
            f"  depth folding: traced {traced_blocks} of {planned} identical blocks and planned all {planned}: "
            f"{fold['repeated_block']} stands for itself and {fold['copies']} more copies with its decisions "
            f"(--no-fold traces every block)"
        )
    if source.max_positions is not None and traced.seq > source.max_positions:
        lines.append(f"  note: seq {traced.seq} exceeds the config's max_position_embeddings {source.max_positions}")
    lines += ["", "Plan, folded by block (identical decisions share a row):", folded_plan_table(result.state.report["plan"], repeat=fold_repeat)]
    lines += ["", strategy_table(result.strategies, budget, traced.parameter_bytes, scope, traced.batch)]
    lines += ["", *verdict(result, search, budget)]
    return "\n".join(lines)


def _budget_origin(budget: str | None) -> str:
    if budget is None:
        return " (what the GPU has left: no --budget)"
    return "" if budget[-1:].isalpha() else f" (--budget {budget})"


def job_lines(job: JobMemory, setup: TrainingSetup, args: argparse.Namespace) -> list[str]:
    """The answer first: fits on the GPU or not, and one rank's step part
    by part (`job_memory`)."""
    ranks = f"{setup.gpus} x {args.gpu}" + (" with FSDP2" if setup.fsdp and setup.gpus > 1 else "")
    verb = "Fits" if job.fits_gpu else "Does not fit"
    lines = [
        f"{verb} on {ranks}: one rank's step peaks at {gib(job.total_peak_bytes)} of {gib(job.gpu_capacity_bytes)} "
        f"(batch {args.batch} x seq {args.seq}, {setup.optimizer}, {setup.precision}).",
        f"  {'part':<40} {'bytes':>12}",
    ]
    lines += [f"  {name:<40} {gib(nbytes):>12}" for name, nbytes in job.rows(fsdp=setup.fsdp and setup.gpus > 1)]
    lines.append(f"  {'total':<40} {gib(job.total_peak_bytes):>12}")
    static = job.total_peak_bytes - job.activation_peak_bytes
    if static > job.gpu_capacity_bytes:
        lines.append(
            f"  Without any activations the step needs {gib(static)}: no plan can fit. Shard it (--gpus N --fsdp), "
            "or hold less per parameter (--optimizer adamw8bit, --precision bf16)."
        )
    return lines


def job_json(job: JobMemory, setup: TrainingSetup, args: argparse.Namespace, result: Preview,
             search: BatchSearch | None) -> dict[str, Any]:
    """`adacc plan --json`: the breakdown's fields, the plan's budget and
    the strategies' estimated step times."""
    s = result.summary
    by_name = {x.name: x for x in result.strategies}
    full_ac = next((x for x in result.strategies if x.name.startswith("full AC")), None)
    return {
        **job.to_json(),
        "gpu": args.gpu, "gpus": setup.gpus, "fsdp": setup.fsdp, "optimizer": setup.optimizer,
        "precision": setup.precision, "batch": args.batch, "seq": args.seq,
        "budget_bytes": int(s["requested_budget_bytes"]), "budget_scope": s.get("budget_scope", "activations"),
        "plan_fits_budget": result.fits,
        # Searched only where the asked batch did not fit (null: not searched, or no batch fits).
        "largest_batch": search.largest if search else None,
        "largest_batch_searched": search is not None,
        "adacc_step_seconds": result.strategies[0].step_seconds,
        "full_ac_step_seconds": full_ac.step_seconds if full_ac else None,
        "strategies": {name: {"step_peak_bytes": x.step_peak_bytes, "activation_peak_bytes": x.activation_peak_bytes,
                              "step_seconds": x.step_seconds} for name, x in by_name.items()},
        # Linear in the batch from the traced one (`largest_batch_estimates`), per strategy.
        "largest_batch_estimates": largest_batch_estimates(
            result.strategies, int(s["requested_budget_bytes"]), result.traced.batch, s.get("budget_scope", "activations")
        ),
    }


def strategy_table(strategies: list[Strategy], budget: int, parameter_bytes: int, scope: str = "activations",
                   batch: int | None = None) -> str:
    """The strategies on the same graph, adacc first; "fits" compares the
    peak the budget bounds under ``scope``; with ``batch`` (the traced
    one), each strategy's largest batch, estimated (`largest_batch_estimates`)."""
    base = next((x for x in strategies if x.name.startswith("no checkpointing")), strategies[0])
    largest = largest_batch_estimates(strategies, budget, batch, scope) if batch else {}
    lines = [
        "Predicted memory and time on the same graph (adacc's memory simulator, Inductor fusion):",
        f"  {'strategy':<36} {'saved':>10} {'act. peak':>10} {'step peak':>10} {'+ weights':>10} "
        f"{'est. step':>10} {'vs no AC':>8}  fits" + ("  batch ≤ (est.)" if largest else ""),
    ]
    for x in strategies:
        lines.append(
            f"  {x.name:<36} {gib(x.saved_bytes):>10} {gib(x.activation_peak_bytes):>10} {gib(x.step_peak_bytes):>10} "
            f"{gib(x.step_peak_bytes + parameter_bytes):>10} {1e3 * x.step_seconds:>8.1f}ms "
            f"{x.step_seconds / max(base.step_seconds, 1e-12):>7.2f}x  {'yes' if bounded_peak(x, scope) <= budget else 'no ':<3}"
            + (f"  {largest[x.name]:>14}" if largest else "")
        )
    lines.append(
        f"  {'step peak' if scope == 'step' else 'act. peak'}: what the budget bounds (--budget-scope {scope}); "
        "act. peak: forward values alive for the backward, recomputed and decompressed "
        "values; step peak: the whole simulated step (activations, gradients, temporaries), parameters not "
        "included; + weights: step peak plus the parameters (no optimizer state); est. step: roofline time of "
        "the step on the GPU profile plus each plan's recomputation and codec time"
        + (f"; batch ≤ (est.): the largest batch within the budget, the bounded peak taken as linear in the batch "
           f"from batch {batch} (adacc: at least full AC's, one of its plans; not planned at that batch)"
           if largest else "")
    )
    return "\n".join(lines)


def verdict(result: Preview, search: BatchSearch | None, budget: int) -> list[str]:
    s = result.summary
    adacc = result.strategies[0]
    scope = s.get("budget_scope", "activations")
    if result.fits:
        return [
            f"Fits: adacc's {_scope_label(scope)} {gib(bounded_peak(adacc, scope))} is within the budget {gib(budget)}; "
            f"estimated step {1e3 * adacc.step_seconds:.1f} ms on this GPU profile "
            f"(+{1e3 * s['estimated_added_seconds']:.1f} ms recomputation and codecs)."
        ]
    assert search is not None
    lines = [
        f"Does not fit: at batch {result.traced.batch} no plan reaches {gib(budget)}; the smallest budget that can be "
        f"met is {gib(search.minimum_bytes)} (the reachable minimum: everything legal recomputed or compressed).",
    ]
    if search.largest is None:
        lines.append(f"No batch fits {gib(budget)}: batch 1 needs {gib(search.minimum_by_batch.get(1, 0))}.")
    else:
        bound = "" if search.exact else " (at least: the search stopped before planning the next batch)"
        lines.append(f"Largest batch that fits {gib(budget)}: {search.largest}{bound}.")
    lines.append(f"  How: {search.explain()}.")
    return lines


def write_dump(folder: str, text: str, result: Preview, search: BatchSearch | None) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "report.txt"), "w") as f:
        f.write(text + "\n")
    data: dict[str, Any] = {
        "strategies": [
            {"name": x.name, "saved_bytes": x.saved_bytes, "activation_peak_bytes": x.activation_peak_bytes,
             "step_peak_bytes": x.step_peak_bytes, "step_seconds": x.step_seconds}
            for x in result.strategies
        ],
        "parameter_bytes": result.traced.parameter_bytes,
        "batch": result.traced.batch,
        "seq": result.traced.seq,
        "trace_seconds": result.traced.trace_seconds,
        "plan_seconds": result.plan_seconds,
        "search": None if search is None else {
            "minimum_bytes": search.minimum_bytes, "largest_batch": search.largest, "exact": search.exact,
            "minimum_by_batch": search.minimum_by_batch,
        },
    }
    with open(os.path.join(folder, "strategies.json"), "w") as f:
        json.dump(data, f, indent=1)
    plot_strategies(result, os.path.join(folder, "strategies_memory.png"))


def plot_strategies(result: Preview, path: str) -> bool:
    """Simulated memory the budget bounds (activations, or under
    ``budget_scope="step"`` everything) over the step, one line per strategy
    (x: fraction of the step, since each split has its own node count).
    Skipped, returning False, without matplotlib (a dev dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    scope = result.summary.get("budget_scope", "activations")
    top = max(bounded_peak(x, scope) for x in result.strategies)
    unit, scale = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    fig, ax = plt.subplots(figsize=(9, 4))
    for x in result.strategies:
        events = x.timeline.events
        n = max(len(events) - 1, 1)
        values = [(e.live_bytes if scope == "step" else e.activation_bytes) / scale for e in events]
        ax.plot([i / n for i in range(len(events))], values, label=x.name, linewidth=1)
    ax.axhline(result.summary["requested_budget_bytes"] / scale, color="gray", linestyle="--", label=f"budget ({scope})")
    ax.set_xlabel("step (forward, then backward), fraction of its ops")
    ax.set_ylabel(f"simulated {'step' if scope == 'step' else 'activation'} {unit}")
    ax.set_title(f"adacc plan: batch {result.traced.batch}, seq {result.traced.seq}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
