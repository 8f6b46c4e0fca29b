"""One training step of a Llama-3-style model under every memory strategy,
side by side, in one command.

    python bench/gpu_step.py              # one GPU (H100 80 GB), under 8 minutes
    python bench/gpu_step.py --smoke      # tiny sizes; runs on CPU (the tests)
    python bench/gpu_step.py --sizes cpu4 # 4 layers, d_model 256, seq 128 on CPU

Why: adacc is only worth its planning if, at a realistic scale, it beats
what a user would otherwise run: no checkpointing where it fits, full
per-block checkpointing, torchtitan's selective op checkpointing, PyTorch's
``activation_memory_budget`` partitioner and an auto_perf_maxing-style LP
planner (`apm_policy`). The model is a Hugging Face ``LlamaForCausalLM``
built from a config (random weights; GQA, SwiGLU, RoPE theta 500000, bf16
on a GPU), trained with AdamW; every strategy is compiled by
``torch.compile`` and trains its own copy of the same weights on the same
batches (`adacc_examples.benchmarking.run_variants`).

Two rounds, each timed interleaved (one step of each strategy in turn,
medians):

1. no checkpointing, full AC (``checkpoint`` on every decoder block),
   torchtitan-style selective op checkpointing (`selective_ac_context`);
2. full AC again (the reference of the round); at byte budgets of
   ``--budget-factors`` times full AC's peak measured in round 1 (as
   ``bench/bench_peak.py --step-budget`` does), the auto_perf_maxing-style
   LP plan and adacc lossless / balanced (``budget_scope="step"``); and
   PyTorch's budget partitioner at ``--torch-budgets``. In that order of
   priority: the tightest budget's three, PyTorch's, then the next budget's
   (a run short of time drops the tail).

Per strategy: tokens/s, the forward and backward's measured peak (what the
step budgets bound: above the weights and optimizer state allocated before
the step; ``torch.cuda.max_memory_allocated`` on a GPU, the profiler's
allocator trace on a CPU, `adacc_compile.measure`), the whole step's peak
with the optimizer step, compile time, adacc's planning time, and the FLOPs
each checkpointing strategy recomputes (an eager step of each under
``FlopCounterMode``, less the step without checkpointing).

Writes ``gpu_step.md`` and ``gpu_step.json`` (with a ``meta`` block) to
``--out`` (default: env ``OUT``, else the current directory), rewritten
after each strategy compiles and after each measurement, so that a run cut
short keeps what it measured. ``--time-budget-s`` stops starting new
strategies once the time spent plus the longest compile so far would pass it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import os
import pathlib
import platform
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import _examples_path  # noqa: F401  (examples/ on sys.path)
import apm_policy
from adacc_examples.benchmarking import Variant, VariantResult, run_variants
from bench_peak import HFCausalLM
from gpu_check import Report, machine_line, measuring

STRATEGIES = ("none", "full_ac", "sac", "torch_budget", "apm", "adacc_lossless", "adacc_balanced")

# --------------------------------------------------------------------------
# sizes and model
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    seq: int
    batch: int
    dtype: str
    """Of the weights on a GPU; float32 on a CPU."""
    steps: int
    """Training steps before the measurements (the first compiles)."""
    timing_repeats: int


SIZES = {
    # 0.52 B parameters: 8 blocks of d_model 2048, 16 query / 4 key-value
    # heads, SwiGLU 6144; seq 2048, batch 4 (8192 tokens a step). The vocab is
    # cut to 32000 so that the blocks, not the logits, dominate.
    "full": Sizes(layers=8, hidden=2048, heads=16, kv_heads=4, intermediate=6144, vocab=32000, seq=2048,
                  batch=4, dtype="bfloat16", steps=2, timing_repeats=5),
    "cpu4": Sizes(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=512, seq=128,
                  batch=4, dtype="float32", steps=2, timing_repeats=3),
    "smoke": Sizes(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, seq=32,
                   batch=2, dtype="float32", steps=2, timing_repeats=2),
}


def build_model(sizes: Sizes, device: torch.device) -> tuple[HFCausalLM, list[tuple[torch.Tensor, ...]]]:
    """The model (random weights from a config, never downloaded) and its
    batches (token ids, used as their own labels)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        max_position_embeddings=sizes.seq, rope_theta=500000.0, use_cache=False,
    )
    model = HFCausalLM(transformers.LlamaForCausalLM(config))
    dtype = getattr(torch, sizes.dtype) if device.type == "cuda" else torch.float32
    model = model.to(device=device, dtype=dtype).train()
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(sizes.steps):
        ids = torch.randint(0, sizes.vocab, (sizes.batch, sizes.seq), generator=gen).to(device)
        batches.append((ids, ids))
    return model, batches


def blocks(model: HFCausalLM) -> Sequence[torch.nn.Module]:
    return model.model.model.layers


def install_block_checkpointing(model: HFCausalLM, functions: Sequence[Callable[..., Any]]) -> None:
    """Each decoder block runs under its own checkpoint function (Hugging
    Face's per-layer hook for it, which ``gradient_checkpointing_enable``
    would set to one function for all)."""
    model.model.config.use_cache = False
    layers = blocks(model)
    if len(functions) != len(layers):
        raise ValueError(f"{len(functions)} checkpoint functions for {len(layers)} blocks")
    for layer, fn in zip(layers, functions):
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = fn


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4)


# --------------------------------------------------------------------------
# torchtitan-style selective op checkpointing
# --------------------------------------------------------------------------


def torchtitan_save_ops() -> set[Any]:
    """torchtitan's default save list (``_save_list`` / ``_get_default_save_ops``
    in torchtitan/models/llama3/infra/parallelize.py and
    torchtitan/distributed/activation_checkpoint.py): matmuls, the SDPA
    kernels (with the CPU flash kernel, so that it also works here), the max
    of low-precision scaling and reduce-scatter; ops a build lacks are skipped."""
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.max.default}
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    with contextlib.suppress(AttributeError, RuntimeError):
        ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return ops


def torchtitan_policy() -> Callable[..., CheckpointPolicy]:
    """torchtitan's op-level selective checkpointing policy for one
    checkpointed call of a block (``_custom_policy`` in
    ``_apply_ac_to_transformer_block``, torchtitan/models/llama3/infra/parallelize.py,
    earlier torchtitan/parallelisms/parallelize_llama.py; now ``_apply_op_sac``
    in torchtitan/distributed/activation_checkpoint.py): save the outputs of
    the save list, but of the matmuls only every other one (it counts the mm
    calls of the call, forward and recompute apart, and recomputes the
    even-numbered ones); recompute everything else."""
    save_ops, mm = torchtitan_save_ops(), torch.ops.aten.mm.default
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            counts[mode] += 1
        save = func in save_ops and not (func == mm and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_ac_context() -> Any:
    """``context_fn`` of one checkpointed block: a fresh `torchtitan_policy`
    (fresh mm counts) at every call, as torchtitan makes one."""
    return create_selective_checkpoint_contexts(torchtitan_policy())


def install_selective_ac(model: HFCausalLM) -> None:
    fn = functools.partial(checkpoint, use_reentrant=False, context_fn=selective_ac_context)
    install_block_checkpointing(model, [fn] * len(blocks(model)))


def install_apm_plan(plan: apm_policy.Plan) -> Callable[[HFCausalLM], None]:
    return lambda model: install_block_checkpointing(model, [apm_policy.checkpoint_fn(keep) for keep in plan.keep])


# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------


def first_round(strategies: Sequence[str]) -> list[Variant]:
    out = []
    if "none" in strategies:
        out.append(Variant(name="no checkpointing", kind="inductor"))
    out.append(Variant(name="full AC", kind="full_ac"))
    if "sac" in strategies:
        out.append(Variant(name="torchtitan selective AC", kind="checkpoint_policy", prepare=install_selective_ac))
    return out


@dataclass(frozen=True, slots=True)
class ApmEntry:
    factor: float
    budget_bytes: int
    plan: apm_policy.Plan | None
    error: str | None


def apm_entries(
    model: HFCausalLM, batch: tuple[torch.Tensor, ...], full_ac_peak: int, factors: Sequence[float]
) -> tuple[apm_policy.BlockProfile, list[ApmEntry]]:
    """Profile one block (eager, the step's real inputs), calibrate ``F`` on
    full AC's measured peak, and plan at each budget."""
    layers = blocks(model)
    args, kwargs = apm_policy.capture_block_call(model, layers[0], lambda: model(*batch))
    profile = apm_policy.profile_block(layers[0], args, kwargs, apm_policy.Roofline.for_device(batch[0].device))
    fixed = apm_policy.fixed_bytes_from_measured_floor(profile, len(layers), full_ac_peak)
    entries = []
    for factor in factors:
        budget = int(factor * full_ac_peak)
        try:
            entries.append(ApmEntry(factor, budget, apm_policy.plan(profile, len(layers), budget, fixed), None))
        except apm_policy.InfeasibleBudget as exc:
            entries.append(ApmEntry(factor, budget, None, str(exc)))
    return profile, entries


def second_round(
    strategies: Sequence[str], full_ac_peak: int | None, factors: Sequence[float], apm: Sequence[ApmEntry],
    device_profile: str, torch_budgets: Sequence[float],
) -> list[Variant]:
    """Full AC; then for the first budget factor, the APM plan, adacc
    lossless and adacc balanced; PyTorch's partitioner at each of its
    budgets; then the other factors' three (so that a run short of time
    keeps the first budget and PyTorch's). No byte budgets without a
    measured full-AC peak."""
    out = [Variant(name="full AC", kind="full_ac")]
    torch_variants = [Variant(name=f"torch budget @{b:g}", kind="torch_budget", budget=b, solver="dp")
                      for b in torch_budgets] if "torch_budget" in strategies else []
    by_factor = {entry.factor: entry for entry in apm}
    for n, factor in enumerate(factors if full_ac_peak else []):
        if n == 1:
            out += torch_variants
        budget = int(factor * full_ac_peak)
        label = f"@{factor:g}x full AC ({budget / 2**20:.1f} MiB)"
        entry = by_factor.get(factor)
        if entry is not None and entry.plan is not None:
            out.append(Variant(name=f"APM LP {label}", kind="checkpoint_policy", prepare=install_apm_plan(entry.plan),
                               options={"memory_budget": budget}))
        for accuracy in ("lossless", "balanced"):
            if f"adacc_{accuracy}" in strategies:
                out.append(Variant(name=f"adacc {accuracy} {label}", kind="adacc", options={
                    "memory_budget": budget, "budget_scope": "step", "accuracy": accuracy,
                    "device_profile": device_profile,
                }))
    if len(factors) < 2 or not full_ac_peak:
        out += torch_variants
    return out


# --------------------------------------------------------------------------
# recompute count
# --------------------------------------------------------------------------


def step_flops(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], prepare: Callable[[Any], None] | None) -> int:
    """FLOPs of one eager forward and backward of a copy of ``model``
    prepared by ``prepare`` (``FlopCounterMode``)."""
    from torch.utils.flop_counter import FlopCounterMode

    copy_ = copy.deepcopy(model)
    if prepare is not None:
        prepare(copy_)
    counter = FlopCounterMode(display=False)
    with counter:
        copy_(*batch).backward()
    return int(counter.get_total_flops())


def recomputed_flops(model: HFCausalLM, batch: tuple[torch.Tensor, ...], variants: Sequence[Variant]) -> dict[str, int]:
    """Per checkpointing strategy: its eager step's FLOPs less those of the
    step without checkpointing (what it recomputes)."""
    base = step_flops(model, batch, None)
    out = {}
    for v in variants:
        if v.kind == "full_ac":
            out[v.name] = step_flops(model, batch, lambda m: setattr(m, "checkpoint_blocks", True)) - base
        elif v.kind == "checkpoint_policy" and v.prepare is not None:
            out[v.name] = step_flops(model, batch, v.prepare) - base
    return out


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """What the run has measured so far, and the report it rewrites."""

    report: Report
    meta: dict[str, Any]
    tokens_per_step: int
    rounds: list[list[VariantResult]] = dataclasses.field(default_factory=list)
    variants: list[list[Variant]] = dataclasses.field(default_factory=list)
    recomputed: dict[str, int] = dataclasses.field(default_factory=dict)
    apm: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for round_, (results, variants) in enumerate(zip(self.rounds, self.variants), start=1):
            ref = next((r for r in results if r.name == "full AC" and r.error is None and r.step_seconds), None)
            for r, v in zip(results, variants):
                step = r.median_step_seconds
                out.append({
                    "name": r.name, "round": round_, "kind": v.kind,
                    "budget_bytes": v.options.get("memory_budget"),
                    "tokens_per_s": self.tokens_per_step / step if r.step_seconds else None,
                    "median_step_seconds": step if r.step_seconds else None,
                    "step_vs_full_ac": step / ref.median_step_seconds if ref and r.step_seconds else None,
                    "peak_bytes": r.peak_bytes or None, "step_peak_bytes": r.step_peak_bytes,
                    "peak_vs_full_ac": r.peak_bytes / ref.peak_bytes if ref and r.peak_bytes and ref.peak_bytes else None,
                    "compile_seconds": r.compile_seconds or None, "planning_seconds": r.planning_seconds,
                    "predicted_peak_bytes": r.predicted_peak_bytes,
                    "recomputed_flops": self.recomputed.get(r.name), "step_seconds": r.step_seconds,
                    "losses": r.losses, "error": r.error,
                })
        return out

    def write(self) -> None:
        entries = self.entries()
        self.report.sections = [self.meta["title"], table(entries), *self.notes]
        self.report.data = {"meta": self.meta, "strategies": entries, "apm": self.apm}
        self.report.write()

    def results(self, index: int) -> list[VariantResult]:
        return self.rounds[index] if index < len(self.rounds) else []

    def progress(self, index: int, variants: list[Variant]) -> Callable[[list[VariantResult]], None]:
        def update(results: list[VariantResult]) -> None:
            while len(self.rounds) <= index:
                self.rounds.append([])
                self.variants.append([])
            self.rounds[index], self.variants[index] = list(results), list(variants)
            self.write()

        return update


def table(entries: Sequence[dict[str, Any]]) -> str:
    def mib(v: int | None) -> str:
        return "" if v is None else f"{v / 2**20:.1f}"

    def num(v: float | None, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    lines = [
        "| strategy | round | tokens/s | step ms | step vs full AC | fwd+bwd peak MiB | peak vs full AC "
        "| whole-step peak MiB | budget MiB | recomputed GFLOP | compile s | plan s | final loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        if e["error"] is not None and not e["step_seconds"]:
            lines.append(f"| {e['name']} | {e['round']} | {e['error'].replace('|', '/')} |" + " |" * 10)
            continue
        budget = e["budget_bytes"] if isinstance(e["budget_bytes"], int) else None
        lines.append(
            f"| {e['name']} | {e['round']} | {num(e['tokens_per_s'], '.0f')} "
            f"| {num(e['median_step_seconds'] and 1e3 * e['median_step_seconds'], '.1f')} "
            f"| {num(e['step_vs_full_ac'], '.2f')} | {mib(e['peak_bytes'])} | {num(e['peak_vs_full_ac'], '.2f')} "
            f"| {mib(e['step_peak_bytes'])} | {mib(budget)} "
            f"| {'' if e['recomputed_flops'] is None else format(e['recomputed_flops'] / 1e9, '.3g')} "
            f"| {num(e['compile_seconds'], '.1f')} | {num(e['planning_seconds'], '.1f')} "
            f"| {num(e['losses'][-1] if e['losses'] else None, '.4f')} |"
        )
    return "\n".join(lines)


def apm_summary(profile: apm_policy.BlockProfile, entries: Sequence[ApmEntry], layers: int) -> dict[str, Any]:
    return {
        "profile": {
            "input_bytes": profile.input_bytes, "saved_bytes": profile.saved_bytes,
            "forward_peak_bytes": profile.forward_peak_bytes, "backward_peak_bytes": profile.backward_peak_bytes,
            "candidates": len(profile.candidates), "candidate_bytes": sum(c.bytes for c in profile.candidates),
            "floor_bytes": apm_policy.floor_bytes(profile, layers),
        },
        "plans": [
            {"factor": e.factor, "budget_bytes": e.budget_bytes, "error": e.error}
            | ({} if e.plan is None else {
                "fixed_bytes": e.plan.fixed_bytes, "predicted_peak_bytes": e.plan.predicted_peak_bytes,
                "binding_row": e.plan.binding_row, "kept_bytes": list(e.plan.kept_bytes),
                "lp_kept_bytes": list(e.plan.lp_kept_bytes), "kept_calls": [len(k) for k in e.plan.keep],
                "recompute_seconds": e.plan.recompute_seconds, "lp_recompute_seconds": e.plan.lp_recompute_seconds,
                "full_recompute_seconds": e.plan.full_recompute_seconds, "solve_seconds": e.plan.solve_seconds,
            })
            for e in entries
        ],
    }


def apm_lines(entries: Sequence[ApmEntry], results: Sequence[VariantResult]) -> list[str]:
    by_name = {r.name: r for r in results}
    lines = []
    for e in entries:
        if e.plan is None:
            lines.append(f"- APM LP @{e.factor:g}x: no plan ({e.error})")
            continue
        measured = next((r for n, r in by_name.items() if n.startswith(f"APM LP @{e.factor:g}x")), None)
        tail = ""
        if measured is not None and measured.peak_bytes:
            tail = (f", measured {measured.peak_bytes / 2**20:.1f} MiB "
                    f"({measured.peak_bytes / e.budget_bytes:.3f}x the budget)")
        lines.append(
            f"- APM LP @{e.factor:g}x: budget {e.budget_bytes / 2**20:.1f} MiB, F {e.plan.fixed_bytes / 2**20:.1f} MiB, "
            f"predicted {e.plan.predicted_peak_bytes / 2**20:.1f} MiB (binding: {e.plan.binding_row}), kept per block "
            f"{', '.join(f'{b / 2**20:.1f}' for b in e.plan.kept_bytes)} MiB{tail}"
        )
    return lines


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def free_device_memory(device: torch.device) -> None:
    """The last round's model copies, gone before the next takes room."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_round(model: HFCausalLM, batches: Sequence[tuple[torch.Tensor, ...]], variants: list[Variant], run: Run,
              index: int, clock: Clock, **common: Any) -> list[VariantResult]:
    """One round of `run_variants`, reporting as it goes (which compiles
    each checkpointed block whole: `compat.checkpoint_side_effects_not_replayed`)."""
    return run_variants(model, batches, variants, should_start=clock.gate(lambda: run.results(index)),
                        progress=run.progress(index, variants), **common)


@dataclass(slots=True)
class Clock:
    started: float
    budget_s: float
    skipped: list[str] = dataclasses.field(default_factory=list)
    compiles: list[float] = dataclasses.field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def admits(self, what: str, expected_s: float = 0.0) -> bool:
        if self.elapsed() + expected_s < self.budget_s:
            return True
        self.skipped.append(what)
        return False

    def gate(self, results_of: Callable[[], Sequence[VariantResult]]) -> Callable[[Variant], bool]:
        """``should_start`` for run_variants: a strategy starts if the
        longest compile so far still fits."""
        def should_start(variant: Variant) -> bool:
            done = [r.compile_seconds for r in results_of() if r.compile_seconds]
            return self.admits(variant.name, max(self.compiles + done, default=0.0))

        return should_start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (same as --sizes smoke)")
    parser.add_argument("--sizes", choices=sorted(SIZES), default=None, help="default: full (smoke with --smoke)")
    parser.add_argument("--layers", type=int, default=None, help="override the number of blocks")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder (default: $OUT or .)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="full AC always runs (the reference)")
    parser.add_argument("--torch-budgets", nargs="*", type=float, default=None,
                        help="default: 0.3 0.5 0.7 (0.5 with --smoke)")
    parser.add_argument("--budget-factors", nargs="*", type=float, default=None,
                        help="round-2 byte budgets, as multiples of full AC's measured peak "
                        "(default: 1.0 1.25; 1.25 with --smoke)")
    parser.add_argument("--time-budget-s", type=float, default=390.0,
                        help="start no strategy whose compile (the longest so far) would end past this")
    parser.add_argument("--device-profile", default=None,
                        help="adacc's cost model (default: auto on a GPU, h100 on a CPU, where a measured "
                        "profile would time every codec first)")
    parser.add_argument("--caches", choices=("on", "off"), default="on",
                        help="torch's compile caches ('on': as torch sets them)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    clock = Clock(time.perf_counter(), args.time_budget_s)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = SIZES[args.sizes or ("smoke" if args.smoke else "full")]
    small = sizes is SIZES["smoke"]  # every strategy once: fewer compiles
    if args.torch_budgets is None:
        args.torch_budgets = [0.5] if small else [0.3, 0.5, 0.7]
    if args.budget_factors is None:
        args.budget_factors = [1.25] if small else [1.0, 1.25]
    if args.layers is not None:
        sizes = dataclasses.replace(sizes, layers=args.layers)
    if device.type != "cuda" and sizes is SIZES["full"]:
        print("no GPU here: use --smoke or --sizes cpu4 for a CPU run", file=sys.stderr)
        return 2
    profile_name = args.device_profile or ("auto" if device.type == "cuda" else "h100")
    model, batches = build_model(sizes, device)
    params = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    command = f"python bench/gpu_step.py {' '.join(argv)}".strip()
    triton = "none"
    with contextlib.suppress(ImportError):
        import triton as triton_module

        triton = triton_module.__version__
    meta = {
        "date": str(datetime.date.today()), "command": command, "machine": machine_line(device),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{platform.machine()} CPU",
        "cpus": os.cpu_count(), "torch": torch.__version__, "triton": triton, "caches": args.caches,
        "sizes": dataclasses.asdict(sizes), "parameters": params, "dtype": dtype,
    }
    meta["title"] = (
        f"# One training step, every strategy\n\n{meta['machine']}; command: `{command}`\n\n"
        f"HF LlamaForCausalLM, {params / 1e6:.1f} M parameters: {sizes.layers} blocks, d_model {sizes.hidden}, "
        f"{sizes.heads} query / {sizes.kv_heads} key-value heads, SwiGLU {sizes.intermediate}, vocab {sizes.vocab}, "
        f"seq {sizes.seq}, batch {sizes.batch}, {dtype}, AdamW, torch.compile (Inductor).\n\n"
        "Peaks are above the weights and optimizer state allocated before the step; ratios are against the full AC "
        "of the same round (steps interleaved within a round). Recomputed GFLOP: an eager step under "
        "FlopCounterMode less the step without checkpointing (blank where the compiler decides what to "
        "recompute: PyTorch's partitioner, adacc)."
    )
    run = Run(Report(pathlib.Path(args.out), stem="gpu_step"), meta, sizes.batch * sizes.seq)
    run.write()
    common = dict(timing_repeats=sizes.timing_repeats, device=device.type, measuring=measuring, keep_going=True,
                  caches=args.caches == "on", optimizer=adamw, step_peak=True)

    round1 = first_round(args.strategies)
    results1 = run_round(model, batches, round1, run, 0, clock, **common)
    clock.compiles += [r.compile_seconds for r in results1 if r.compile_seconds]
    full_ac = next(r for r in results1 if r.name == "full AC")
    full_ac_peak = full_ac.peak_bytes if full_ac.error is None and full_ac.peak_bytes else None
    apm: list[ApmEntry] = []
    if "apm" in args.strategies and full_ac_peak:
        profile, apm = apm_entries(model, batches[0], full_ac_peak, args.budget_factors)
        run.apm = apm_summary(profile, apm, sizes.layers)
    round2 = second_round(args.strategies, full_ac_peak, args.budget_factors, apm, profile_name, args.torch_budgets)
    counted = list(round1)
    if len(round2) > 1:
        free_device_memory(device)
        if clock.admits("round 2", max(clock.compiles, default=0.0)):
            results2 = run_round(model, batches, round2, run, 1, clock, **common)
            run.notes = apm_lines(apm, results2)
            counted += [v for v, r in zip(round2, results2) if r.error is None and v.name != "full AC"]
    free_device_memory(device)
    if clock.admits("recompute count"):
        run.recomputed = recomputed_flops(model, batches[0], counted)
    tail = f"Total {clock.elapsed():.0f} s." + (f" Not started (time budget): {', '.join(clock.skipped)}." if clock.skipped else "")
    run.notes = run.notes + [tail]
    run.meta["seconds"] = clock.elapsed()
    run.write()
    print(run.report.sections[1] + "\n\n" + "\n".join(run.notes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
