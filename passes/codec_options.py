"""Which codecs the planner may offer for a value, and what they cost.

Reads: ``node.meta["adacc"]`` (annotate pass) of the value and its backward
readers. Used by the candidates pass through `make_compress_options`.

Accuracy modes (option ``accuracy``) cap the declared relative error of a
codec; the layer-specific choice then falls out of each codec's ``applies``
check (what it was built for) and the cap:

============  =================================  ===========================
mode          codecs allowed (declared error)     typical use
============  =================================  ===========================
lossless      bitmask (0)                        dropout / ReLU masks
balanced      + int8_outlier (0.015)             any float activation: linear
                                                 inputs, matmul outputs
aggressive    + fp8_e4m3 (0.03), fp8_e5m2        any float value in 8 bits,
              (0.06), int4_outlier (0.16),       linear inputs at 4 bits,
              softmax_u8 (0.12),                 attention probabilities,
              fewbit_gelu/silu (0.12/0.10)       GELU/SiLU inputs
============  =================================  ===========================

The bounds are the codecs' own declarations, measured on Gaussian, LLM-like
outlier-channel and real-activation-like inputs (see bench/RESULTS.md); the
calibrate pass then measures each option on the model's real activations and
drops those over their bound. Balanced stops at 0.02: in the accuracy study
(bench/RESULTS.md, 3 seeds, 300 steps) plans using fp8_e4m3 (per-tensor
scale, ~0.027 measured) moved the final loss by up to 0.56%; with
int8_outlier (group scales plus outlier channels, ~0.006 measured) in their
place the worst seed moved 0.48%, inside the 0.5% target. softmax_u8 is
offered for softmax outputs only, never log-softmax.

Cost: compress + decompress seconds. With a calibrated (measured) device
profile the codec itself is timed on the current device when the profile is
measured, and cached with it (`profile_cache`; the CPU path is the torch
reference, much slower than a copy, so compression is rarely worth it on
CPU; on GPU the Triton kernels run near bandwidth).
With a built-in GPU profile the cost is bytes moved over bandwidth.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.kernels import ApplyQuery, Codec, DecompressKind, available_codecs, get_codec

from .annotate import annotation
from .compress_rewrite import physical_order
from .device_profile import BUILTIN_PROFILES, DeviceProfile
from .plan_problem import CompressOption

ACCURACY_ERROR_CAP = {"lossless": 0.0, "balanced": 0.02, "aggressive": 0.2}


def allowed_codecs(accuracy: str, names: tuple[str, ...] | None) -> list[Codec]:
    """Codecs permitted by the accuracy mode (and the explicit list, if any)."""
    cap = ACCURACY_ERROR_CAP[accuracy]
    pool = available_codecs() if names is None else list(names)
    out = []
    for name in pool:
        codec = get_codec(name)
        if codec.lossless or codec.error_bound <= cap:
            out.append(codec)
    return out


def make_compress_options(
    codecs: list[Codec], profile: DeviceProfile, backward_nodes: frozenset[fx.Node]
) -> Callable[[fx.Node], tuple[CompressOption, ...]]:
    """A callback for `find_candidates`: the legal codec options of a node."""

    def options(node: fx.Node) -> tuple[CompressOption, ...]:
        val = node.meta.get("val")
        if not codecs or not isinstance(val, torch.Tensor) or not _static(val):
            return ()
        if physical_order(val) is None:
            return ()  # expanded / overlapping: its layout could not be restored
        # A value saved in a non-contiguous (permuted) layout is copied back
        # into that layout after decompression: one more read and write.
        restride = 0.0 if val.is_contiguous() else 2 * annotation(node).storage_bytes / profile.memory_bytes_per_s
        readers = [u for u in node.users if u in backward_nodes]
        query = ApplyQuery(
            shape=tuple(int(s) for s in val.shape),
            dtype=val.dtype,
            producer_class=annotation(node).op_class.value,
            producer_target=str(node.target),
            consumer_classes=tuple(annotation(u).op_class.value for u in readers),
            consumer_targets=tuple(str(u.target) for u in readers),
        )
        out = []
        for codec in codecs:
            try:
                if not codec.applies(query):
                    continue
            except (TypeError, ValueError):
                continue
            nbytes = codec.compressed_nbytes(query.shape, query.dtype)
            if nbytes >= annotation(node).storage_bytes:
                continue
            out.append(
                CompressOption(
                    codec=codec.name,
                    nbytes=nbytes,
                    seconds=codec_seconds(codec, query.shape, query.dtype, profile)
                    + (restride if codec.decompress_kind is DecompressKind.VALUE else 0.0),
                    error=codec.error_bound,
                    feeds_recompute=codec.feeds_recompute,
                )
            )
        return tuple(out)

    return options


def _static(val: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in val.shape)


def codec_seconds(codec: Codec, shape: tuple[int, ...], dtype: torch.dtype, profile: DeviceProfile) -> float:
    """Compress + decompress time of ``codec`` on ``shape``/``dtype``."""
    numel = 1
    for s in shape:
        numel *= s
    if profile in BUILTIN_PROFILES.values() or not profile.name.startswith("calibrated"):
        return codec.cost_seconds(shape, dtype, profile.memory_bytes_per_s) + 2 * profile.launch_overhead_s
    seconds_per_element = profile.codec_seconds_per_element.get(codec_key(codec.name, dtype))
    if seconds_per_element is None:  # a codec registered after the profile was measured
        device = profile.name.removeprefix("calibrated ").strip() or "cpu"
        seconds_per_element = _measured_seconds_per_element(codec.name, dtype, device)
    return numel * seconds_per_element + 2 * profile.launch_overhead_s


MEASURED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.bool)
"""The dtypes every codec is timed on when a device profile is measured."""


def codec_key(name: str, dtype: torch.dtype) -> str:
    return f"{name}/{str(dtype).removeprefix('torch.')}"


def measure_codec_seconds(device: str) -> dict[str, float]:
    """Compress + decompress seconds per element of every registered codec on
    every dtype of `MEASURED_DTYPES` it accepts (for a measured profile)."""
    out = {}
    with compat.real_tensors():
        for name in available_codecs():
            for dtype in MEASURED_DTYPES:
                seconds = _time_codec(name, dtype, device)
                if seconds != float("inf"):
                    out[codec_key(name, dtype)] = seconds
    return out


@functools.lru_cache(maxsize=None)
def _measured_seconds_per_element(name: str, dtype: torch.dtype, device: str) -> float:
    """Times compress + decompress of ``name`` on a sample tensor (cached).

    The partitioner runs under AOTAutograd's fake mode; timing must use real
    tensors (`compat.real_tensors`)."""
    with compat.real_tensors():
        return _time_codec(name, dtype, device)


def _time_codec(name: str, dtype: torch.dtype, device: str) -> float:
    codec = get_codec(name)
    rows, cols = 256, 1024
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        sample = torch.rand(rows, cols, generator=gen) > 0.5
    else:
        sample = torch.rand(rows, cols, generator=gen).to(dtype)  # valid for every codec (softmax too)
    sample = sample.to(device)
    try:
        packed = codec.compress(sample)
        codec.decompress(packed)
    except (TypeError, ValueError, RuntimeError):
        return float("inf")
    times = []
    for _ in range(3):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        codec.decompress(codec.compress(sample))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[1] / sample.numel()
