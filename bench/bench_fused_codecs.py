"""What a codec adds to a compiled graph, as a multiple of copying the value.

    python bench/bench_fused_codecs.py [--rows 4096] [--cols 1024] [--dtype float32]
        [--repeats 15] [--threads 1] [--codecs ...] [--json out.json]

Why inside a graph: a compiled plan never runs a codec on its own. Compress
is spliced in right after the value's producer and decompress right before
its reader (`adacc_compile.passes.compress_rewrite`), and Inductor fuses
them with those kernels. So for each codec this builds the producer and
reader the codec is offered for, and compiles four graphs with Inductor:

    forward, value kept        producer -> (forward output, value)
    forward, value compressed  producer -> (forward output, payload)
    backward, value kept       (value, grad) -> reader
    backward, value restored   (payload, grad) -> reader(decompress(payload))

The codec's cost is (compressed - kept) forward + (restored - kept)
backward: what the plan's step pays for compressing instead of keeping.
Like for like: a kept value is stored and read the fastest way Inductor's
C++ does it. That matters for bitmask only: Inductor stores and loads a
bool tensor through mask vectors at ~300x a copy of it (measured), so a
graph keeping the bool mask would make any codec look free (its row was
negative). Its kept mask is stored as 0/1 bytes through a float -> uint8
cast and read back through `kernels.aten_graphs.byte_values` (as int64
words with 8-lane vectors, a plain byte load with 16-lane ones), the way
the codecs write and read their one-byte payloads.
The yardstick is a copy of the value into a buffer allocated once (one
read and one write at the machine's copy bandwidth), timed in the same
rounds. ``value.clone()`` was the yardstick until 2026-12-05; it also paid
the page faults of a fresh 16 MiB buffer whenever the allocator had handed
its memory back to the system, and timed 1.3-2.2 ms in different
processes against 1.25-1.37 ms for the copy into a kept buffer (measured).
The graphs allocate their outputs on every call, and glibc's malloc hands
buffers of this size back to the system (``munmap`` or a trim of its heap)
by rules that depend on what else the process freed: counted with
``getrusage``, the value-kept forward of int8_channel faulted in 813 fresh
pages per call in one process and none in another, the same code, and a
graph that faults in a 16 MiB buffer pays ~1.4 ms for it, a copy's worth.
That decided whether a codec looked cheaper than keeping its value (a run
on 2026-12-05 measured the floor at -2.3 copies). So the benchmark runs
under `STEADY_ALLOCATOR` (glibc keeps every buffer up to 32 MiB on its
heap and never trims it, as a training loop's steady state does after its
first steps), re-executing itself with that setting unless
``--system-allocator`` is given; every row counts the page faults of its
timed calls, 0 when the figures are free of them.
The standalone column times the codec's two compiled graphs alone,
on their own inputs (an upper bound: nothing to fuse with).

The first row, ``one-byte cast (floor)``, is not a codec: its compress
casts the value to int8 and its decompress casts back (`FloorCast`). It
is the cheapest one-byte payload Inductor's code can write and read in
the same graphs, so it shows how much of a codec's cost any one-byte
codec pays here, and how much is its own arithmetic: the "above floor"
column, per round the codec's ratio less the floor's, for the codecs
timed in the floor's graphs (LayerNorm -> matmul).

A codec that takes calibrated parameters (int8_smooth's channel factors,
fp8's scale) gets two rows: under its name with the parameters measured on
the value beforehand and passed into the graph (a calibrated plan holds
them as a constant), and ``(uncalibrated)`` with the compress of a plan
made without real inputs (int8_smooth measures its factors on every call,
fp8 scales each row by its own maximum).

Producers and readers, per the codecs' ``applies`` checks:

    bitmask        dropout mask (rand > p); reader grad * mask
    int8/int4, fp8 LayerNorm output; reader the weight-gradient matmul
    softmax_u8     softmax probabilities (read by P @ V); reader the softmax backward
    fewbit_*       rank-64 matmul output feeding GELU/SiLU; reader grad * f'(h)

Timing: warm-up, then ``--repeats`` rounds; each round times every graph of
every codec and the copies once, interleaved. The in-graph figure is the
median over rounds of each round's own (compressed - kept) / copy, with its
quartiles beside it: the difference of two medians drifted by several
copies between runs on a shared machine. One
thread by default: on this shared 2-core machine a second OpenMP thread
waits for its descheduled partner (50 ms instead of 0.6 ms, measured).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from adacc_compile import compat_inductor
from adacc_compile.kernels import Codec, DecompressKind, available_codecs, get_codec
from adacc_compile.kernels.aten_graphs import byte_values


@dataclass(frozen=True, slots=True)
class Scenario:
    """Producer and reader of one kind of saved value."""

    label: str
    produce: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    """(*inputs) -> (forward output, value)."""
    read: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """(value, grad) -> what the backward computes from it."""
    store: Callable[[torch.Tensor], torch.Tensor] = lambda value: value
    """How the value-kept graphs hold the value between forward and backward."""
    load: Callable[[torch.Tensor], torch.Tensor] = lambda stored: stored
    """``store``'s inverse, inside the value-kept backward."""


def _dropout(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = r > 0.1
    return x * mask * (1 / 0.9), mask


def _layer_norm(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = F.layer_norm(x, x.shape[-1:], weight)
    return y @ weight.new_ones(x.shape[-1], 64), y


def _weight_grad(value: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return value.t() @ grad[:, :64].to(value.dtype)


def _softmax(s: torch.Tensor, _unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # P @ V reads the probabilities, as in attention: they are materialised
    # once whether kept or compressed (a pointwise reader would let Inductor
    # recompute the exponentials into each of its consumers instead).
    p = torch.softmax(s, dim=-1)
    return p @ s.new_ones(s.shape[-1], 64), p


def _softmax_backward(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    g = grad.to(p.dtype)
    return p * (g - (g * p).sum(-1, keepdim=True))


def _matmul_act(x: torch.Tensor, w: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]):
    h = x @ w
    return act(h), h


def _store_mask(mask: torch.Tensor) -> torch.Tensor:
    # 0/1 bytes through a float -> uint8 cast: the one-byte store Inductor's
    # C++ vectorises (storing the bool itself runs at ~300x a copy of it).
    return torch.where(mask, 1.0, 0.0).to(torch.uint8)


def _load_mask(stored: torch.Tensor) -> torch.Tensor:
    # The bytes read as int64 words, as the codecs' decompress reads its
    # payload (a uint8 or bool vector load runs at ~5x a float copy).
    return byte_values(stored) != 0


SCENARIOS = {
    "bitmask": Scenario("dropout mask", _dropout, lambda mask, g: g * mask, _store_mask, _load_mask),
    "layer_norm": Scenario("LayerNorm -> matmul", _layer_norm, _weight_grad),
    "softmax_u8": Scenario("softmax probabilities", _softmax, _softmax_backward),
    "fewbit_gelu": Scenario(
        "matmul -> GELU", lambda x, w: _matmul_act(x, w, F.gelu),
        lambda h, g: torch.ops.aten.gelu_backward(g.to(h.dtype), h),
    ),
    "fewbit_silu": Scenario(
        "matmul -> SiLU", lambda x, w: _matmul_act(x, w, F.silu),
        lambda h, g: torch.ops.aten.silu_backward(g.to(h.dtype), h),
    ),
}


@dataclass(frozen=True, slots=True)
class FloorCast:
    """Not a codec: the value cast to int8 and back (no scale, values lost).

    The floor of any one-byte codec in these graphs: what Inductor's code
    pays to write one byte per element after the producer and to read it
    back into a float32 value before the reader."""

    name: str = "one-byte cast (floor)"
    decompress_kind: DecompressKind = DecompressKind.VALUE

    def calibration_parameters(self, x: torch.Tensor) -> None:
        return None

    def aten_compress(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x.to(torch.int32).to(torch.int8)]  # through int32: Inductor's faster narrowing (see int_outlier)

    def aten_decompress(self, payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return payload[0].to(dtype).reshape(shape)


FLOOR = FloorCast()


def codec_of(name: str) -> Codec | FloorCast:
    """A registered codec, or the floor row by its name."""
    return FLOOR if name == FLOOR.name else get_codec(name)


def scenario_of(name: str) -> Scenario:
    return SCENARIOS.get(name, SCENARIOS["layer_norm"])


def inputs_of(name: str, rows: int, cols: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    if name == "bitmask":
        return x, torch.rand(rows, cols, generator=gen)
    if name.startswith("fewbit"):  # a rank-64 matmul: its time does not drown the codec's
        return x[:, :64].contiguous(), (torch.randn(64, cols, generator=gen) / 8).to(dtype)
    if name == "softmax_u8":
        return 3 * x, x
    x[:, 3] *= 20  # an outlier channel
    return x, torch.rand(cols, generator=gen).to(dtype) + 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Graphs:
    """The compiled graphs of one codec's measurement and their inputs."""

    keep_forward: Callable[[], object]
    compress_forward: Callable[[], object]
    keep_backward: Callable[[], object]
    restore_backward: Callable[[], object]
    standalone_compress: Callable[[], object]
    standalone_decompress: Callable[[], object]
    copy: Callable[[], object]


def compiled(fn: Callable[..., object], *args: torch.Tensor) -> Callable[[], object]:
    """``fn`` on ``args`` as a no-argument call of its compiled graph: traced
    to aten ops and compiled as the partitioner's graphs are (no Dynamo: one
    code object compiled for eight codecs would run into Dynamo's recompile
    limit and fall back to eager)."""
    graph = compat_inductor.trace_aten(lambda *a: tuple(_flat(fn(*a))), list(args))
    run = compat_inductor.inductor_compile_inference(graph, list(args))
    return lambda: run(*args)


def build_graphs(codec: Codec | FloorCast, rows: int, cols: int, dtype: torch.dtype, *, calibrated: bool = True) -> Graphs:
    """The graphs of one codec. A codec that takes calibrated parameters
    gets them measured on the value and passed in as a graph input (what a
    calibrated plan's constant is to the kernels), unless ``calibrated`` is
    False: its compress then measures them itself, as in a plan made
    without real inputs."""
    scenario = scenario_of(codec.name)
    inputs = inputs_of(codec.name, rows, cols, dtype)
    out, value = scenario.produce(*inputs)
    shape, vdtype = list(value.shape), value.dtype
    grad = torch.randn(value.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    parameters = codec.calibration_parameters(value) if calibrated else None
    extra = () if parameters is None else (parameters,)

    def aten_compress(v, *p):
        return codec.aten_compress(v, *p)

    payload = tuple(aten_compress(value, *extra))

    def restore(g, *parts):
        restored = codec.aten_decompress(list(parts), shape, vdtype)
        if codec.decompress_kind is DecompressKind.DERIVATIVE:
            return g * restored  # what the rewrite puts in place of gelu/silu_backward
        return scenario.read(restored, g)

    def compress_forward(*a):
        out, v = scenario.produce(*a[: len(inputs)])
        return (out, *aten_compress(v, *a[len(inputs) :]))

    def keep_forward(*a):
        out, v = scenario.produce(*a)
        return out, scenario.store(v)

    return Graphs(
        keep_forward=compiled(keep_forward, *inputs),
        compress_forward=compiled(compress_forward, *inputs, *extra),
        keep_backward=compiled(lambda v, g: scenario.read(scenario.load(v), g), scenario.store(value), grad),
        restore_backward=compiled(restore, grad, *payload),
        standalone_compress=compiled(lambda v, *p: aten_compress(v, *p), value, *extra),
        standalone_decompress=compiled(lambda *p: codec.aten_decompress(list(p), shape, vdtype), *payload),
        copy=functools.partial(torch.Tensor.copy_, torch.empty_like(value), value),
    )


def _flat(out: object) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (list, tuple)) else [out]  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    codec: str
    value: str
    dtype: str
    shape: tuple[int, ...]
    copy_ms: float
    compress_added_ms: float
    decompress_added_ms: float
    in_graph_vs_copy: float
    """Median over rounds of (compress added + decompress added) / copy, each
    round's three measured back to back."""
    in_graph_quartiles: tuple[float, float]
    """25th and 75th percentiles of the same per-round ratio: the noise."""
    standalone_vs_copy: float
    page_faults: int = 0
    """Minor page faults during this row's timed calls (all its graphs and
    copies): a fault brings in a fresh page of a freed buffer, time the
    codec's arithmetic does not take."""
    above_floor: float | None = None
    """Median over rounds of this ratio less the floor row's of the same
    round, for codecs timed in the floor's graphs (LayerNorm -> matmul);
    None otherwise or without the floor row. What the codec's own
    arithmetic costs: it moved less between runs than the ratio."""


def _timed(fn: Callable[[], object], inner: int) -> float:
    """Seconds per call of ``fn``, after one untimed call.

    The untimed call takes what the first call after another graph costs
    (measured 2026-12-05: with 3 calls per measurement, the value-kept
    backward timed 8.0 ms against 6.4 ms with 10 calls, the restored one
    7.1 and 6.9, so decompression looked faster than keeping the value).
    It does not make the figures steady: in a run of every codec the same
    day, nine of eleven codecs' compress looked 0.7-3.9 ms faster than
    keeping the value, and in the next run none did (bench/RESULTS.md)."""
    fn()
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


#: Row label of a parameterised codec compressed as a plan made without
#: real inputs does it (no calibrated parameters).
PER_CALL = " (uncalibrated)"

#: glibc malloc settings the benchmark runs under (``GLIBC_TUNABLES``): every
#: buffer up to 32 MiB from its heap (the largest threshold glibc takes), the
#: heap never trimmed, so a freed buffer is reused without page faults.
STEADY_ALLOCATOR = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295"


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def steady_allocator_env(environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-execute under `STEADY_ALLOCATOR`, or None when
    ``environ`` already holds it (or glibc is not the C library)."""
    if platform.libc_ver()[0] != "glibc" or STEADY_ALLOCATOR in environ.get("GLIBC_TUNABLES", ""):
        return None
    tunables = ":".join(t for t in (environ.get("GLIBC_TUNABLES", ""), STEADY_ALLOCATOR) if t)
    return {**environ, "GLIBC_TUNABLES": tunables}


def run(names: list[str], rows: int, cols: int, dtype: torch.dtype, repeats: int, min_time: float) -> list[Result]:
    """Every codec of ``names``; a codec taking calibrated parameters twice:
    with them (its name) and as a plan made without real inputs compresses
    (`PER_CALL`)."""
    cases = {}
    labels = {}
    for name in names:
        codec = codec_of(name)
        cases[name] = build_graphs(codec, rows, cols, dtype)
        labels[name] = name
        print(f"compiled {name}", file=sys.stderr, flush=True)
        probe = scenario_of(name).produce(*inputs_of(name, 2, cols, dtype))[1]
        if codec.calibration_parameters(probe) is not None:
            cases[name + PER_CALL] = build_graphs(codec, rows, cols, dtype, calibrated=False)
            labels[name + PER_CALL] = name
    names = list(cases)
    fields = ("keep_forward", "compress_forward", "keep_backward", "restore_backward",
              "standalone_compress", "standalone_decompress", "copy")
    fns = {name: {f: getattr(g, f) for f in fields} for name, g in cases.items()}
    for per_codec in fns.values():  # warm-up (and first-call compilation)
        for fn in per_codec.values():
            fn()
    inner = {name: {f: max(1, int(min_time / max(_timed(fn, 1), 1e-7))) for f, fn in per_codec.items()}
             for name, per_codec in fns.items()}
    times = {name: {f: [] for f in fields} for name in fns}
    faults = dict.fromkeys(fns, 0)
    for _ in range(repeats):
        for name, per_codec in fns.items():
            before = _minor_faults()
            for f, fn in per_codec.items():
                times[name][f].append(_timed(fn, inner[name][f]))
            faults[name] += _minor_faults() - before
    # Paired per round: each round's graphs ran back to back, so a
    # round's difference cancels the machine's drift between rounds.
    added = {
        name: ([c - k for c, k in zip(t["compress_forward"], t["keep_forward"])],
               [r - k for r, k in zip(t["restore_backward"], t["keep_backward"])])
        for name, t in times.items()
    }
    per_round = {
        name: [(c + d) / copy for c, d, copy in zip(*added[name], times[name]["copy"])] for name in names
    }
    floor = per_round.get(FLOOR.name)
    results = []
    for name in names:
        t = times[name]
        med = {f: statistics.median(v) for f, v in t.items()}
        compress, decompress = added[name]
        ratios = per_round[name]
        above = None
        if floor is not None and name != FLOOR.name and scenario_of(labels[name]) is scenario_of(FLOOR.name):
            above = statistics.median(r - f for r, f in zip(ratios, floor))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        value = scenario_of(labels[name]).produce(*inputs_of(labels[name], rows, cols, dtype))[1]
        results.append(Result(
            codec=name, value=scenario_of(labels[name]).label, dtype=str(value.dtype).removeprefix("torch."),
            shape=tuple(value.shape), copy_ms=1e3 * med["copy"],
            compress_added_ms=1e3 * statistics.median(compress),
            decompress_added_ms=1e3 * statistics.median(decompress),
            in_graph_vs_copy=statistics.median(ratios),
            in_graph_quartiles=(quartiles[0], quartiles[2]),
            standalone_vs_copy=(med["standalone_compress"] + med["standalone_decompress"]) / med["copy"],
            page_faults=faults[name],
            above_floor=above,
        ))
    return results


def markdown(results: list[Result]) -> str:
    rows = [
        "| codec | value | dtype | copy ms | compress adds ms | decompress adds ms | in graph / copy "
        "| (p25-p75) | above floor | standalone / copy | page faults |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        low, high = r.in_graph_quartiles
        above = "-" if r.above_floor is None else f"{r.above_floor:.2f}"
        rows.append(
            f"| {r.codec} | {r.value} | {r.dtype} | {r.copy_ms:.3f} | {r.compress_added_ms:.3f} "
            f"| {r.decompress_added_ms:.3f} | {r.in_graph_vs_copy:.2f} | {low:.2f} - {high:.2f} "
            f"| {above} | {r.standalone_vs_copy:.2f} | {r.page_faults} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds per measurement (repeats calls)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--codecs", nargs="*", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-floor", action="store_true", help="leave out the one-byte cast row")
    parser.add_argument("--system-allocator", action="store_true",
                        help="run under the environment's malloc settings, not STEADY_ALLOCATOR")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    names = ([] if args.no_floor else [FLOOR.name]) + (args.codecs or available_codecs())
    results = run(names, args.rows, args.cols, getattr(torch, args.dtype), args.repeats, args.min_time)
    command = "python bench/bench_fused_codecs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    # Inductor's C++ takes its vector ISA from the same ATEN_CPU_CAPABILITY
    # (set it to avx2 on an AVX512 machine to measure the AVX2 code).
    isa = torch.backends.cpu.get_cpu_capability()
    allocator = os.environ.get("GLIBC_TUNABLES") or "system default"
    print(f"# codecs inside compiled graphs, {datetime.date.today()}, {platform.machine()} CPU ({isa}), "
          f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}, "
          f"malloc: {allocator}\n\n`{command}`\n")
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "threads": args.threads, "isa": isa, "allocator": allocator,
                       "results": [asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    if "--system-allocator" not in sys.argv and (env := steady_allocator_env(dict(os.environ))) is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)  # glibc reads its tunables at start-up
    sys.exit(main())
