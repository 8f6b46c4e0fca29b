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
neighbours did while it was timed. Inside a real graph compress fuses into
the producer and decompress into the reader, so this is an upper bound of
what the codec adds to a step. On CUDA the custom ops (the hand-written
Triton kernels) are timed the same way, so that `codec_form.graph_form`
can pick the faster form.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from adacc_compile import compat
from adacc_compile.kernels import Codec, get_codec
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
    """Median seconds of one compress and one decompress of ``numel`` elements."""

    compress_s: float
    decompress_s: float
    numel: int

    @property
    def seconds_per_element(self) -> float:
        return (self.compress_s + self.decompress_s) / max(self.numel, 1)


def sample_input(codec: Codec, dtype: torch.dtype, device: str, shape: tuple[int, ...] = SAMPLE_SHAPE) -> torch.Tensor:
    """A tensor every codec accepts for ``dtype``: a bool mask for bool,
    else uniform values in [0, 1) (valid probabilities for softmax_u8)."""
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(shape, generator=gen)
    sample = values > 0.5 if dtype == torch.bool else values.to(dtype)
    return sample.to(device)


RoundTrip = tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]


def compiled_round_trip(codec: Codec, sample: torch.Tensor) -> RoundTrip:
    """(compress, decompress) of ``codec``'s aten form, each compiled by
    Inductor for values like ``sample``; decompress takes the payload tuple.

    A codec that takes calibrated parameters is timed with them (measured
    on ``sample``): the form a calibrated plan runs. Planned without real
    inputs, its compress measures them itself, one more pass than timed."""
    parameters = codec.calibration_parameters(sample)
    if parameters is None:
        graphs = codec_graphs(codec, sample)
        compress = compat.inductor_compile_inference(graphs.compress, [sample])
        payload = tuple(codec.aten_compress(sample))
        run_compress = lambda x: tuple(compress(x))  # noqa: E731
    else:
        graphs = codec_graphs(codec, sample, parameters)
        compress = compat.inductor_compile_inference(graphs.compress, [sample, parameters])
        payload = tuple(codec.aten_compress(sample, parameters))
        run_compress = lambda x: tuple(compress(x, parameters))  # noqa: E731
    decompress = compat.inductor_compile_inference(graphs.decompress, list(payload))
    return run_compress, (lambda p: decompress(*p)[0])  # graphs return tuples


def custom_op_round_trip(codec: Codec, sample: torch.Tensor) -> RoundTrip:
    """(compress, decompress) through the codec's custom ops (Triton on CUDA)."""
    shape, dtype = list(sample.shape), sample.dtype
    return (lambda x: tuple(codec.compress_op(x))), (lambda p: codec.decompress_op(list(p), shape, dtype))


def time_round_trip(round_trip: RoundTrip, sample: torch.Tensor, *, repeats: int = REPEATS) -> CodecTiming:
    compress, decompress = round_trip
    payload = compress(sample)
    decompress(payload)
    return CodecTiming(
        compress_s=_fastest_seconds(lambda: compress(sample), sample.device, repeats),
        decompress_s=_fastest_seconds(lambda: decompress(payload), sample.device, repeats),
        numel=sample.numel(),
    )


def measure_seconds_per_element(
    name: str, dtype: torch.dtype, device: str, form: GraphForm = GraphForm.ATEN, *, aligned: bool = True
) -> float:
    """Seconds per element of compress + decompress of codec ``name`` on a
    ``dtype`` sample (`SAMPLE_SHAPE`, or `UNALIGNED_SAMPLE_SHAPE` when not
    ``aligned``), in ``form``; inf where the codec rejects the dtype.

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
        round_trip = compat.run_isolated(lambda: make(codec, sample))
        return time_round_trip(round_trip, sample).seconds_per_element


def _fastest_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
