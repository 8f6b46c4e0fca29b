"""Time a codec as compiled graphs run it: its aten form compiled by Inductor.

Why compiled code: compress and decompress reach Inductor as aten ops
(`adacc_compile.kernels.aten_graphs`), so the eager torch reference, many
passes over memory, says nothing about what a compiled plan pays. The
measured device profile (`profile_cache`) keeps these timings per (codec,
dtype) and the planner's cost of an option is ``numel`` times the measured
seconds per element (`codec_options.codec_seconds`).

What is timed: compress (value -> payload) and decompress (payload ->
value), each compiled on its own, on a sample of `SAMPLE_SHAPE` (or
`UNALIGNED_SAMPLE_SHAPE`: see `is_aligned`); the
fastest of `REPEATS` runs after a warm-up. The fastest, not the median: on
a shared machine another process only ever adds time (an OpenMP region
whose second thread is descheduled waited 50 ms instead of 0.6 ms here),
and the cost model should know what the code costs, not what the
neighbours did while it was timed. On CUDA the custom ops (the hand-written
Triton kernels) are timed the same way, so that `codec_form.graph_form`
can pick the faster form.

A derivative codec (few-bit GELU/SiLU) is timed as the rewrite uses it:
its decompress as the gradient times the derivative, against the
activation backward that product replaces (`CodecTiming.replaced_s`),
which runs whether or not the value is compressed. Measured on this
module's float32 sample (AVX512 Xeon, one thread, 2026-12-06): charged
its whole round trip, fewbit_gelu cost 3.9 copies of the value; the
product takes 2.0, the ``gelu_backward`` it replaces (erf and exp) 4.3,
so it is charged its compress alone, 1.7 (fewbit_silu: 2.8 -> 1.3).

In copies, then in seconds at the profile's bandwidth. A sample this small
sits in the CPU's cache, warmed by the repeats, while a step's values do
not: timed so, the codecs were charged 0.68-0.88x their copies of the
value at the profile's bandwidth (an AVX512 Xeon, float32: int8_channel
0.85 against 0.97 ns per element, fp8_e5m2 0.87 against 1.20, int8_outlier
1.50 against 2.19), and the profile's other figures come from that
bandwidth, measured on a larger value. So a pointwise copy kernel
(`copy_kernel`, the bandwidth's own kernel) is timed on the sample's bytes
in the same rounds, and the codec is charged its time in those copies at
the profile's bandwidth (`measure_seconds_per_element`). A GPT plan at 0.6
of the default's memory on an AVX512 CPU showed why: its codecs were
estimated at 4.1 ms and its generated kernels measured 7.8 ms above
recompute-only's, whose recompute estimates matched its measured matmuls;
the cached sample's copy ran 2.5x faster than the same copy after a 64 MiB
sweep of the cache, and the codecs' times in copies moved much less
(2.1-3.6 copies cold, 2.4-4.4 warm). The built-in GPU profiles charge
measured copies the same way (`DeviceProfile.codec_copy_times`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from adacc_compile import compat, compat_inductor
from adacc_compile.kernels import Codec, DecompressKind, get_codec
from adacc_compile.kernels.aten_graphs import codec_graphs

from .codec_form import GraphForm

SAMPLE_SHAPE = (512, 1024)
"""Rows x columns of the timed sample: large enough that per-call overhead
is a few percent, small enough to compile and run in seconds on a CPU."""
REPEATS = 7
ALIGNED_COLUMNS = 64
"""A value whose last dimension is a multiple of this is timed on
`SAMPLE_SHAPE`, any other on `UNALIGNED_SAMPLE_SHAPE`. Such rows are not
whole groups (the outlier codecs pad them) nor whole int64 words of
one-byte payloads (read byte by byte), and cost more per element, measured
at 682 columns (a Llama FFN at d_model 256) against 1024: int8_outlier
1.7x on an AVX512 CPU, the int8/fp8 codecs 1.3-1.7x with AVX2."""
UNALIGNED_SAMPLE_SHAPE = (512, 1022)


def is_aligned(shape: Sequence[Any]) -> bool:
    """True when ``shape``'s rows are whole multiples of `ALIGNED_COLUMNS`
    (a 0-d value, or a symbolic last dimension, counts as aligned)."""
    if not shape:
        return True
    last = shape[-1]
    return not isinstance(last, int) or last % ALIGNED_COLUMNS == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecTiming:
    """Fastest seconds of one compress, one decompress and one copy of the
    sample's bytes (`copy_kernel`), timed in the same rounds, of ``numel``
    elements of ``itemsize`` bytes.

    For a `DecompressKind.DERIVATIVE` codec ``decompress_s`` is the
    gradient times the decompressed derivative, and ``replaced_s`` the
    activation backward that product takes the place of
    (`Codec.replaced_backward`): the backward runs either way, so the codec
    is charged only what its form adds to it, and never less than its
    compress (`added_s`)."""

    compress_s: float
    decompress_s: float
    copy_s: float
    numel: int
    itemsize: int
    replaced_s: float = 0.0

    @property
    def added_s(self) -> float:
        """What compress and decompress add to a step: the compress, and the
        decompress less the backward it replaces, if it costs more."""
        return self.compress_s + max(self.decompress_s - self.replaced_s, 0.0)

    @property
    def seconds_per_element(self) -> float:
        """As timed on the sample (warm in cache on a CPU)."""
        return self.added_s / max(self.numel, 1)

    @property
    def copies(self) -> float:
        """Compress + decompress (`added_s`) in copies of the value."""
        return self.added_s / self.copy_s

    def seconds_per_element_at(self, bandwidth: float) -> float:
        """Compress + decompress per element, charged `copies` of the
        value at ``bandwidth`` bytes per second (read + write)."""
        return self.copies * 2 * self.itemsize / bandwidth


def sample_input(codec: Codec, dtype: torch.dtype, device: str, shape: tuple[int, ...] = SAMPLE_SHAPE) -> torch.Tensor:
    """A tensor every codec accepts for ``dtype``: a bool mask for bool,
    else uniform values in [0, 1) (valid probabilities for softmax_u8)."""
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(shape, generator=gen)
    sample = values > 0.5 if dtype == torch.bool else values.to(dtype)
    return sample.to(device)


RoundTrip = tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]
"""(compress: value -> payload, decompress: payload -> what the backward
reads: the value, or for a derivative codec the gradient times the
derivative, on a fixed gradient)."""


def sample_gradient(sample: torch.Tensor) -> torch.Tensor:
    """A fixed gradient like ``sample``, for the backward of a derivative codec."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(sample.shape, generator=gen).to(sample.dtype).to(sample.device)


def replaced_backward(codec: Codec, sample: torch.Tensor) -> Callable[[], object] | None:
    """The activation backward a derivative codec's product replaces
    (`Codec.replaced_backward`), compiled by Inductor on ``sample`` and a
    fixed gradient; None for codecs that return the value."""
    if codec.decompress_kind is not DecompressKind.DERIVATIVE:
        return None
    grad = sample_gradient(sample)
    graph = compat_inductor.trace_aten(lambda g, x: (codec.replaced_backward(g, x),), [grad, sample])
    run = compat_inductor.inductor_compile_inference(graph, [grad, sample])
    return lambda: run(grad, sample)


def compiled_round_trip(codec: Codec, sample: torch.Tensor) -> RoundTrip:
    """(compress, decompress) of ``codec``'s aten form, each compiled by
    Inductor for values like ``sample``; decompress takes the payload tuple.

    A codec that takes calibrated parameters is timed with them (measured
    on ``sample``): the form a calibrated plan runs. Planned without real
    inputs, its compress measures them itself, one more pass than timed."""
    parameters = codec.calibration_parameters(sample)
    if parameters is None:
        graphs = codec_graphs(codec, sample)
        compress = compat_inductor.inductor_compile_inference(graphs.compress, [sample])
        payload = tuple(codec.aten_compress(sample))
        run_compress = lambda x: tuple(compress(x))  # noqa: E731
    else:
        graphs = codec_graphs(codec, sample, parameters)
        compress = compat_inductor.inductor_compile_inference(graphs.compress, [sample, parameters])
        payload = tuple(codec.aten_compress(sample, parameters))
        run_compress = lambda x: tuple(compress(x, parameters))  # noqa: E731
    if codec.decompress_kind is DecompressKind.DERIVATIVE:  # what the rewrite puts in the backward
        grad = sample_gradient(sample)
        shape, dtype = list(sample.shape), sample.dtype
        restore = compat_inductor.trace_aten(
            lambda g, *p: (g * codec.aten_decompress(list(p), shape, dtype),), [grad, *payload]
        )
        product = compat_inductor.inductor_compile_inference(restore, [grad, *payload])
        return run_compress, (lambda p: product(grad, *p)[0])
    decompress = compat_inductor.inductor_compile_inference(graphs.decompress, list(payload))
    return run_compress, (lambda p: decompress(*p)[0])  # graphs return tuples


def custom_op_round_trip(codec: Codec, sample: torch.Tensor) -> RoundTrip:
    """(compress, decompress) through the codec's custom ops (Triton on CUDA)."""
    shape, dtype = list(sample.shape), sample.dtype
    if codec.decompress_kind is DecompressKind.DERIVATIVE:
        grad = sample_gradient(sample)
        return (lambda x: tuple(codec.compress_op(x))), (lambda p: grad * codec.decompress_op(list(p), shape, dtype))
    return (lambda x: tuple(codec.compress_op(x))), (lambda p: codec.decompress_op(list(p), shape, dtype))


def copy_kernel(nbytes: int, device: torch.device) -> Callable[[], object]:
    """A pointwise kernel as Inductor compiles it (``x * 2 + 1``: one read,
    one write) over ``nbytes`` of float32: the kernel the profile's
    bandwidth was measured with (`device_profile.compiled_pointwise`), as
    the yardstick a codec is timed against."""
    from .device_profile import compiled_pointwise

    x = torch.rand(max(nbytes // 4, 1), device=device, generator=torch.Generator(device=device).manual_seed(0))
    return compiled_pointwise(x)


def time_round_trip(
    round_trip: RoundTrip, sample: torch.Tensor, *, repeats: int = REPEATS,
    replaced: Callable[[], object] | None = None,
) -> CodecTiming:
    """Compress, decompress, a copy of the sample's bytes and the
    ``replaced`` backward (`replaced_backward`, if any), each the fastest of
    ``repeats`` rounds that run them all in turn."""
    compress, decompress = round_trip
    copy = copy_kernel(sample.numel() * sample.element_size(), sample.device)
    payload = compress(sample)
    decompress(payload)
    fns = [lambda: compress(sample), lambda: decompress(payload), copy]
    if replaced is not None:
        fns.append(replaced)
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            out.append(_seconds(fn, sample.device))
    return CodecTiming(
        compress_s=min(times[0]), decompress_s=min(times[1]), copy_s=min(times[2]),
        replaced_s=min(times[3]) if replaced is not None else 0.0,
        numel=sample.numel(), itemsize=sample.element_size(),
    )


def measure_seconds_per_element(
    name: str, dtype: torch.dtype, device: str, form: GraphForm = GraphForm.ATEN, *, aligned: bool = True,
    bandwidth: float | None = None,
) -> float:
    """Seconds per element of compress + decompress of codec ``name`` on a
    ``dtype`` sample (`SAMPLE_SHAPE`, or `UNALIGNED_SAMPLE_SHAPE` when not
    ``aligned``), in ``form``; inf where the codec rejects the dtype. With
    ``bandwidth`` (the profile's, bytes per second), its time in copies of
    the value at that bandwidth (see the module docstring); without, as
    timed on the sample.

    Runs on real tensors even inside the partitioner (which runs under
    AOTAutograd's fake mode: `compat.real_tensors`)."""
    codec = get_codec(name)
    with compat.real_tensors():
        sample = sample_input(codec, dtype, device, SAMPLE_SHAPE if aligned else UNALIGNED_SAMPLE_SHAPE)
        try:
            codec.decompress(codec.compress(sample))
        except (TypeError, ValueError):
            return math.inf
        make = compiled_round_trip if form is GraphForm.ATEN else custom_op_round_trip
        round_trip = compat_inductor.run_isolated(lambda: make(codec, sample))
        replaced = compat_inductor.run_isolated(lambda: replaced_backward(codec, sample))
        timing = time_round_trip(round_trip, sample, replaced=replaced)
        return timing.seconds_per_element if bandwidth is None else timing.seconds_per_element_at(bandwidth)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
