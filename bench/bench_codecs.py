"""Compress / decompress throughput of every registered codec against a plain copy.

Why a copy as the yardstick: a codec reads the activation once and writes a
smaller payload, so ``x.clone()`` of the same tensor (one read, one write) is
the bandwidth ceiling it should approach; the planner's `cost_seconds` model
assumes exactly that. Each codec gets an input it `applies` to (bool mask,
norm output feeding a matmul, GELU/SiLU input, softmax probabilities), so
newly registered codecs are picked up without editing this file.

Timing: warm-up, then ``--repeats`` rounds; each round times clone, compress
and decompress of every codec in turn (interleaved, so drift in clock or
load hits all of them alike), each measurement repeating the call until it
lasts ``--min-time``, and the median over rounds is reported. CPU runs the torch
reference path; with a GPU the tensors are on CUDA and ``ADACC_KERNELS=auto``
selects the Triton kernels.

Usage::

    python bench/bench_codecs.py                       # CPU or CUDA, markdown table
    python bench/bench_codecs.py --shape 8192 4096 --dtype float32 --json out.json
    python bench/bench_codecs.py --compile             # ops compiled by Inductor
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from adacc_compile.kernels import ApplyQuery, Codec, DecompressKind, available_codecs, get_codec
from adacc_compile.kernels.oplib import error_stats, use_triton


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A kind of saved activation: what the planner would ask, and how to make one."""

    label: str
    producer_class: str
    consumer_classes: tuple[str, ...]
    consumer_targets: tuple[str, ...]
    bool_input: bool
    make: Callable[[torch.Tensor], torch.Tensor]


SCENARIOS = (
    Scenario(label="dropout mask", producer_class="dropout", consumer_classes=("elementwise",),
             consumer_targets=("aten.mul.Tensor",), bool_input=True, make=lambda r: r > 0),
    Scenario(label="norm -> matmul", producer_class="norm", consumer_classes=("matmul",),
             consumer_targets=("aten.mm.default",), bool_input=False, make=lambda r: r),
    Scenario(label="gelu input", producer_class="matmul", consumer_classes=("activation",),
             consumer_targets=("aten.gelu_backward.default",), bool_input=False, make=lambda r: r),
    Scenario(label="silu input", producer_class="matmul", consumer_classes=("activation",),
             consumer_targets=("aten.silu_backward.default",), bool_input=False, make=lambda r: r),
    Scenario(label="softmax probs", producer_class="softmax", consumer_classes=("matmul",),
             consumer_targets=("aten._softmax_backward_data.default",), bool_input=False,
             make=lambda r: torch.softmax(r * 3, dim=-1)),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    codec: str
    input: str
    dtype: str
    shape: tuple[int, ...]
    kernels: str
    size_ratio: float
    relative_error: float
    compress_gbps: float
    decompress_gbps: float
    clone_gbps: float
    compress_vs_clone: float
    decompress_vs_clone: float


def pick_scenario(codec: Codec, shape: tuple[int, ...], dtype: torch.dtype) -> Scenario | None:
    """The first scenario the codec accepts (bool scenarios are asked with bool dtype)."""
    for s in SCENARIOS:
        query = ApplyQuery(shape=shape, dtype=torch.bool if s.bool_input else dtype,
                           producer_class=s.producer_class, consumer_classes=s.consumer_classes,
                           consumer_targets=s.consumer_targets)
        if codec.applies(query):
            return s
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, inner: int) -> float:
    """Seconds per call, over ``inner`` back-to-back calls."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / inner


def _inner_calls(fn: Callable[[], object], device: torch.device, min_time: float) -> int:
    """Calls per measurement so one measurement lasts at least ``min_time``.

    Why: a single clone of a few MB takes about a millisecond, the size of a
    scheduler tick on a shared CPU, so timing it once is mostly noise.
    """
    once = max(_timed(fn, device, 1), 1e-7)
    return max(1, min(1000, int(min_time / once) + 1))


def _round_trip_fns(
    codec: Codec, x: torch.Tensor, compile_ops: bool
) -> tuple[Callable[[torch.Tensor], object], Callable[[list[torch.Tensor]], object]]:
    """The codec's two ops, optionally each compiled with Inductor (as in a real graph)."""
    shape, dtype = list(x.shape), x.dtype

    def compress(a: torch.Tensor) -> list[torch.Tensor]:
        return codec.compress_op(a)

    def decompress(payload: list[torch.Tensor]) -> torch.Tensor:
        return codec.decompress_op(payload, shape, dtype)

    if compile_ops:
        return torch.compile(compress, fullgraph=True), torch.compile(decompress, fullgraph=True)
    return compress, decompress


def run(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, repeats: int,
        warmup: int, min_time: float, compile_ops: bool,
        codec_names: list[str]) -> tuple[list[Result], list[str]]:
    gen = torch.Generator(device=device).manual_seed(0)
    raw = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    cases, skipped = [], []
    for name in codec_names:
        codec = get_codec(name)
        scenario = pick_scenario(codec, shape, dtype)
        if scenario is None:
            skipped.append(name)
            continue
        x = scenario.make(raw)
        x = x if scenario.bool_input else x.to(dtype)
        cases.append((codec, scenario, x))

    packed = {c.name: c.compress(x) for c, _, x in cases}
    ops: dict[str, dict[str, Callable[[], object]]] = {}
    for c, _, x in cases:
        comp, decomp = _round_trip_fns(c, x, compile_ops)
        payload = list(packed[c.name].payload)
        ops[c.name] = {
            "clone": x.clone,
            "compress": lambda comp=comp, x=x: comp(x),
            "decompress": lambda decomp=decomp, payload=payload: decomp(payload),
        }
    for _ in range(warmup):
        for fns in ops.values():
            for fn in fns.values():
                _timed(fn, device, 1)
    inner = {name: {k: _inner_calls(fn, device, min_time) for k, fn in fns.items()}
             for name, fns in ops.items()}
    times: dict[str, dict[str, list[float]]] = {name: {k: [] for k in fns} for name, fns in ops.items()}
    for _ in range(repeats):  # interleaved: every codec and the copy in each round
        for name, fns in ops.items():
            for k, fn in fns.items():
                times[name][k].append(_timed(fn, device, inner[name][k]))

    results = []
    for codec, scenario, x in cases:
        med = {k: statistics.median(v) for k, v in times[codec.name].items()}
        gb = x.numel() * x.element_size() / 1e9
        x_hat = codec.decompress(packed[codec.name])
        # A DERIVATIVE codec returns f'(x), not x: its error needs f and is its own test's job.
        rel = (math.nan if codec.decompress_kind is DecompressKind.DERIVATIVE
               else 0.0 if x.dtype == torch.bool else error_stats(x.float(), x_hat.float())[0])
        results.append(Result(
            codec=codec.name, input=scenario.label, dtype=str(x.dtype).removeprefix("torch."),
            shape=tuple(x.shape), kernels="triton" if use_triton(x) else "torch",
            size_ratio=codec.compressed_nbytes(x.shape, x.dtype) / (x.numel() * x.element_size()),
            relative_error=rel,
            compress_gbps=gb / med["compress"], decompress_gbps=gb / med["decompress"],
            clone_gbps=gb / med["clone"],
            compress_vs_clone=med["clone"] / med["compress"],
            decompress_vs_clone=med["clone"] / med["decompress"],
        ))
    return results, skipped


def markdown(results: list[Result]) -> str:
    head = ("| codec | input | dtype | kernels | size | rel. err | compress GB/s | decompress GB/s "
            "| clone GB/s | compress / clone | decompress / clone |")
    rows = [head, "|" + "---|" * 11]
    for r in results:
        rows.append(
            f"| {r.codec} | {r.input} | {r.dtype} | {r.kernels} | {r.size_ratio:.3f} "
            f"| {r.relative_error:.4f} | {r.compress_gbps:.2f} | {r.decompress_gbps:.2f} "
            f"| {r.clone_gbps:.2f} | {r.compress_vs_clone:.2f} | {r.decompress_vs_clone:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=None,
                        help="input shape (default 4096x4096 on CUDA, 1024x2048 on CPU)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds per measurement (repeats calls); default 0.05 CPU, 0.01 CUDA")
    parser.add_argument("--compile", action="store_true",
                        help="time the ops compiled by Inductor (how they run inside a graph)")
    parser.add_argument("--codecs", nargs="*", default=None, help="subset of codec names")
    parser.add_argument("--json", default=None, help="also write results to this JSON file")
    args = parser.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = tuple(args.shape or ((4096, 4096) if device.type == "cuda" else (1024, 2048)))
    dtype = getattr(torch, args.dtype)
    names = args.codecs or available_codecs()
    min_time = args.min_time if args.min_time is not None else (0.01 if device.type == "cuda" else 0.05)
    results, skipped = run(shape, dtype, device, args.repeats, args.warmup, min_time,
                           args.compile, names)

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"# codec throughput: {device.type} ({where}), shape {shape}, {args.dtype}, "
          f"{'inductor-compiled ops' if args.compile else 'eager ops'}, "
          f"median of {args.repeats} after {args.warmup} warm-up, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")
    print(markdown(results))
    print("\nsize = payload bytes / input bytes; rel. err = relative Frobenius error "
          "(nan for codecs that return a derivative); "
          "GB/s counts input bytes; x / clone > 1 means faster than a copy.")
    if skipped:
        print(f"\nskipped (no scenario applies): {', '.join(skipped)}")
    if args.json:
        meta = {"device": device.type, "device_name": where, "shape": shape, "dtype": args.dtype,
                "repeats": args.repeats, "warmup": args.warmup, "min_time": min_time,
                "compiled": args.compile,
                "torch": torch.__version__,
                "threads": torch.get_num_threads()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [asdict(r) for r in results],
                       "skipped": skipped}, f, indent=2)


if __name__ == "__main__":
    main()
