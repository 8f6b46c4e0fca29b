"""Report: the summary, the plan table, dumps and structured logs.

With ``dump_dir`` (option or env ADACC_DUMP_DIR) each compiled joint graph
gets its own folder ``graph_NNN`` (in compile order) holding::

    joint_graph.py     the joint graph as readable Python
    annotations.csv    one row per node (annotate pass)
    milp.lp            the MILP as HiGHS writes it
    plan.json          one record per candidate value
    plan_table.txt     the same, one line per value the backward needs
    plan_folded.txt    the plan folded by block (identical blocks, one row)
    forward.py         the rewritten forward graph
    backward.py        the rewritten backward graph
    memory_timeline.json / .png   simulated live bytes over the step
    summary.json       budget, saved bytes, peak, time, solver status, counts

The summary and plan also go through ``torch._logging.trace_structured``
(artifacts ``adacc_summary`` / ``adacc_plan``, seen by ``TORCH_TRACE`` and
tlparse). ``TORCH_LOGS=adacc_compile`` prints one INFO line per graph;
``TORCH_LOGS=+adacc_compile`` adds the plan table folded by block (one row
per distinct block decision pattern), or with ``ADACC_PLAN_TABLE=full`` one
row per value.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adacc_compile import compat
from adacc_compile.overlap import OverlapState
from adacc_compile.passes.annotate import META_KEY
from adacc_compile.passes.milp import write_lp
from adacc_compile.passes.plan_problem import BlockRepeat, Decision, added_seconds, saved_bytes

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
                "module_path": ann.module_path,
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


def human_bytes(n: float) -> str:
    """GiB, MiB or KiB, whichever reads best."""
    if abs(n) >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.1f} KiB"


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


FULL_TABLE_ENV = "ADACC_PLAN_TABLE"
"""``ADACC_PLAN_TABLE=full`` makes ``TORCH_LOGS=+adacc_compile`` print the
per-candidate table instead of the folded one (the dump has both)."""


FREE_OPS = frozenset({
    "view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "reshape", "_unsafe_view",
    "alias", "detach", "getitem", "slice", "select", "as_strided", "split", "split_with_sizes", "unbind",
})
"""Ops whose values are views of another (no bytes of their own): counted,
not listed, in the folded table."""

SMALL_FRACTION = 32
"""A value under 1/32 of its row's largest is counted, not named."""


SHORT_OPS = {
    "convert_element_type": "cast", "_to_copy": "cast",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa", "_scaled_dot_product_flash_attention": "sdpa",
    "_scaled_dot_product_efficient_attention": "sdpa", "_scaled_dot_product_cudnn_attention": "sdpa",
}


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One row of the folded table: blocks of one family that made the same
    decisions, position by position (or the values outside any block)."""

    family: str
    indices: tuple[int, ...]
    """Block numbers (empty for the values outside blocks)."""
    items: tuple[tuple[str, str, int], ...]
    """(value label, decision, bytes) per planned value, in graph order."""

    def blocks(self, family_label: str) -> str:
        if not self.indices:
            return "outside blocks"
        return f"{family_label} {_ranges(self.indices)}"

    def decisions(self) -> str:
        """``keep q_proj.mm, k_proj.mm; recompute act_fn.silu; int8_outlier
        o_proj.mm``. Views (no memory of their own: deciding them is free)
        and values under 1/`SMALL_FRACTION` of the row's largest are only
        counted, so that the row names what the memory is."""
        largest = max((nbytes for _, _, nbytes in self.items), default=0)
        groups: dict[str, Counter[str]] = {}
        views: Counter[str] = Counter()
        small: Counter[str] = Counter()
        for label, decision, nbytes in self.items:
            if nbytes == 0 or label.rsplit(".", 1)[-1] in FREE_OPS:
                views[decision] += 1
            elif nbytes * SMALL_FRACTION < largest:
                small[decision] += 1
            else:
                groups.setdefault(decision, Counter())[label] += 1
        order = sorted(set(groups) | set(views) | set(small), key=lambda d: (d != "keep", d != "recompute", d))
        parts = []
        for decision in order:
            labels = [f"{label}" + (f" x{n}" if n > 1 else "") for label, n in groups.get(decision, {}).items()]
            labels += [f"+{small[decision]} small"] if small[decision] else []
            labels += [f"+{views[decision]} views"] if views[decision] else []
            parts.append(f"{decision} " + ", ".join(labels))
        return "; ".join(parts)

    def kept_bytes(self) -> int:
        return sum(nbytes for _, decision, nbytes in self.items if decision == "keep")


def fold_by_block(records: list[dict[str, Any]], repeat: BlockRepeat | None = None) -> list[BlockRow]:
    """Groups the plan records of each repeated block (``layer`` such as
    "layers.3") and folds blocks of one family whose decisions are the same
    at every position into one row; the values outside blocks get one row.
    A block that decided differently (the last one, often, which the
    backward meets first) keeps its own row. Under depth folding
    (``repeat``) the rows count the deep model's blocks: the repeated one
    with its copies, those after it renumbered."""
    per_block: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["decision"] != Decision.NONE.value:
            per_block.setdefault(r.get("layer") or "", []).append(r)
    rows: list[BlockRow] = []
    patterns: dict[tuple[str, tuple], list[int]] = {}
    for block, block_records in per_block.items():
        family, _, index = block.rpartition(".")
        items = tuple((_value_label(r, block), _decision_label(r), int(r["bytes"])) for r in block_records)
        if not block or not index.isdigit():
            rows.append(BlockRow(family=block, indices=(), items=items))
            continue
        patterns.setdefault((family, items), []).extend(_deep_indices(family, int(index), repeat))
    folded = [BlockRow(family=f, indices=tuple(sorted(ix)), items=items) for (f, items), ix in patterns.items()]
    folded.sort(key=lambda row: (row.family, row.indices[0]))
    return folded + rows


def _deep_indices(family: str, index: int, repeat: BlockRepeat | None) -> list[int]:
    if repeat is None:
        return [index]
    rep_family, _, rep_index = repeat.block.rpartition(".")
    if family != rep_family or not rep_index.isdigit():
        return [index]
    r = int(rep_index)
    if index < r:
        return [index]
    if index == r:
        return list(range(r, r + repeat.copies + 1))
    return [index + repeat.copies]


def folded_plan_table(records: list[dict[str, Any]], *, width: int = 110, repeat: BlockRepeat | None = None) -> str:
    """The plan folded by block: one row per distinct block decision pattern
    (``layers 0-30 (x31)``) and one for the values outside blocks, instead
    of one row per candidate (thousands at 32 layers)."""
    import textwrap

    rows = fold_by_block(records, repeat)
    labels = _family_labels({row.family for row in rows if row.indices})
    lines = [f"{'blocks':<22} {'n':>3} {'kept MiB/block':>14}  decisions (per block)"]
    for row in rows:
        name = row.blocks(labels.get(row.family, row.family))
        count = len(row.indices) or 1
        text = row.decisions() or "-"
        wrapped = textwrap.wrap(text, width=max(width - 43, 40)) or ["-"]
        lines.append(f"{name:<22} {count:>3} {row.kept_bytes() / 2**20:>14.2f}  {wrapped[0]}")
        lines.extend(f"{'':<42}  {more}" for more in wrapped[1:])
    return "\n".join(lines)


def _family_labels(families: set[str]) -> dict[str, str]:
    """"model.model.layers" -> "layers", unless two families end alike."""
    last = Counter(f.rsplit(".", 1)[-1] for f in families)
    return {f: f.rsplit(".", 1)[-1] if last[f.rsplit(".", 1)[-1]] == 1 else f for f in families}


def _ranges(indices: tuple[int, ...]) -> str:
    """(0, 1, 2, 5, 7, 8) -> "0-2, 5, 7-8"."""
    parts, start, prev = [], indices[0], indices[0]
    for i in (*indices[1:], None):
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def _value_label(record: dict[str, Any], block: str) -> str:
    """The value by the module that made it, inside its block, and its op:
    "layers.3.self_attn.q_proj" + "aten.mm" -> "q_proj.mm"."""
    parts = str(record["op"]).split(".")
    op = parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims") else parts[0]
    op = SHORT_OPS.get(op, op)
    module = str(record.get("module_path") or "")
    inner = module[len(block):].lstrip(".") if block and module.startswith(block) else module
    owner = inner.rsplit(".", 1)[-1] if inner else ""
    return f"{owner}.{op}" if owner else op


def _decision_label(record: dict[str, Any]) -> str:
    return record["codec"] if record["decision"] == Decision.COMPRESS.value and record["codec"] else record["decision"]


def summarize(state: "PartitionState") -> dict[str, Any]:
    assert state.budget and state.solution and state.timeline and state.candidates
    problem = state.candidates.problem
    counts = Counter(r["decision"] for r in plan_records(state))
    step_seconds = sum(
        n.meta[META_KEY].runtime_s for n in state.joint.graph.nodes if META_KEY in n.meta
    )
    if state.fold is not None:
        step_seconds = state.fold.step_seconds(step_seconds)
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
        "measured_correction_bytes": state.measured_excess_bytes,
        "measured_step_peak_bytes": None,
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
        "budget_scope": state.budget.scope,
        "fits_budget": state.budget.peak_of(state.timeline) <= state.budget.budget_bytes,
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
        "depth_fold": _depth_fold_summary(state),
        "calibration": state.calibration.summary() if state.calibration else {"used": False, "reason": "skipped"},
        "compressed_bytes_saved": _compressed_bytes_saved(state),
        "codecs": dict(Counter(c.codec for c in state.solution.choices.values() if c.codec)),
        "device_profile": state.profile.name if state.profile else "",
        "stage_seconds": dict(state.stage_seconds),
        "planning": _planning_summary(state),
        # The solver's notes, then the plan search's (boundary relaxed,
        # corrective re-solve).
        "notes": list(dict.fromkeys([*state.solution.notes, *(state.outcome.notes if state.outcome else ())])),
        **_overlap_summary(state, added),
    }


def _repeat(state: "PartitionState") -> BlockRepeat | None:
    return state.fold.repeat if state.fold is not None else None


def _depth_fold_summary(state: "PartitionState") -> dict[str, Any]:
    """Which block stood for how many more (`depth_fold`)."""
    if state.fold is None or state.candidates is None:
        return {"used": False}
    family = state.fold.repeat.block.rsplit(".", 1)[0]
    traced = {c.block for c in state.candidates.problem.candidates if c.block.rsplit(".", 1)[0] == family}
    return {"used": True, **state.fold.summary(len(traced))}


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


PLANNING_STAGES = ("structure", "budget", "plan")
"""The stages that decide the plan: their time is the planning time."""


def _planning_summary(state: "PartitionState") -> dict[str, Any]:
    """Planning time (structure, budget and plan stages) and its parts:
    building and solving the MILP (how many solves, the largest model's
    size), splitting plans into graphs, simulating their memory."""
    seconds = sum(state.stage_seconds.get(name, 0.0) for name in PLANNING_STAGES)
    return {"seconds": seconds, **state.plan_timing.summary()}


def summary_line(summary: dict[str, Any]) -> str:
    def gb(n: int) -> str:
        return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"

    pct = 100 * summary["estimated_added_seconds"] / max(summary["estimated_step_seconds"], 1e-12)
    return (
        f"adacc graph {summary['graph_index']}: activations {gb(summary['baseline_saved_bytes'])} -> "
        f"{gb(summary['planned_saved_bytes'])}, +{pct:.1f}% est. time, "
        f"solved in {summary['solve_seconds']:.2f} s ({summary['solver_status']})"
        + _planning_note(summary.get("planning") or {})
        + _calibration_note(summary.get("calibration") or {})
    )


def _planning_note(planning: dict[str, Any]) -> str:
    if not planning:
        return ""
    return (
        f", planned in {planning['seconds']:.2f} s ({planning['solves']} solve(s) "
        f"{planning['build_s'] + planning['solve_s']:.2f} s, {planning['splits']} split(s) {planning['split_s']:.2f} s, "
        f"simulation {planning['simulate_s']:.2f} s; MILP {planning['rows']} rows x {planning['columns']} columns"
        + (f", branch-and-bound nodes {'/'.join(str(n) for n in planning['nodes'])}" if planning.get("nodes") else "")
        + ")"
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
    """The summary and plan records as ``state.report``, logged, and dumped
    where ``dump_dir`` is set. ``graph_index`` stays the graph's index in
    the step (`step_ledger`); the dump folder's name, which counts the
    folders already in ``dump_dir``, is the summary's ``dump_folder``."""
    folder = next_dump_folder(state.config.dump_dir) if state.config.dump_dir else None
    summary = {**summarize(state), "dump_folder": os.path.basename(folder) if folder else None}
    records = plan_records(state)
    state.report = {"summary": summary, "plan": records, "dump_folder": folder}
    compat.log_json_artifact("adacc_summary", summary)
    compat.log_json_artifact("adacc_plan", records)
    log.info(summary_line(summary))
    if log.isEnabledFor(logging.DEBUG):
        if os.environ.get(FULL_TABLE_ENV, "").lower() == "full":
            log.debug("adacc plan, graph %d:\n%s", state.graph_index, plan_table(records))
        else:
            log.debug(
                "adacc plan, graph %d (folded by block; %s=full for one row per value):\n%s",
                state.graph_index, FULL_TABLE_ENV, folded_plan_table(records, repeat=_repeat(state)),
            )
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
    _write(folder, "plan_table.txt", plan_table(records) + "\n")
    _write(folder, "plan_folded.txt", folded_plan_table(records, repeat=_repeat(state)) + "\n")
    assert state.fw_module is not None and state.bw_module is not None
    _write(folder, "forward.py", state.fw_module.print_readable(print_output=False))
    _write(folder, "backward.py", state.bw_module.print_readable(print_output=False))
    _write(folder, "memory_timeline.json", json.dumps(state.timeline.to_json()))
    _write(folder, "windows.json", json.dumps(_overlap_dump(state), indent=1))
    _plot_timeline(state, os.path.join(folder, "memory_timeline.png"))
    write_summary(folder, summary, state.config.to_json())


def write_summary(folder: str, summary: dict[str, Any], config_json: str) -> None:
    """``summary.json``: the summary with the config it was planned under
    (written again when a measured step adds to it, `step_measure`)."""
    _write(folder, "summary.json", json.dumps({**summary, "config": json.loads(config_json)}, indent=1, default=str))


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
