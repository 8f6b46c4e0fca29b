"""Pareto curve of estimated added time vs planned peak memory for the three
plan families recompute-only, compress-only and mixed.

    python bench/bench_pareto.py [--models gpt llama] [--layers 2] [--d-model 256]
        [--seq-len 256] [--batch 4] [--budgets 1.0 0.8 0.6 0.5 0.4 0.3 0.2 0.1]
        [--profile h100] [--cpu-profile-model gpt] [--measure-budgets 0.5 0.3]
        [--measure-backend adacc] [--out-dir bench/results]

Planning numbers: each model's joint graph is traced once under fake tensors
(Dynamo + AOTAutograd, no real allocation) and every (family, budget) plan is
made by running adacc's whole pipeline (`AdaccPartitioner`) on a copy of that
joint graph. Families (adacc options):

    recompute-only   {"accuracy": "lossless", "codecs": ()}
    compress-only    {"accuracy": "aggressive", "allow_recompute": False}
    mixed/balanced   {"accuracy": "balanced"}
    mixed/aggressive {"accuracy": "aggressive"}

with ``device_profile=--profile`` (an H100 cost model by default: that is
where compression pays; on CPU the codecs run as slow torch references), and
one more sweep of one model with the default calibrated CPU profile.

"Planned peak" is the simulator's whole-step peak (``predicted_peak_bytes``);
the activation peak and the saved bytes at the boundary are in the table too.
At every budget where recompute-only recomputes a matmul output, the table
compares its estimated time with the cheapest mixed plan whose planned peak
is no higher (any budget of the sweep), and with the mixed plan at the same
budget.

Measured: real CPU step time and peak memory (profiler allocator trace) of
the same plans at ``--measure-budgets`` through `run_variants`, with the
backend ``--measure-backend`` (adacc = Inductor C++, adacc_eager = eager).

Outputs (under --out-dir): pareto.md, pareto.json, pareto.png,
pareto_measured.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from adacc_compile.config import AdaccConfig
import _examples_path  # noqa: F401  (examples/ on sys.path)
from adacc_examples.models import GPT, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights
from adacc_compile.partitioner import AdaccPartitioner

FAMILIES: dict[str, dict[str, Any]] = {
    "recompute-only": {"accuracy": "lossless", "codecs": ()},
    "compress-only": {"accuracy": "aggressive", "allow_recompute": False},
    "mixed/balanced": {"accuracy": "balanced"},
    "mixed/aggressive": {"accuracy": "aggressive"},
}
MIXED = ("mixed/balanced", "mixed/aggressive")
STYLE = {
    "recompute-only": ("tab:blue", "o"),
    "compress-only": ("tab:orange", "s"),
    "mixed/balanced": ("tab:green", "^"),
    "mixed/aggressive": ("tab:red", "v"),
}


# ---------------------------------------------------------------------------
# joint graph capture under fake tensors (shared with bench_llm_scale.py)
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class CapturedJoint:
    """The joint fw+bw graph AOTAutograd hands to a partitioner, kept so that
    any number of plans can be made from copies of it."""

    gm: torch.fx.GraphModule
    joint_inputs: Any
    kwargs: dict[str, Any]
    trace_seconds: float

    def plan(self, options: dict[str, Any]) -> dict[str, Any]:
        """Runs adacc's whole pipeline on a copy of the joint graph; returns
        the partitioner's report ({"summary", "plan"}) plus wall seconds."""
        partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
        gm = copy.deepcopy(self.gm)
        start = time.perf_counter()
        partitioner(gm, self.joint_inputs, **self.kwargs)
        wall = time.perf_counter() - start
        report = partitioner.reports[-1]
        return {**report, "wall_seconds": wall}


class _StopAfterCompile(Exception):
    pass


def capture_joint(make_model: Callable[[], torch.nn.Module], make_inputs: Callable[[], tuple]) -> CapturedJoint:
    """Traces ``make_model()(*make_inputs())`` with Dynamo + AOTAutograd
    entirely under fake tensors and returns the joint graph.

    The model and inputs are built inside a ``FakeTensorMode`` (nothing is
    allocated, so a 7B-shaped model costs no memory); the compiled callable
    is never run (its forward raises right away)."""
    from functorch.compile import default_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._subclasses import FakeTensorMode

    captured: dict[str, Any] = {}

    def partition(gm, joint_inputs, **kwargs):
        captured.update(gm=copy.deepcopy(gm), joint_inputs=joint_inputs, kwargs=kwargs)
        return default_partition(gm, joint_inputs, **kwargs)

    def stub(gm, example_inputs):
        def run(*args):
            raise _StopAfterCompile

        return run

    with FakeTensorMode():
        model = make_model()
        inputs = make_inputs()
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=stub, bw_compiler=stub, partition_fn=partition))
    try:
        compiled(*inputs)
    except _StopAfterCompile:
        pass
    seconds = time.perf_counter() - start
    torch._dynamo.reset()
    if "gm" not in captured:
        raise RuntimeError("no joint graph was captured (graph break before the loss?)")
    return CapturedJoint(captured["gm"], captured["joint_inputs"], captured["kwargs"], seconds)


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------


def model_config(name: str, args: argparse.Namespace):
    common = dict(n_layer=args.layers, d_model=args.d_model, n_head=4, seq_len=args.seq_len, vocab_size=512)
    if name == "gpt":
        return GPTConfig(**common, dropout=0.1)
    return LlamaConfig(**common, ffn_dim=int(args.d_model * 8 / 3))


def build_model(name: str, cfg, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """``GPT``/``Llama`` with floating parameters and buffers in ``dtype``.

    Built under that default dtype rather than with ``.to(dtype)``: under a
    ``FakeTensorMode`` ``Module.to`` fails (it swaps parameter tensors, and
    fake parameters carry weak references)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return GPT(cfg) if name == "gpt" else Llama(cfg)
    finally:
        torch.set_default_dtype(previous)


def matmul_recomputes(report: dict[str, Any]) -> int:
    return sum(1 for r in report["plan"] if r["decision"] == "recompute" and r["op_class"] == "matmul")


def row_of(model: str, profile: str, family: str, budget: float, report: dict[str, Any]) -> dict[str, Any]:
    s = report["summary"]
    return {
        "model": model,
        "profile": profile,
        "family": family,
        "budget": budget,
        "estimated_added_seconds": s["estimated_added_seconds"],
        "estimated_step_seconds": s["estimated_step_seconds"],
        "planned_saved_bytes": s["planned_saved_bytes"],
        "baseline_saved_bytes": s["baseline_saved_bytes"],
        "minimum_saved_bytes": s["minimum_saved_bytes"],
        "budget_bytes": s["budget_bytes"],
        "budget_clamped_to_minimum": s["budget_clamped_to_minimum"],
        "predicted_peak_bytes": s["predicted_peak_bytes"],
        "predicted_activation_peak_bytes": s["predicted_activation_peak_bytes"],
        "activation_peak_fits_budget": s["activation_peak_fits_budget"],
        "decisions": s["decisions"],
        "codecs": s["codecs"],
        "compressed_bytes_saved": s["compressed_bytes_saved"],
        "matmul_recomputes": matmul_recomputes(report),
        "replans": s["replans"],
        "solver_status": s["solver_status"],
        "planning_seconds": sum(s["stage_seconds"].values()),
        "wall_seconds": report["wall_seconds"],
    }


def sweep(captured: CapturedJoint, model: str, profile: str, budgets: list[float]) -> list[dict[str, Any]]:
    rows = []
    for family, options in FAMILIES.items():
        for budget in budgets:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = captured.plan({**options, "memory_budget": budget, "device_profile": profile})
            rows.append(row_of(model, profile, family, budget, report))
            r = rows[-1]
            print(
                f"  {model:5s} {profile:6s} {family:17s} @{budget:<4g} peak {r['predicted_peak_bytes'] / 2**20:7.2f} MiB "
                f"saved {r['planned_saved_bytes'] / 2**20:7.2f} MiB  +{1e6 * r['estimated_added_seconds']:8.1f} us  "
                f"matmul rec {r['matmul_recomputes']}  ({r['wall_seconds']:.1f} s)",
                flush=True,
            )
    return rows


# ---------------------------------------------------------------------------
# tables and plot
# ---------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| family | budget | peak MiB (planned) | act. peak MiB | saved MiB | est. added us | added % of step | keep/rec/comp | matmul rec | codecs | clamped | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["decisions"]
        codecs = ", ".join(f"{k}x{v}" for k, v in sorted(r["codecs"].items())) or "-"
        lines.append(
            f"| {r['family']} | {r['budget']:g} | {mib(r['predicted_peak_bytes'])} | {mib(r['predicted_activation_peak_bytes'])} "
            f"| {mib(r['planned_saved_bytes'])} | {1e6 * r['estimated_added_seconds']:.1f} "
            f"| {100 * r['estimated_added_seconds'] / max(r['estimated_step_seconds'], 1e-12):.1f} "
            f"| {d['keep']}/{d['recompute']}/{d['compress']} | {r['matmul_recomputes']} | {codecs} "
            f"| {'yes' if r['budget_clamped_to_minimum'] else ''} | {'yes' if r['activation_peak_fits_budget'] else 'NO'} |"
        )
    return "\n".join(lines)


def comparison_table(rows: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """At budgets where recompute-only recomputes matmul outputs: its time vs
    the cheapest mixed plan at no higher planned peak (any budget), and vs
    the mixed plans at the same budget."""
    rec = [r for r in rows if r["family"] == "recompute-only" and r["matmul_recomputes"] > 0]
    mixed = [r for r in rows if r["family"] in MIXED]
    out = []
    lines = [
        "| budget | recompute-only: peak MiB, saved MiB, est. us (matmul rec) | cheapest mixed at <= that peak: family@budget, peak MiB, est. us | cheaper at <= peak? | cheapest mixed at <= those saved bytes: family@budget, saved MiB, est. us | cheaper at <= saved? | mixed/aggressive same budget: peak MiB, est. us | mixed/balanced same budget: peak MiB, est. us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rec:
        fitting = [m for m in mixed if m["predicted_peak_bytes"] <= r["predicted_peak_bytes"]]
        best = min(fitting, key=lambda m: m["estimated_added_seconds"]) if fitting else None
        same = {m["family"]: m for m in mixed if m["budget"] == r["budget"]}
        cheaper = best is not None and best["estimated_added_seconds"] < r["estimated_added_seconds"]
        fitting_saved = [m for m in mixed if m["planned_saved_bytes"] <= r["planned_saved_bytes"]]
        best_saved = min(fitting_saved, key=lambda m: m["estimated_added_seconds"]) if fitting_saved else None
        cheaper_saved = best_saved is not None and best_saved["estimated_added_seconds"] < r["estimated_added_seconds"]
        out.append(
            {
                "budget": r["budget"],
                "recompute_only_peak": r["predicted_peak_bytes"],
                "recompute_only_seconds": r["estimated_added_seconds"],
                "matmul_recomputes": r["matmul_recomputes"],
                "best_mixed": None if best is None else {k: best[k] for k in ("family", "budget", "predicted_peak_bytes", "estimated_added_seconds")},
                "mixed_cheaper": cheaper,
                "best_mixed_at_saved": None if best_saved is None else {k: best_saved[k] for k in ("family", "budget", "planned_saved_bytes", "estimated_added_seconds")},
                "mixed_cheaper_at_saved": cheaper_saved,
            }
        )

        def fmt(m):
            return "-" if m is None else f"{mib(m['predicted_peak_bytes'])}, {1e6 * m['estimated_added_seconds']:.1f}"

        saved_text = "-" if best_saved is None else (
            f"{best_saved['family']}@{best_saved['budget']:g}, {mib(best_saved['planned_saved_bytes'])}, "
            f"{1e6 * best_saved['estimated_added_seconds']:.1f}"
        )
        lines.append(
            f"| {r['budget']:g} | {mib(r['predicted_peak_bytes'])}, {mib(r['planned_saved_bytes'])}, "
            f"{1e6 * r['estimated_added_seconds']:.1f} ({r['matmul_recomputes']}) "
            f"| {'-' if best is None else best['family'] + '@' + format(best['budget'], 'g') + ', ' + fmt(best)} "
            f"| {'yes' if cheaper else 'no'} | {saved_text} | {'yes' if cheaper_saved else 'no'} "
            f"| {fmt(same.get('mixed/aggressive'))} | {fmt(same.get('mixed/balanced'))} |"
        )
    if not rec:
        lines.append("| (recompute-only never recomputes a matmul output in this sweep) | | | | | | | |")
    return "\n".join(lines), out


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (no other point has lower x and lower y)."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not out or y < out[-1][1]:
            out.append((x, y))
    return out


def plot(groups: dict[str, list[dict[str, Any]]], path: str) -> None:
    """One row per (model, profile); left: time vs planned peak, right: time
    vs saved bytes. Markers: every plan; lines: each family's Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 4.2 * len(groups)), squeeze=False)
    for row_axes, (title, rows) in zip(axes, groups.items()):
        for ax, key, label in (
            (row_axes[0], "predicted_peak_bytes", "planned peak of the step (MiB, simulator)"),
            (row_axes[1], "planned_saved_bytes", "saved at the fw/bw boundary (MiB)"),
        ):
            for family in FAMILIES:
                pts = [(r[key] / 2**20, 1e6 * r["estimated_added_seconds"], r) for r in rows if r["family"] == family]
                if not pts:
                    continue
                color, marker = STYLE[family]
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, alpha=0.8, label=family)
                front = frontier([(p[0], p[1]) for p in pts])
                ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=color, alpha=0.6)
                for x, y, r in pts:
                    ax.annotate(f"{r['budget']:g}", (x, y), fontsize=6, color=color, xytext=(3, 3), textcoords="offset points")
                    if family == "recompute-only" and r["matmul_recomputes"] > 0:
                        ax.scatter([x], [y], s=140, facecolors="none", edgecolors="black", linewidths=1.0)
            ax.set_xlabel(label)
            ax.set_ylabel("estimated added time (us)")
            if max(r["estimated_added_seconds"] for r in rows) > 100 * min(
                (r["estimated_added_seconds"] for r in rows if r["estimated_added_seconds"] > 0), default=1
            ):
                ax.set_yscale("symlog", linthresh=10)
            ax.set_title(title)
            ax.grid(alpha=0.3)
        row_axes[0].legend(fontsize=8, title="numbers: budget; circled: recompute-only recomputes a matmul", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------
# measured step time / peak memory on CPU
# ---------------------------------------------------------------------------


def measure(name: str, cfg, args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    import torch._inductor.config as inductor_config

    from adacc_examples.benchmarking import Variant, results_table, run_variants

    model = init_weights(build_model(name, cfg))
    gen = torch.Generator().manual_seed(0)
    batches = [gpt_batch(cfg, args.batch, gen) for _ in range(2)]
    variants = [Variant(name="eager (no checkpointing)", kind="eager")]
    for budget in args.measure_budgets:
        for family, options in FAMILIES.items():
            variants.append(
                Variant(
                    name=f"{family} @{budget:g}",
                    kind=args.measure_backend,
                    options={**options, "memory_budget": budget, "device_profile": args.profile},
                )
            )
    with inductor_config.patch(fallback_random=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = run_variants(model, batches, variants, timing_repeats=args.repeats)
    table = results_table(results, reference="eager (no checkpointing)")
    raw = [
        {
            "name": r.name,
            "peak_bytes": r.peak_bytes,
            "predicted_peak_bytes": r.predicted_peak_bytes,
            "planned_saved_bytes": r.planned_saved_bytes,
            "estimated_added_seconds": r.estimated_added_seconds,
            "step_seconds": r.step_seconds,
            "compile_seconds": r.compile_seconds,
            "losses": r.losses,
            "codecs": [rep["summary"]["codecs"] for rep in r.reports],
            "decisions": [rep["summary"]["decisions"] for rep in r.reports],
        }
        for r in results
    ]
    return table, raw


# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt", "llama"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
    parser.add_argument("--profile", default="h100", help="device_profile of the main sweep")
    parser.add_argument("--cpu-profile-model", default="gpt", help="model of the extra sweep with the calibrated CPU profile ('' = skip)")
    parser.add_argument("--measure-budgets", type=float, nargs="*", default=[0.5, 0.3])
    parser.add_argument("--measure-backend", choices=("adacc", "adacc_eager"), default="adacc")
    parser.add_argument("--measure-models", nargs="*", default=None, help="default: --models")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", help="dtype of the planned (fake) model; measured runs stay float32")
    parser.add_argument("--tag", default="", help="suffix of the output file names, e.g. '_bf16'")
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--from-json", default="", help="re-make the table and plot from a pareto*.json (no planning)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the planning sweep (only the measured runs)")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python bench/bench_pareto.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        command = saved["command"]
        args.measure_budgets = []

    rows: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    sections = []
    comparisons = {}
    traces = {}
    runs = [(m, args.profile) for m in args.models]
    if args.cpu_profile_model:
        runs.append((args.cpu_profile_model, "auto"))
    captured_by_model: dict[str, CapturedJoint] = {}
    for name, profile in [] if args.no_sweep else runs:
        cfg = model_config(name, args)
        if args.from_json:
            group = [r for r in saved["rows"] if r["model"] == name and r["profile"] == profile]
            traces = saved["trace_seconds"]
        elif name not in captured_by_model:
            captured_by_model[name] = capture_joint(
                lambda: build_model(name, cfg, getattr(torch, args.dtype)), lambda: gpt_batch(cfg, args.batch)
            )
            traces[name] = captured_by_model[name].trace_seconds
            print(f"{name}: joint graph traced under fake tensors in {traces[name]:.1f} s", flush=True)
        if not args.from_json:
            group = sweep(captured_by_model[name], name, profile, args.budgets)
        rows += group
        label = "H100 cost model" if profile == "h100" else ("calibrated CPU profile" if profile == "auto" else profile)
        title = f"{name}, {label}"
        groups[title] = group
        table, comparison = comparison_table(group)
        comparisons[title] = comparison
        sections.append(
            f"### {title}: {args.layers} layers, d_model {args.d_model}, seq {args.seq_len}, batch {args.batch}, {args.dtype}\n\n"
            f"{sweep_table(group)}\n\n"
            f"Budgets where recompute-only recomputes matmul outputs:\n\n{table}\n"
        )
        print(sections[-1], flush=True)
    plot_path = os.path.join(args.out_dir, f"pareto{args.tag}.png")
    if not args.no_sweep:
        write_sweep(args, command, groups, sections, rows, traces, comparisons, plot_path)
    if args.measure_budgets:
        write_measured(args, command)
    return 0


def write_sweep(args, command, groups, sections, rows, traces, comparisons, plot_path) -> None:
    plot(groups, plot_path)

    header = (
        f"## Pareto: estimated added time vs planned peak — {datetime.date.today()} — "
        f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}\n\n"
        f"Command: `{command}`\n\n"
        "Planning only: each joint graph traced once under fake tensors, every plan made by adacc's full pipeline "
        "on a copy. peak = simulated whole-step peak (predicted_peak_bytes); act. peak = "
        "predicted_activation_peak_bytes; saved = planned_saved_bytes; est. added = estimated_added_seconds of the "
        "cost model; keep/rec/comp = decision counts over candidates; clamped = budget below the reachable minimum "
        "(minimum-memory plan used); fits = simulated activation peak within the budget. "
        f"Plot: `{plot_path}`.\n"
    )
    with open(os.path.join(args.out_dir, f"pareto{args.tag}.md"), "w") as f:
        f.write(header + "\n" + "\n".join(sections))
    with open(os.path.join(args.out_dir, f"pareto{args.tag}.json"), "w") as f:
        json.dump({"command": command, "trace_seconds": traces, "rows": rows, "comparisons": comparisons}, f, indent=1)


def write_measured(args, command) -> None:
    measured_sections = []
    measured_raw = {}
    for name in args.measure_models if args.measure_models is not None else args.models:
        cfg = model_config(name, args)
        table, raw = measure(name, cfg, args)
        measured_raw[name] = raw
        measured_sections.append(
            f"### {name}: {args.layers} layers, d_model {args.d_model}, seq {args.seq_len}, batch {args.batch}, fp32\n\n{table}\n"
        )
        print(measured_sections[-1], flush=True)
    header = (
        f"## Measured on CPU: the same plans (device_profile={args.profile}) — {datetime.date.today()} — "
        f"{os.cpu_count()} cores (shared), torch {torch.__version__}\n\n"
        f"Command: `{command}`\n\nBackend: `{args.measure_backend}` "
        f"({'Inductor C++ codegen' if args.measure_backend == 'adacc' else 'graphs run eagerly'}). "
        "peak = measured peak of one fw+bw step (profiler allocator trace, not counting params); "
        "predicted / saved = adacc's simulator for the plan made in that compile (under Inductor the joint graph "
        "has been through Inductor's joint-graph passes first, so these plans can differ from the fake-tensor sweep's); "
        "step ms = median of interleaved repeats; ratios vs eager without "
        "checkpointing. On CPU the codecs are torch reference implementations, so compressed plans are "
        "expected to be slower here than the H100 cost model says.\n"
    )
    with open(os.path.join(args.out_dir, f"pareto_measured{args.tag}.md"), "w") as f:
        f.write(header + "\n" + "\n".join(measured_sections))
    with open(os.path.join(args.out_dir, f"pareto_measured{args.tag}.json"), "w") as f:
        json.dump(measured_raw, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
