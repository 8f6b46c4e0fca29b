"""Declared codec workspaces against the allocator: honest and not loose.

For every codec, a few shapes and dtypes: the bytes the torch reference
allocates and frees inside one compress / decompress call (peak during the
call minus its outputs, from the profiler's allocator trace, as
`adacc_compile.measure` reads it) must not exceed the declared
``*_workspace_nbytes(..., "cpu")``, and the declaration must stay within
twice the measurement plus a small constant. The CPU allocator has no cache,
so the trace is the same on every run.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from adacc_compile import compat_memory
from adacc_compile.kernels import available_codecs, get_codec

SHAPES = [(1024, 1024), (300, 77), (8, 4096), (4097,)]
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: Slack for bounds on tiny measurements (scalars, per-row / per-channel terms).
SLACK = 64 * 1024


def _transient_nbytes(fn, *args) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(*args)
    totals = compat_memory.allocator_totals(prof)
    outputs = out if isinstance(out, (list, tuple)) else [out]
    kept = sum(t.untyped_storage().nbytes() for t in outputs)
    return max(max(totals, default=0) - kept, 0)


def _sample(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    x = torch.randn(shape, generator=g)
    if name == "softmax_u8":
        x = x.softmax(-1)
    x = x.to(dtype)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    return x


def _cases():
    for name in available_codecs():
        dtypes = [torch.bool] if name == "bitmask" else FLOAT_DTYPES
        for dtype in dtypes:
            for shape in SHAPES:
                yield pytest.param(name, shape, dtype, id=f"{name}-{'x'.join(map(str, shape))}-{dtype}".replace("torch.", ""))


@pytest.mark.parametrize("name,shape,dtype", list(_cases()))
def test_cpu_workspace_bounds_measurement(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(name)
    x = _sample(name, shape, dtype)
    compress = _transient_nbytes(codec.compress_op, x)
    payload = codec.compress_op(x)
    decompress = _transient_nbytes(codec.decompress_op, payload, list(shape), dtype)
    declared_compress = codec.compress_workspace_nbytes(shape, dtype, "cpu")
    declared_decompress = codec.decompress_workspace_nbytes(shape, dtype, "cpu")
    assert compress <= declared_compress <= 2 * compress + SLACK
    assert decompress <= declared_decompress <= 2 * decompress + SLACK


def test_reductions_hold_for_large_inputs() -> None:
    """The torch references work on at most one float32 copy plus a few bytes
    per element (before: up to 46 bytes per element for int4_outlier)."""
    shape, numel = (1024, 1024), 1024 * 1024
    for name in available_codecs():
        dtype = torch.bool if name == "bitmask" else torch.float32
        declared = get_codec(name).compress_workspace_nbytes(shape, dtype, "cpu")
        assert declared <= 7 * numel, name


def test_triton_workspace_is_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels write their payload directly: per-chunk or per-channel
    scratch at most, far below a byte per element."""
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    shape = (4096, 4096)
    small = 4096 * 4096 // 16
    for name in available_codecs():
        codec = get_codec(name)
        dtype = torch.bool if name == "bitmask" else torch.bfloat16
        for device_type in ("cuda", "cpu"):  # forced Triton: interpreter on CPU
            assert codec.compress_workspace_nbytes(shape, dtype, device_type) <= small
            assert codec.decompress_workspace_nbytes(shape, dtype, device_type) <= small


def test_device_type_selects_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    """AUTO: CPU runs the torch reference; TORCH forces it on CUDA too."""
    codec = get_codec("int4_outlier")
    shape, dtype = (512, 512), torch.float16
    monkeypatch.setenv("ADACC_KERNELS", "auto")
    cpu = codec.compress_workspace_nbytes(shape, dtype, "cpu")
    assert cpu >= 4 * 512 * 512
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    assert codec.compress_workspace_nbytes(shape, dtype, "cuda") == cpu
