"""``adacc`` command line: will a training job fit on a GPU, and with which plan.

    adacc plan MODEL --gpu h100 --batch 4 --seq 4096
        [--gpus 8 --fsdp] [--optimizer adamw|adamw8bit|sgd|none] [--precision fp32-master|bf16]
        [--gpu-memory 24GiB] [--budget 60GiB | --budget 0.5 [--budget-scope activations|step]]
        [--dtype bf16] [--accuracy lossless|balanced|aggressive] [--tp N] [--dump DIR] [--json]

MODEL: a ``config.json`` path, a preset (``llama-2-7b``), an architecture
transformers ships (``llama``) or ``module:factory`` (`model_source`). The
model is traced under fake tensors and planned with the GPU's built-in
profile (`plan_preview`). Without ``--budget`` the activations get what the
GPU has left after the weights, gradients, optimizer state (per optimizer,
precision and sharding) and a reserve (`job_memory`). Printed first: fits
or not on that GPU, with one rank's memory part by part; then the plan
folded by block, the predicted peaks against no checkpointing, full
activation checkpointing and PyTorch's memory-budget partitioner on the
same graph, the estimated step time, and, when the budget cannot be met,
the smallest budget that can be and the largest batch that fits
(`batch_search`). ``--json`` prints the answer as fields.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Sequence, TextIO

import torch

from adacc_compile.config import AdaccConfig, parse_bytes
from adacc_compile.job_memory import (
    GPU_CAPACITY_BYTES, OPTIMIZERS, PRECISIONS, TrainingSetup, budget_for, job_memory, profile_of,
)
from adacc_compile.model_source import ModelNotFound, ModelSource, resolve_model
from adacc_compile.partitioner import whole_ops

ACCURACY_MODES = ("lossless", "balanced", "aggressive")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adacc", description="adacc: plan saved activations of training.")
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser(
        "plan", help="trace MODEL under fake tensors and plan it for a GPU",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("model", metavar="MODEL", help="config.json path, preset, transformers architecture, or module:factory")
    plan.add_argument("--gpu", required=True, choices=sorted(GPU_CAPACITY_BYTES),
                      help="the GPU: its cost model (a100-40gb uses a100's) and memory")
    plan.add_argument("--budget", help="activation budget: bytes (60GiB, 800MB) or a ratio in (0, 1]; "
                                       "default: what the GPU has left after weights, gradients, optimizer state "
                                       "and a reserve (the step peak's budget)")
    plan.add_argument("--gpu-memory", help="the GPU's memory, for a GPU not in the list (24GiB)")
    plan.add_argument("--gpus", type=int, default=1, help="ranks (with --fsdp: the ranks the model is sharded over)")
    plan.add_argument("--fsdp", action="store_true", help="FSDP2: parameters, gradients and optimizer state sharded")
    plan.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    plan.add_argument("--precision", default="fp32-master", choices=PRECISIONS,
                      help="fp32-master: fp32 parameters, gradients and optimizer state, bf16 compute; "
                           "bf16: all in bf16")
    plan.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    plan.add_argument("--batch", type=int, required=True, help="micro-batch size (sequences)")
    plan.add_argument("--seq", type=int, required=True, help="sequence length (tokens)")
    plan.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    plan.add_argument("--accuracy", default="lossless", choices=ACCURACY_MODES)
    plan.add_argument("--budget-scope", default="activations", choices=("activations", "step"),
                      help="what --budget bounds: the activation peak, or the whole step's peak (gradients too; "
                           "parameters and optimizer state not included)")
    plan.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: plan one rank's shard")
    plan.add_argument("--dump", metavar="DIR", help="write the dump artifacts and a strategy memory plot to DIR")
    plan.add_argument("--no-fold", action="store_true",
                      help="trace every block (default: a deep stack of identical blocks is traced with three "
                           "and planned at its full depth)")
    defaults = AdaccConfig()  # the backend's own defaults, stated once
    plan.add_argument("--solver-time-limit", type=float, default=defaults.solver_time_limit_s,
                      help="HiGHS time limit, seconds (a safety net: where it expires, plans may differ between runs)")
    plan.add_argument("--solver-node-limit", type=int, default=defaults.solver_node_limit,
                      help="branch-and-bound nodes HiGHS may explore per solve (the same plan in every run)")
    return parser


def main(argv: Sequence[str] | None = None, *, fork: bool | None = None) -> int:
    """The ``adacc`` command. ``fork`` (by default: when run as a command,
    ``argv`` None) lets ``adacc plan`` simulate the baselines in a forked child
    while it plans (`forked`), which is safe only in a process of its own."""
    from adacc_compile.plan_preview import GraphBreakBeforeLoss

    args = build_parser().parse_args(argv)
    try:
        return run_plan(args, sys.stdout, fork=argv is None if fork is None else fork)
    except (ModelNotFound, ValueError, GraphBreakBeforeLoss) as error:
        print(f"adacc plan: error: {error}", file=sys.stderr)
        return 2


def run_plan(args: argparse.Namespace, out: TextIO, *, fork: bool = False) -> int:
    from adacc_compile import batch_search, forked, plan_preview, plan_summary

    if fork:
        forked.no_monitor_threads()  # no helper thread may hold a lock at the fork

    if args.batch < 1 or args.seq < 1 or args.tp < 1 or args.gpus < 1:
        raise ValueError("--batch, --seq, --tp and --gpus must be positive")
    setup = TrainingSetup(optimizer=args.optimizer, precision=args.precision, gpus=args.gpus, fsdp=args.fsdp)
    capacity = parse_bytes(args.gpu_memory) if args.gpu_memory else GPU_CAPACITY_BYTES[args.gpu]
    source = resolve_model(args.model, tp=args.tp)
    options = {
        "device_profile": profile_of(args.gpu),
        "accuracy": args.accuracy,
        "budget_scope": args.budget_scope,
        "solver_time_limit_s": args.solver_time_limit,
        "solver_node_limit": args.solver_node_limit,
        "calibrate_codecs": False,  # fake tensors: nothing to calibrate on
        "on_infeasible": "warn",
    }
    # The ops kept whole depend on the codecs only; the options are checked here, before the trace.
    trace_config = AdaccConfig.from_options({**options, "memory_budget": args.budget or 1.0})
    progress = Progress(out)
    dtype = plan_preview.DTYPES[args.dtype]
    progress.start(f"tracing {source.label} (batch {args.batch}, seq {args.seq}) under fake tensors")
    fold = not args.no_fold
    traced = plan_preview.trace(
        source, batch=args.batch, seq=args.seq, dtype=dtype, fold=fold, whole_ops=whole_ops(trace_config)
    )
    progress.done()
    parameters = traced.parameter_bytes // dtype.itemsize
    block_parameters = traced.block_parameter_bytes // dtype.itemsize
    if args.budget is None:  # what the GPU has left for the plan
        budget, scope = budget_for(capacity, setup, parameters, block_parameters, traced.parameter_bytes)
        options.update(memory_budget=max(budget, 1), budget_scope=scope)
    else:
        options["memory_budget"] = args.budget
    if args.dump:
        options["dump_dir"] = args.dump
    config = AdaccConfig.from_options(options)
    minimum_config = AdaccConfig.from_options({**options, "dump_dir": None, "memory_budget": 2})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*reachable minimum.*")
        warnings.filterwarnings("ignore", message="The hashes produced for directed graphs changed")
        result = plan_preview.preview(traced, config, on_phase=lambda phase: progress.switch(phase), fork=fork)
        progress.done()
        search = None
        if not result.fits:
            progress.start("searching the largest batch that fits")
            def minimum_at(batch: int) -> int:
                return _reachable_minimum(source, batch, args.seq, dtype, minimum_config, fold)

            clamped = result.summary["budget_clamped_to_minimum"]
            search = batch_search.largest_batch(
                minimum_at,
                asked_batch=args.batch,
                minimum_bytes=_bounded_peak(result.summary) if clamped else minimum_at(args.batch),
                budget_bytes=int(result.summary["requested_budget_bytes"]),
            )
            progress.done()
    adacc = result.strategies[0]
    job = job_memory(
        capacity, setup, parameters, block_parameters, step_peak_bytes=adacc.step_peak_bytes,
        activation_peak_bytes=adacc.activation_peak_bytes, traced_gradient_bytes=traced.parameter_bytes,
    )
    if args.json:
        print(json.dumps(plan_summary.job_json(job, setup, args, result, search), indent=1), file=out)
        return 0
    text = "\n".join([*plan_summary.job_lines(job, setup, args), "", plan_summary.report_text(
        source=source, args=args, result=result, search=search)])
    print(text, file=out)
    if args.dump:
        plan_summary.write_dump(args.dump, text, result, search)
        print(f"\nartifacts: {args.dump}", file=out)
    return 0


def _reachable_minimum(
    source: ModelSource, batch: int, seq: int, dtype: torch.dtype, config: AdaccConfig, fold: bool
) -> int:
    """The lowest peak the budget bounds (`_bounded_peak`) a plan reaches
    at ``batch``: the simulated peak of the plan made for a budget of two
    bytes, which the budget stage clamps to the reachable minimum (the split
    graphs' simulation, not the model's bound, so it is what that plan
    would hold)."""
    from adacc_compile import plan_preview

    traced = plan_preview.trace(source, batch=batch, seq=seq, dtype=dtype, fold=fold, whole_ops=whole_ops(config))
    state = plan_preview.plan(traced, config)
    return _bounded_peak(state.report["summary"])


def _bounded_peak(summary: dict) -> int:
    """The simulated peak the budget bounds: the step's under ``budget_scope="step"``."""
    key = "predicted_peak_bytes" if summary.get("budget_scope") == "step" else "predicted_activation_peak_bytes"
    return int(summary[key])


class Progress:
    """Phase lines with elapsed seconds, only when ``out`` is a terminal (a
    log or a pipe gets only the report)."""

    def __init__(self, out: TextIO):
        self.out = out
        self.enabled = bool(getattr(out, "isatty", lambda: False)())
        self.phase = ""
        self.started = 0.0

    def start(self, phase: str) -> None:
        self.phase, self.started = phase, time.perf_counter()
        if self.enabled:
            print(f"  {phase} ...", end="", flush=True, file=self.out)

    def switch(self, phase: str) -> None:
        if self.phase:
            self.done()
        self.start(phase)

    def done(self) -> None:
        if self.enabled and self.phase:
            print(f" {time.perf_counter() - self.started:.1f} s", flush=True, file=self.out)
        self.phase = ""


if __name__ == "__main__":
    sys.exit(main())
