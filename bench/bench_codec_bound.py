"""What the best code could make int8_outlier cost on this CPU: a yardstick.

    python bench/bench_codec_bound.py [--rows 4096] [--cols 1024] [--repeats 25] [--json out.json]

Why: the codec-cost goal (compress plus decompress of a value in at most
1.3 copies of it for int8_outlier, 2 for every codec) is judged against
what Inductor's C++ code does with the codec's aten form
(`bench_fused_codecs.py`). This measures how far that code is from the
machine: `codec_bound.cpp` is a hand-written AVX-512 compress in one
pass per row (a group's statistics and codes from the same registers, every
select a mask register) and a decompress, both producing the codec's
payload and values bit for bit (checked here on every run, NaN and ±Inf
included). It is built with ``torch.utils.cpp_extension`` on first use (a
C++ compiler and an AVX-512 CPU needed), and it is never a codec path: a
compiled plan must not call an extern codec kernel.

In the same process and interleaved rounds it times, as ratios to a copy
of the value into a buffer allocated once (medians of per-round ratios;
each measurement repeats its call for ``--min-time``, 0.1 s: at 0.02 s,
one or two calls of a graph, the in-graph figures were noise):

    inductor        the codec's aten forms compiled by Inductor, each alone
    hand-written    codec_bound.cpp
    one-byte cast   Inductor's ``x.to(int8)`` and back: the cheapest
                    one-byte payload its code writes and reads

A value is compressed with calibrated outlier channels (a calibrated plan's
path). The first columns are standalone. The in-graph column is
`bench_fused_codecs.py`'s figure, in its graphs (LayerNorm -> matmul, the
weight-gradient matmul reading the value back): what compressing instead of
keeping the value adds to the forward and the backward. There the
hand-written kernels run as custom ops (`HandWrittenCodec`), extern calls
Inductor fuses nothing into: what a plan would pay with them. A decompress
whose reader is an extern matmul (every matmul is, on this CPU) writes the
whole float value before the matmul reads it, so no code's in-graph figure
falls much below its standalone decompress.

Like `bench_fused_codecs.py`, it runs under that script's
`STEADY_ALLOCATOR` (re-executing itself) unless ``--system-allocator``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from adacc_compile.kernels import DecompressKind, get_codec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_fused_codecs import FLOOR, _timed, build_graphs, compiled, steady_allocator_env  # noqa: E402

SOURCE = pathlib.Path(__file__).resolve().parent / "codec_bound.cpp"
CODEC = "int8_outlier"


class NoYardstick(RuntimeError):
    """The hand-written kernels cannot be built or run here (no AVX-512, no compiler)."""


def build_extension() -> object:
    """`codec_bound.cpp` built for this CPU; `NoYardstick` saying why not
    where the machine cannot (no AVX-512, no C++ compiler, no ninja). A
    build error of the source itself is raised as it is."""
    flags = pathlib.Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
    if not all(f in flags for f in ("avx512f", "avx512bw", "avx512dq")):
        raise NoYardstick("this CPU lacks AVX-512 (F, BW, DQ): the hand-written kernels need it")
    from torch.utils.cpp_extension import load, verify_ninja_availability

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise NoYardstick("no C++ compiler (c++, or $CXX) to build the hand-written kernels")
    try:
        verify_ninja_availability()
    except RuntimeError as error:
        raise NoYardstick(f"torch's extension builder needs ninja: {error}") from error
    return load(name="adacc_codec_bound", sources=[str(SOURCE)], extra_cflags=["-O3", "-march=native"], verbose=False)


def sample(rows: int, cols: int) -> torch.Tensor:
    """Gaussian values with one strong channel, NaN and ±Inf in regular
    groups and a NaN in the strong channel (the format's every case)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=gen)
    x[:, 3] *= 20
    x[1 % rows, 100 % cols] = float("nan")
    x[2 % rows, 200 % cols] = float("inf")
    x[3 % rows, 300 % cols] = -float("inf")
    x[4 % rows, 3] = float("nan")
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (float and bfloat16 compared as integers, so NaN
    payloads count)."""
    views = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.view(views.get(a.dtype, a.dtype)), b.view(views.get(b.dtype, b.dtype)))


@dataclass(frozen=True, slots=True)
class Row:
    code: str
    compress_vs_copy: float
    decompress_vs_copy: float
    total_vs_copy: float
    """Standalone: compress plus decompress, each alone."""
    total_quartiles: tuple[float, float]
    in_graph_vs_copy: float
    """In `bench_fused_codecs`'s graphs (LayerNorm -> matmul): what
    compressing instead of keeping the value adds to the forward and the
    backward."""
    in_graph_quartiles: tuple[float, float]


class HandWrittenCodec:
    """int8_outlier whose compress and decompress are the hand-written
    kernels, as custom ops (``adacc_bound::compress``, ``::decompress``)
    that Inductor calls as extern kernels: the in-graph cost a plan would
    pay with them (nothing fuses into an extern call). For
    `bench_fused_codecs.build_graphs` only."""

    name = "int8_outlier, hand-written (extern)"
    decompress_kind = DecompressKind.VALUE

    def __init__(self, ext: object) -> None:
        _register_ops(ext)

    def calibration_parameters(self, x: torch.Tensor) -> torch.Tensor:
        return get_codec(CODEC).calibration_parameters(x)

    def aten_compress(self, x: torch.Tensor, index: torch.Tensor) -> list[torch.Tensor]:
        codes, scales, values = torch.ops.adacc_bound.compress(x, index)
        return [codes, scales, index, values]

    def aten_decompress(self, payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.ops.adacc_bound.decompress(*payload).to(dtype).reshape(shape)


_REGISTERED: list[object] = []


def _register_ops(ext: object) -> None:
    """The custom ops, once per process (they call ``ext``)."""
    if _REGISTERED:
        return
    _REGISTERED.append(ext)

    @torch.library.custom_op("adacc_bound::compress", mutates_args=())
    def compress(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        codes, scales, _, values = ext.compress(x.contiguous(), index)
        return codes, scales, values

    @compress.register_fake
    def _(x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, channels = x.shape
        return (x.new_empty((rows, channels), dtype=torch.int8),
                x.new_empty((rows, channels // 64), dtype=torch.bfloat16),
                x.new_empty((rows, index.shape[0])))

    @torch.library.custom_op("adacc_bound::decompress", mutates_args=())
    def decompress(codes: torch.Tensor, scales: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return ext.decompress(codes, scales, index, values)

    @decompress.register_fake
    def _(codes: torch.Tensor, scales: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return codes.new_empty(codes.shape, dtype=torch.float32)


def measure(ext: object, rows: int, cols: int, repeats: int, min_time: float) -> tuple[list[Row], float]:
    """Rows of ratios to a copy, and the copy's median milliseconds; raises
    AssertionError when a hand-written output differs from the codec's."""
    codec = get_codec(CODEC)
    x = sample(rows, cols)
    index = codec.calibration_parameters(x)
    payload = codec.aten_compress(x, index)
    hand_payload = ext.compress(x, index)
    for part, (ours, hand) in enumerate(zip(payload, hand_payload)):
        assert same_bits(ours, hand), f"hand-written compress differs from {CODEC}'s payload, part {part}"
    restored = codec.aten_decompress(list(payload), x.shape, x.dtype)
    assert same_bits(restored, ext.decompress(*payload)), f"hand-written decompress differs from {CODEC}'s"
    codes = x.to(torch.int8)
    buffer = torch.empty_like(x)
    fns = {
        ("inductor", "compress"): compiled(codec.aten_compress, x, index),
        ("inductor", "decompress"): compiled(lambda *p: codec.aten_decompress(list(p), x.shape, x.dtype), *payload),
        ("hand-written", "compress"): lambda: ext.compress(x, index),
        ("hand-written", "decompress"): lambda: ext.decompress(*payload),
        ("one-byte cast", "compress"): compiled(lambda v: v.to(torch.int8), x),
        ("one-byte cast", "decompress"): compiled(lambda c: c.float(), codes),
        ("copy", "copy"): lambda: buffer.copy_(x),
    }
    in_graph = {"inductor": codec, "hand-written": HandWrittenCodec(ext), "one-byte cast": FLOOR}
    for code, like in in_graph.items():
        graphs = build_graphs(like, rows, cols, torch.float32)
        for field in _IN_GRAPH:
            fns[(code, field)] = getattr(graphs, field)
    for fn in fns.values():
        fn()
    inner = {key: max(1, int(min_time / max(_timed(fn, 1), 1e-7))) for key, fn in fns.items()}
    times = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            times[key].append(_timed(fn, inner[key]))
    copy = times[("copy", "copy")]
    out = []
    for code in ("inductor", "hand-written", "one-byte cast"):
        c = [t / k for t, k in zip(times[(code, "compress")], copy)]
        d = [t / k for t, k in zip(times[(code, "decompress")], copy)]
        total = [a + b for a, b in zip(c, d)]
        t = {field: times[(code, field)] for field in _IN_GRAPH}
        graph = [((cf - kf) + (rb - kb)) / k for cf, kf, rb, kb, k in zip(
            t["compress_forward"], t["keep_forward"], t["restore_backward"], t["keep_backward"], copy)]
        out.append(Row(code, statistics.median(c), statistics.median(d), statistics.median(total), _quartiles(total),
                       statistics.median(graph), _quartiles(graph)))
    return out, 1e3 * statistics.median(copy)


#: `bench_fused_codecs.Graphs` fields the in-graph figure is made of.
_IN_GRAPH = ("keep_forward", "compress_forward", "keep_backward", "restore_backward")


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def markdown(rows: list[Row]) -> str:
    lines = ["| code | compress / copy | decompress / copy | both / copy | (p25-p75) | in graph / copy | (p25-p75) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        (low, high), (glow, ghigh) = r.total_quartiles, r.in_graph_quartiles
        lines.append(f"| {r.code} | {r.compress_vs_copy:.2f} | {r.decompress_vs_copy:.2f} "
                     f"| {r.total_vs_copy:.2f} | {low:.2f} - {high:.2f} "
                     f"| {r.in_graph_vs_copy:.2f} | {glow:.2f} - {ghigh:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024, help="a multiple of 64")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per measurement (repeats calls)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--system-allocator", action="store_true",
                        help="run under the environment's malloc settings, not STEADY_ALLOCATOR")
    args = parser.parse_args(argv)
    if args.cols < 64 or args.cols % 64:
        parser.error("--cols must be a positive multiple of 64 (the hand-written kernels have no padding group)")
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    try:
        ext = build_extension()
    except NoYardstick as why:
        print(f"no yardstick on this machine: {why}", file=sys.stderr)
        return 2
    rows, copy_ms = measure(ext, args.rows, args.cols, args.repeats, args.min_time)
    command = "python bench/bench_codec_bound.py " + " ".join(sys.argv[1:] if argv is None else argv)
    allocator = os.environ.get("GLIBC_TUNABLES") or "system default"
    print(f"# {CODEC} against hand-written AVX-512 code, {datetime.date.today()}, {platform.machine()} CPU "
          f"({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}, 1 thread, "
          f"{args.rows} x {args.cols} float32, copy {copy_ms:.3f} ms, median of {args.repeats}, "
          f"malloc: {allocator}\n\n`{command}`\n\nPayloads and values bit for bit equal to the codec's.\n")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "copy_ms": copy_ms, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    if "--system-allocator" not in sys.argv and (env := steady_allocator_env(dict(os.environ))) is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)  # glibc reads its tunables at start-up
    sys.exit(main())
