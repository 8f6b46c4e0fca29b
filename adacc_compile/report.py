"""Report: the summary, the plan table, dumps and structured logs.

With ``dump_dir`` (option or env ADACC_DUMP_DIR) each compiled joint graph
gets its own folder ``graph_NNN`` (in compile order) holding::

    joint_graph.py     the joint graph as readable Python
    annotations.csv    one row per node (annotate pass)
    milp.lp            the MILP as HiGHS writes it
    plan.json          one record per candidate value
    forward.py         the rewritten forward graph
    backward.py        the rewritten backward graph
    memory_timeline.json / .png   simulated live bytes over the step
    summary.json       budget, saved bytes, peak, time, solver status, counts

The summary and plan also go through ``torch._logging.trace_structured``
(artifacts ``adacc_summary`` / ``adacc_plan``, seen by ``TORCH_TRACE`` and
tlparse). ``TORCH_LOGS=adacc_compile`` prints one INFO line per graph;
``TORCH_LOGS=+adacc_compile`` adds the plan table.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from adacc_compile import compat
from adacc_compile.overlap import OverlapState
from adacc_compile.passes.annotate import META_KEY
from adacc_compile.passes.milp import write_lp
from adacc_compile.passes.plan_problem import Decision, added_seconds, saved_bytes

if TYPE_CHECKING:
    from adacc_compile.state import PartitionState

log = logging.getLogger(__name__)


def plan_records(state: "PartitionState") -> list[dict[str, Any]]:
    assert state.candidates is not None and state.solution is not None
    records = []
    for cand in state.candidates.problem.candidates:
        node = state.candidates.nodes[cand.name]
        ann = node.meta[META_KEY]
        choice = state.solution.choices.get(cand.name)
        decision = choice.decision if choice else Decision.NONE
        codec = choice.codec if choice else None
        cost = 0.0
        measured = None
        if codec and state.calibration is not None:
            measured = state.calibration.options.get(cand.name, {}).get(codec)
        if decision is Decision.RECOMPUTE:
            cost = cand.recompute_seconds
        elif decision is Decision.COMPRESS:
            cost = next(o.seconds for o in cand.compress if o.codec == codec)
        records.append(
            {
                "name": cand.name,
                "op": ann.op,
                "op_class": ann.op_class.value,
                "layer": ann.layer,
                "bytes": cand.keep_bytes,
                "required": cand.required,
                "decision": decision.value,
                "codec": codec,
                "codec_error_bound": _codec_bound(codec),
                "calibration": measured.to_json() if measured is not None else None,
                "cost_seconds": cost,
                "options": (["keep"] if cand.can_keep else []) + (["recompute"] if cand.can_recompute else [])
                + [f"compress:{o.codec}" for o in cand.compress],
                "window": state.solution.windows.get(cand.name),
            }
        )
    return records


def _codec_bound(codec: str | None) -> float | None:
    """The codec's declared relative error. Where the value was calibrated,
    the record's ``calibration`` holds what was measured on the real
    activation (error, SQNR, abs max, outlier channels); the codecs still
    compute their scales and outlier slots from the tensor at every call."""
    if codec is None:
        return None
    from adacc_compile.kernels import get_codec

    return get_codec(codec).error_bound


def plan_table(records: list[dict[str, Any]]) -> str:
    """The saved-activation table, one line per candidate the backward needs."""
    lines = [f"{'name':<28} {'op':<34} {'layer':<14} {'MiB':>9} decision"]
    for r in records:
        if r["decision"] == Decision.NONE.value:
            continue
        decision = r["decision"] + (f"[{r['codec']}]" if r["codec"] else "")
        lines.append(
            f"{r['name'][:28]:<28} {r['op'][:34]:<34} {r['layer'][:14]:<14} "
            f"{r['bytes'] / 2**20:>9.3f} {decision}"
        )
    return "\n".join(lines)


def summarize(state: "PartitionState") -> dict[str, Any]:
    assert state.budget and state.solution and state.timeline and state.candidates
    problem = state.candidates.problem
    counts = Counter(r["decision"] for r in plan_records(state))
    step_seconds = sum(
        n.meta[META_KEY].runtime_s for n in state.joint.graph.nodes if META_KEY in n.meta
    )
    added = max(added_seconds(problem, state.solution) - state.budget.fastest_seconds, 0.0)
    outcome = state.outcome
    return {
        "graph_index": state.graph_index,
        "planner": state.config.planner,
        "memory_budget": state.config.memory_budget.describe(),
        "realization": state.mode.value,
        "budget_bytes": state.budget.budget_bytes,
        "boundary_budget_bytes": state.budget.boundary_bytes,
        "requested_budget_bytes": state.budget.requested_bytes,
        "budget_clamped_to_minimum": state.budget.clamped,
        "held_by_earlier_graphs": state.budget.held_by_earlier_graphs,
        "earlier_graphs": list(state.earlier_graphs),
        "default_saved_bytes": state.budget.default_saved_bytes,
        "default_activation_peak_bytes": state.budget.default_peak_bytes,
        "baseline_saved_bytes": state.budget.baseline_saved_bytes,
        "minimum_saved_bytes": state.budget.minimum_bytes,
        "minimum_activation_peak_bytes": state.budget.minimum_bytes,
        "planned_saved_bytes": saved_bytes(problem, state.solution),
        "simulated_saved_bytes": state.timeline.saved_bytes,
        "modelled_activation_peak_bytes": _modelled_peak(state),
        "predicted_peak_bytes": state.timeline.peak_bytes,
        "predicted_activation_peak_bytes": state.timeline.activation_peak_bytes,
        "activation_peak_fits_budget": state.timeline.activation_peak_bytes <= state.budget.budget_bytes,
        "plan_source": outcome.source if outcome else "planner",
        "estimated_added_seconds": added,
        "default_added_seconds": (
            max(added_seconds(problem, state.default_plan) - state.budget.fastest_seconds, 0.0)
            if state.default_plan is not None else None
        ),
        "estimated_step_seconds": step_seconds,
        "solve_seconds": state.solution.solve_seconds,
        "solver_status": state.solution.status,
        "solver": state.solution.solver,
        "replans": state.replans,
        "decisions": {d.value: counts.get(d.value, 0) for d in Decision},
        "num_candidates": len(problem.candidates),
        "block_reuse": state.reduction.summary() if state.reduction else {"used": False},
        "calibration": state.calibration.summary() if state.calibration else {"used": False, "reason": "skipped"},
        "compressed_bytes_saved": _compressed_bytes_saved(state),
        "codecs": dict(Counter(c.codec for c in state.solution.choices.values() if c.codec)),
        "device_profile": state.profile.name if state.profile else "",
        "stage_seconds": dict(state.stage_seconds),
        "notes": list(state.solution.notes),
        **_overlap_summary(state, added),
    }


def _modelled_peak(state: "PartitionState") -> int | None:
    """The memory model's bound on this plan's activation peak."""
    problem = state.candidates.problem if state.candidates else None
    if problem is None or problem.memory is None or state.solution is None:
        return None
    from adacc_compile.passes.budget import modelled_peak

    return modelled_peak(problem, state.solution)


def _compressed_bytes_saved(state: "PartitionState") -> int:
    """Bytes compression saves against keeping the same values."""
    assert state.candidates is not None and state.solution is not None
    saved = 0
    for cand in state.candidates.problem.candidates:
        choice = state.solution.choices.get(cand.name)
        if choice is not None and choice.decision is Decision.COMPRESS:
            option = next(o for o in cand.compress if o.codec == choice.codec)
            saved += cand.keep_bytes - option.nbytes
    return saved


def summary_line(summary: dict[str, Any]) -> str:
    def gb(n: int) -> str:
        return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"

    pct = 100 * summary["estimated_added_seconds"] / max(summary["estimated_step_seconds"], 1e-12)
    return (
        f"adacc graph {summary['graph_index']}: activations {gb(summary['baseline_saved_bytes'])} -> "
        f"{gb(summary['planned_saved_bytes'])}, +{pct:.1f}% est. time, "
        f"solved in {summary['solve_seconds']:.2f} s ({summary['solver_status']})"
        + _calibration_note(summary.get("calibration") or {})
    )


def _calibration_note(calibration: dict[str, Any]) -> str:
    if calibration.get("used"):
        return (
            f", codecs calibrated on {calibration['values']} real values "
            f"({len(calibration['rejected'])} option(s) over their bound dropped)"
        )
    reason = calibration.get("reason", "")
    return "" if reason in ("", "no lossy codec options") else f", codecs not calibrated: {reason}"


def publish(state: "PartitionState") -> None:
    folder = next_dump_folder(state.config.dump_dir) if state.config.dump_dir else None
    if folder is not None:
        state.graph_index = int(folder.rsplit("_", 1)[1])
    summary = summarize(state)
    records = plan_records(state)
    state.report = {"summary": summary, "plan": records}
    compat.log_json_artifact("adacc_summary", summary)
    compat.log_json_artifact("adacc_plan", records)
    log.info(summary_line(summary))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("adacc plan, graph %d:\n%s", state.graph_index, plan_table(records))
    if folder is not None:
        write_dumps(state, folder, summary, records)


def next_dump_folder(dump_dir: str) -> str:
    os.makedirs(dump_dir, exist_ok=True)
    index = 0
    while True:
        folder = os.path.join(dump_dir, f"graph_{index:03d}")
        try:
            os.makedirs(folder)
            return folder
        except FileExistsError:
            index += 1


def write_dumps(
    state: "PartitionState", folder: str, summary: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    assert state.candidates and state.solution and state.timeline and state.budget
    _write(folder, "joint_graph.py", state.joint.print_readable(print_output=False))
    with open(os.path.join(folder, "annotations.csv"), "w", newline="") as f:
        writer = None
        for node in state.joint.graph.nodes:
            ann = node.meta.get(META_KEY)
            if ann is None:
                continue
            row = {"name": node.name, **ann.row()}
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
    solved = state.reduction.problem if state.reduction else state.candidates.problem
    problem = dataclasses.replace(
        solved, budget_bytes=state.budget.budget_bytes, boundary_budget_bytes=state.budget.boundary_bytes
    )
    write_lp(problem, os.path.join(folder, "milp.lp"))
    _write(folder, "plan.json", json.dumps(records, indent=1))
    assert state.fw_module is not None and state.bw_module is not None
    _write(folder, "forward.py", state.fw_module.print_readable(print_output=False))
    _write(folder, "backward.py", state.bw_module.print_readable(print_output=False))
    _write(folder, "memory_timeline.json", json.dumps(state.timeline.to_json()))
    _write(folder, "windows.json", json.dumps(_overlap_dump(state), indent=1))
    _plot_timeline(state, os.path.join(folder, "memory_timeline.png"))
    config = json.loads(state.config.to_json())
    _write(folder, "summary.json", json.dumps({**summary, "config": config}, indent=1, default=str))


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)


def _plot_timeline(state: "PartitionState", path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plotting is optional (dev extra)
        return
    assert state.timeline is not None
    events = state.timeline.events
    fig, ax = plt.subplots(figsize=(9, 3.5))
    xs = range(len(events))
    ax.plot(xs, [e.live_bytes / 2**20 for e in events], label="all live bytes")
    ax.plot(xs, [e.activation_bytes / 2**20 for e in events], label="activations")
    boundary = next((i for i, e in enumerate(events) if e.node == "<boundary>"), None)
    if boundary is not None:
        ax.axvline(boundary, color="gray", linestyle=":", label="forward | backward")
    ax.set_xlabel("node (execution order)")
    ax.set_ylabel("MiB")
    ax.set_title(f"adacc simulated memory, graph {state.graph_index}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _overlap_summary(state: "PartitionState", added: float) -> dict[str, Any]:
    """The ``summary.json`` keys of recomputation in communication windows;
    ``added`` is the plan's estimated added time."""
    overlap = state.overlap or OverlapState()
    return {
        "overlap_recompute": state.config.overlap_recompute,
        "comm_profile": overlap.link.name if overlap.link else "",
        "comm_windows": len(overlap.windows),
        "comm_window_seconds": sum(w.seconds for w in overlap.windows),
        "recomputes_in_windows": len(overlap.placed),
        "recompute_nodes_in_windows": sum(len(v) for v in overlap.inside.values()),
        "overlapped_recompute_seconds": overlap.overlapped_seconds,
        "exposed_added_seconds": added - overlap.overlapped_seconds,
        "recomputes_unplaced_for_memory": len(overlap.unplaced_for_memory),
        "schedule_pins": overlap.pins,
        "plan_hash": overlap.plan_hash,
        "plan_hash_checked_ranks": list(overlap.checked_ranks),
    }


def _overlap_dump(state: "PartitionState") -> dict[str, Any]:
    """``windows.json``: every window and where each recomputation runs."""
    overlap = state.overlap or OverlapState()
    return {
        "link": overlap.link.to_json() if overlap.link else None,
        "windows": [w.to_json() for w in overlap.windows],
        "planned": overlap.planned,
        "placed": overlap.placed,
        "skipped": overlap.skipped,
        "unplaced_for_memory": list(overlap.unplaced_for_memory),
        "inside": overlap.inside,
        "plan_hash": overlap.plan_hash,
        "plan_canonical": overlap.plan_canonical,
    }
