"""Roofline cost model of a device: how long an op takes from FLOPs and bytes.

The planner trades memory against *time*, so every node needs a runtime
estimate before anything runs. A roofline (max of compute time and memory
time, plus a launch overhead) is coarse but monotone in the right quantities,
which is what a MILP that compares "recompute a matmul" with "recompute a
norm" needs. Built-in profiles cover common GPUs (vendor datasheet peaks,
dense, derated to what kernels reach); `calibrate` measures the current
device, CPU included, once per machine (`profile_cache`: the measurement
is cached on disk, so the same model and options give the same plan in every
process).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceProfile:
    """Peak rates of one device, as the cost model uses them."""

    name: str
    """Human-readable device name."""
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)
    """Achievable matmul FLOP/s per dtype name ("float32", "bfloat16", ...)."""
    elementwise_flops_per_s: float = 1e12
    """Achievable FLOP/s for non-matmul ops."""
    memory_bytes_per_s: float = 1e11
    """Achievable memory bandwidth (read + write)."""
    launch_overhead_s: float = 5e-6
    """Fixed cost per kernel."""
    codec_seconds_per_element: dict[str, float] = field(default_factory=dict)
    """Measured compress + decompress time per element, keyed
    ``"<codec>/<dtype>"`` (measured profiles only; built-in GPU profiles
    derive codec time from bytes moved)."""
    codec_copy_times: dict[str, float] = field(default_factory=dict)
    """Built-in profiles measured on the device: each codec's compress +
    decompress time in its default (aten, Inductor-compiled) form, as a
    multiple of copying the value, keyed by codec name
    (`codec_options.codec_seconds` charges at least that many copies)."""
    triton_codec_copy_times: dict[str, float] = field(default_factory=dict)
    """The same for each codec's custom ops (its hand-written Triton
    kernels), measured alongside: `codec_form.graph_form` inserts those
    where they were faster, and `codec_options.codec_seconds` charges the
    faster form."""

    def measured_codec_form(self, codec: str) -> tuple[bool, float] | None:
        """(whether the custom ops were the faster form, that form's time in
        copies of the value) where this profile holds both forms' measured
        times for ``codec`` (`codec_copy_times`), else None."""
        aten, triton = self.codec_copy_times.get(codec), self.triton_codec_copy_times.get(codec)
        if aten is None or triton is None:
            return None
        return triton < aten, min(aten, triton)

    def matmul_rate(self, dtype: torch.dtype | None) -> float:
        key = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
        if key in self.matmul_flops_per_s:
            return self.matmul_flops_per_s[key]
        return self.matmul_flops_per_s.get("float32", self.elementwise_flops_per_s)

    def runtime_s(
        self, *, flops: int, bytes_moved: int, is_matmul: bool, dtype: torch.dtype | None
    ) -> float:
        """Roofline: max(compute time, memory time) + launch overhead."""
        rate = self.matmul_rate(dtype) if is_matmul else self.elementwise_flops_per_s
        return max(flops / rate, bytes_moved / self.memory_bytes_per_s) + self.launch_overhead_s

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "matmul_flops_per_s": dict(self.matmul_flops_per_s),
            "elementwise_flops_per_s": self.elementwise_flops_per_s,
            "memory_bytes_per_s": self.memory_bytes_per_s,
            "launch_overhead_s": self.launch_overhead_s,
            "codec_seconds_per_element": dict(self.codec_seconds_per_element),
            "codec_copy_times": dict(self.codec_copy_times),
            "triton_codec_copy_times": dict(self.triton_codec_copy_times),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> "DeviceProfile":
        return DeviceProfile(
            name=str(data["name"]),
            matmul_flops_per_s={str(k): float(v) for k, v in data["matmul_flops_per_s"].items()},
            elementwise_flops_per_s=float(data["elementwise_flops_per_s"]),
            memory_bytes_per_s=float(data["memory_bytes_per_s"]),
            launch_overhead_s=float(data["launch_overhead_s"]),
            codec_seconds_per_element={
                str(k): float(v) for k, v in data.get("codec_seconds_per_element", {}).items()
            },
            codec_copy_times={str(k): float(v) for k, v in data.get("codec_copy_times", {}).items()},
            triton_codec_copy_times={
                str(k): float(v) for k, v in data.get("triton_codec_copy_times", {}).items()
            },
        )

    def digest(self) -> str:
        """Hash of every figure: part of the partitioner's cache key, since
        the plan follows the costs."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _gpu(name: str, bf16: float, tf32: float, fp32: float, bandwidth: float, launch: float) -> DeviceProfile:
    """Achievable figures (what tuned kernels reach, measured by others: see
    shared/REFERENCES.md), not datasheet peaks."""
    return DeviceProfile(
        name=name,
        matmul_flops_per_s={
            "bfloat16": bf16,
            "float16": bf16,
            "float8_e4m3fn": 1.8 * bf16,
            "float32": tf32 if torch.backends.cuda.matmul.allow_tf32 else fp32,
        },
        elementwise_flops_per_s=fp32,
        memory_bytes_per_s=bandwidth,
        launch_overhead_s=launch,
    )


#: Compress + decompress of a bfloat16 [8192, 4096] value by each codec's
#: Inductor-compiled aten form, in copies of the value, measured on one H200
#: (torch 2.11, Triton 3.6) by ``bench/gpu_check.py`` on 2026-12-04
#: (bench/RESULTS.md). Each form ran as its own kernels there: inside a
#: step, compress needs the block or group maxima before its first code,
#: so it does not fold into the producing matmul's epilogue either, and
#: the steps measured with compressing plans ran slower than the fused
#: byte model predicted. Re-measure with gpu_check when a codec changes.
#: The codecs that take calibrated parameters (int8_smooth's channel
#: factors, int8/int4_outlier's outlier channels) are charged the form a
#: calibrated plan runs: the compress with its parameters as a graph input
#: (gpu_check's "(calibrated)" rows) plus the decompress, the mean of the
#: two runs that timed it (2026-12-04 evening; per call the same runs
#: measured 1.6 to 2.4x as much). As on the CPU (`codec_timing.compiled_round_trip`), a plan
#: made without real inputs, whose compress measures them per call, is
#: charged low. `H200_TRITON_CODEC_COPY_TIMES`: the custom ops
#: (hand-written Triton, per call), the morning run; they were faster for
#: fewbit_gelu only.
H200_CODEC_COPY_TIMES: dict[str, float] = {
    "bitmask": 3.87,
    "fewbit_gelu": 6.34,
    "fewbit_silu": 3.90,
    "fp8_e4m3": 3.66,
    "fp8_e5m2": 3.60,
    "int4_channel": 5.64,
    "int4_outlier": 5.41,
    "int8_channel": 5.15,
    "int8_outlier": 4.42,
    "int8_smooth": 3.57,
    "softmax_u8": 2.52,
}

H200_TRITON_CODEC_COPY_TIMES: dict[str, float] = {
    "bitmask": 11.13,
    "fewbit_gelu": 3.91,
    "fewbit_silu": 4.01,
    "fp8_e4m3": 6.74,
    "fp8_e5m2": 4.85,
    "int4_channel": 9.11,
    "int4_outlier": 13.76,
    "int8_channel": 6.29,
    "int8_outlier": 19.44,
    "int8_smooth": 26.52,
    "softmax_u8": 6.56,
}

BUILTIN_PROFILES: dict[str, DeviceProfile] = {
    # bf16 dense matmul, tf32, fp32 (non-tensor-core), HBM bandwidth, launch floor.
    "a100": _gpu("NVIDIA A100-SXM4-80GB", 250e12, 125e12, 17e12, 1.75e12, 3e-6),
    "h100": _gpu("NVIDIA H100 SXM", 700e12, 350e12, 55e12, 3.0e12, 2e-6),
    "h200": dataclasses.replace(
        _gpu("NVIDIA H200", 790e12, 395e12, 55e12, 4.3e12, 2e-6),
        codec_copy_times=H200_CODEC_COPY_TIMES,
        triton_codec_copy_times=H200_TRITON_CODEC_COPY_TIMES,
    ),
}


def profile_by_name(name: str) -> DeviceProfile:
    """A built-in profile, "cpu" (measured once per machine, cached on disk),
    "calibrate" (measured now; the cache is refreshed), or "auto"."""
    key = name.lower()
    if key in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[key]
    if key == "cpu":
        return calibrate("cpu")
    if key == "calibrate":
        return calibrate("cuda" if torch.cuda.is_available() else "cpu", refresh=True)
    if key == "auto":
        return detect_profile()
    valid = ", ".join([*BUILTIN_PROFILES, "cpu", "calibrate", "auto"])
    raise ValueError(f"device_profile={name!r} is not one of: {valid}")


def detect_profile() -> DeviceProfile:
    """Built-in profile for the current GPU if known, else a calibrated one."""
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name().lower()
        for key, profile in BUILTIN_PROFILES.items():
            if key in gpu:
                return profile
        return calibrate("cuda")
    return calibrate("cpu")


def calibrate(device: str = "cpu", *, refresh: bool = False) -> DeviceProfile:
    """The measured profile of this machine's ``device``: measured once and
    cached on disk and in the process (`profile_cache`); ``refresh=True``
    (or env ``ADACC_REMEASURE=1``) measures again and replaces the cache."""
    from .profile_cache import cached_profile

    return cached_profile(device, refresh=refresh)


def measure_roofline(device: str) -> DeviceProfile:
    """Measures matmul FLOP/s (aten, as Inductor calls it) and the bandwidth,
    elementwise rate and launch overhead of an Inductor-compiled pointwise
    kernel (`_fused_kernel_rates`).

    Small sizes keep the timing under a second on a CPU (compiling the
    kernel takes a few more, once per machine: the profile is cached); the
    medians of a few repeats resist noise from a shared machine.
    """
    from adacc_compile import compat

    with compat.real_tensors():  # the partitioner runs under a fake mode
        return _calibrate(torch.device(device))


def _fused_kernel_rates(dev: torch.device) -> tuple[float, float, float]:
    """Bandwidth, elementwise rate and launch overhead of a pointwise kernel
    as Inductor generates it (C++ on CPU, Triton on CUDA): what a fused
    recomputation, a kept value's write and read, or a fused codec run as.
    Eager ops, one pass each, under-state it."""
    numel = (1 << 24) if dev.type == "cuda" else (1 << 21)
    big = torch.rand(numel, device=dev, generator=torch.Generator(device=dev).manual_seed(0))
    tiny = torch.ones(1, device=dev)
    big_s, launch = (_median_seconds(compiled_pointwise(sample), dev, repeats=7) for sample in (big, tiny))
    return 2 * big.numel() * big.element_size() / big_s, big.numel() / big_s, launch


def compiled_pointwise(sample: torch.Tensor) -> Callable[[], object]:
    """``x * 2 + 1`` on ``sample``, compiled by Inductor, as a call with no
    arguments: one read and one write per element, the kernel the
    bandwidth is measured with (and the yardstick codecs are timed
    against: `codec_timing.copy_kernel`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from adacc_compile import compat_inductor

    def pointwise(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x * 2.0 + 1.0,)

    graph = make_fx(pointwise)(sample)
    fn = compat_inductor.run_isolated(lambda: compat_inductor.inductor_compile_inference(graph, [sample]))
    return lambda: fn(sample)


def _calibrate(dev: torch.device) -> DeviceProfile:
    matmul = {"float32": _matmul_rate(dev, torch.float32, 512)}
    if dev.type == "cuda":
        matmul["bfloat16"] = _matmul_rate(dev, torch.bfloat16, 4096)
        matmul["float16"] = matmul["bfloat16"]
        matmul["float32"] = _matmul_rate(dev, torch.float32, 4096)
    else:
        matmul["bfloat16"] = _matmul_rate(dev, torch.bfloat16, 256)
        matmul["float16"] = matmul["bfloat16"]
    bandwidth, elementwise, launch = _fused_kernel_rates(dev)
    return DeviceProfile(
        name=f"calibrated {dev.type}",
        matmul_flops_per_s=matmul,
        elementwise_flops_per_s=max(elementwise, 1e8),
        memory_bytes_per_s=bandwidth,
        launch_overhead_s=launch,
    )


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int) -> float:
    gen = torch.Generator(device=device).manual_seed(0)  # leave the global RNG alone
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    seconds = _median_seconds(lambda: a @ b, device)
    return 2 * n**3 / seconds


def _median_seconds(fn, device: torch.device, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return max(times[len(times) // 2], 1e-9)
