"""Memory traffic of the Triton codec kernels: one read of the value, one
write of the payload, per element.

A codec on a GPU runs at memory bandwidth only if its compress reads the
value once (statistics and codes from the same registers) and writes each
payload byte once, and its decompress reads each code once and writes each
output element once. Counted here under ``TRITON_INTERPRET=1``: every
masked load and store the interpreter executes is recorded by address and
mapped back onto the tensors' elements. Small per-row and per-channel
vectors (scales, smoothing factors, slot maps) that programs re-read from
cache are not counted against a kernel; the payload parts the torch glue
makes (int8_smooth's factors, int_outlier's index) are not the kernels'.

Two passes remain where the statistics need the whole tensor before the
first code: a compress that chooses int_outlier's channels or int8_smooth's
factors on the value itself (a calibrated plan gives them instead), int4_outlier
with an odd number of groups (a group straddles two programs' nibbles:
channels not a multiple of 64), and rows wider than
`oplib.ONE_PASS_MAX_COLUMNS`. The tests below pin those counts too.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import numpy as np
import pytest
import torch

from adacc_compile.kernels import bitmask, fewbit, fp8, int4_channel, int8_smooth, int_channel, int_outlier, softmax_u8
from adacc_compile.kernels.oplib import is_interpreted

INTERPRETED = is_interpreted(fp8._fp8_compress_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_oplib's test_codec_kernels_in_interpreter"
)


@contextlib.contextmanager
def _traffic() -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Addresses of every element the interpreted kernels load and store."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    loads: list[np.ndarray] = []
    stores: list[np.ndarray] = []
    load, store = builder.create_masked_load, builder.create_masked_store

    def counted_load(self, ptrs, mask, other, *args):
        loads.append(np.asarray(ptrs.data)[np.asarray(mask.data)].astype(np.uint64).ravel())
        return load(self, ptrs, mask, other, *args)

    def counted_store(self, ptrs, value, mask, *args):
        stores.append(np.asarray(ptrs.data)[np.asarray(mask.data)].astype(np.uint64).ravel())
        return store(self, ptrs, value, mask, *args)

    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store
    try:
        yield loads, stores
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


def _per_element(addresses: list[np.ndarray], t: torch.Tensor) -> np.ndarray:
    """How often each element of ``t`` (contiguous) was touched."""
    assert t.is_contiguous()
    every = np.concatenate(addresses) if addresses else np.zeros(0, dtype=np.uint64)
    base, size = t.data_ptr(), t.numel() * t.element_size()
    inside = every[(every >= base) & (every < base + size)] - base
    return np.bincount((inside // t.element_size()).astype(np.int64), minlength=t.numel())


def _once(counts: np.ndarray) -> bool:
    return counts.size > 0 and int(counts.min()) == 1 and int(counts.max()) == 1


Compress = Callable[[torch.Tensor], list[torch.Tensor]]
Decompress = Callable[[Sequence[torch.Tensor], Sequence[int], torch.dtype], torch.Tensor]


def _measure(compress: Compress, decompress: Decompress, x: torch.Tensor, written: Sequence[int]):
    """(reads of each element of x, writes of each element of each payload
    part in ``written``, reads of each code, writes of each output element)."""
    x = x.contiguous()
    with _traffic() as (loads, stores):
        payload = compress(x)
    x_reads = _per_element(loads, x)
    payload_writes = [_per_element(stores, payload[i]) for i in written]
    with _traffic() as (loads, stores):
        out = decompress(payload, x.shape, x.dtype)
    return x_reads, payload_writes, _per_element(loads, payload[0]), _per_element(stores, out)


def _values(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x[:, 3 % cols] *= 40.0  # an outlier channel
    return x


# (name, compress, decompress, input maker, payload parts the compress kernel
# writes). Calibrated parameters are measured by torch code inside the
# compress lambdas, which the interpreter's counter does not see.
ONE_PASS = {
    "int8_channel": (int_channel.triton_int8_channel_compress, int_channel.triton_int8_channel_decompress,
                     _values, (0, 1)),
    "int4_channel": (int4_channel.triton_int4_channel_compress, int4_channel.triton_int4_channel_decompress,
                     _values, (0, 1)),
    "fp8_e4m3": (lambda x: fp8.triton_fp8_compress(x, fp8.E4M3),
                 lambda p, s, d: fp8.triton_fp8_decompress(p, s, d, fp8.E4M3), _values, (0, 1)),
    "fp8_e5m2": (lambda x: fp8.triton_fp8_compress(x, fp8.E5M2),
                 lambda p, s, d: fp8.triton_fp8_decompress(p, s, d, fp8.E5M2), _values, (0, 1)),
    "int8_outlier (calibrated)": (
        lambda x: int_outlier.triton_int8_outlier_compress(x, int_outlier.INT8_OUTLIER.calibration_parameters(x)),
        int_outlier.triton_int8_outlier_decompress, _values, (0, 1, 3)),
    "int4_outlier (calibrated)": (
        lambda x: int_outlier.triton_int4_outlier_compress(x, int_outlier.INT4_OUTLIER.calibration_parameters(x)),
        int_outlier.triton_int4_outlier_decompress, _values, (0, 1, 3)),
    "int8_smooth (calibrated)": (
        lambda x: int8_smooth.triton_int8_smooth_compress(x, int8_smooth.INT8_SMOOTH.calibration_parameters(x)),
        int8_smooth.triton_int8_smooth_decompress, _values, (0, 1)),
    "bitmask": (bitmask.triton_bitmask_compress, bitmask.triton_bitmask_decompress,
                lambda r, c: _values(r, c) > 0, (0,)),
    "fewbit_gelu": (fewbit.triton_fewbit_gelu_compress, fewbit.triton_fewbit_gelu_decompress, _values, (0,)),
    "fewbit_silu": (fewbit.triton_fewbit_silu_compress, fewbit.triton_fewbit_silu_decompress, _values, (0,)),
    "softmax_u8": (softmax_u8.triton_softmax_u8_compress, softmax_u8.triton_softmax_u8_decompress,
                   lambda r, c: _values(r, c).softmax(-1), (0,)),
}
# Narrow rows of several programs, and wide ones: a hidden size (4096) exceeds every fixed block.
SHAPES = [(16, 256), (3, 4096)]


@interpreted
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(ONE_PASS))
def test_interpreted_kernels_read_the_value_once_and_write_each_payload_byte_once(name, shape):
    compress, decompress, make, written = ONE_PASS[name]
    x_reads, payload_writes, code_reads, out_writes = _measure(compress, decompress, make(*shape), written)
    assert _once(x_reads), (name, int(x_reads.min()), int(x_reads.max()))
    for part, writes in zip(written, payload_writes):
        assert _once(writes), (name, part, int(writes.min()), int(writes.max()))
    assert _once(code_reads), (name, int(code_reads.min()), int(code_reads.max()))
    assert _once(out_writes), (name, int(out_writes.min()), int(out_writes.max()))


TWO_PASSES = {
    "int8_outlier, channels chosen on the value": (
        int_outlier.triton_int8_outlier_compress, int_outlier.triton_int8_outlier_decompress, (64, 512)),
    "int8_smooth, factors measured on the value": (
        int8_smooth.triton_int8_smooth_compress, int8_smooth.triton_int8_smooth_decompress, (64, 512)),
    "int4_outlier, an odd number of groups": (
        lambda x: int_outlier.triton_int4_outlier_compress(x, int_outlier.INT4_OUTLIER.calibration_parameters(x)),
        int_outlier.triton_int4_outlier_decompress, (8, 480)),
}


@interpreted
@pytest.mark.parametrize("name", list(TWO_PASSES))
def test_interpreted_kernels_that_need_whole_tensor_statistics_read_the_value_twice(name):
    """The documented exceptions: twice, not more, and still one write of
    each code and one read of it in the decompress."""
    compress, decompress, shape = TWO_PASSES[name]
    x_reads, (code_writes,), code_reads, out_writes = _measure(compress, decompress, _values(*shape), (0,))
    assert int(x_reads.min()) == int(x_reads.max()) == 2, (name, int(x_reads.min()), int(x_reads.max()))
    assert _once(code_writes) and _once(code_reads) and _once(out_writes), name


@interpreted
def test_interpreted_traffic_counter_sees_a_second_read():
    """The counter itself: a kernel that reads its input twice is counted
    twice (the uncalibrated int8_outlier compress reads the value once for
    channel maxima, once for codes), and a tensor nothing touches, zero."""
    x = _values(16, 64)
    untouched = torch.zeros(16)
    with _traffic() as (loads, _stores):
        int_outlier.triton_int8_outlier_compress(x)
    assert int(_per_element(loads, x).min()) == 2
    assert int(_per_element(loads, untouched).max()) == 0


@interpreted
@pytest.mark.parametrize("name", ["fp8_e4m3", "int8_smooth (calibrated)"])
def test_interpreted_rows_wider_than_one_block_are_read_twice_with_the_same_bits(name, monkeypatch):
    """Rows wider than `oplib.ONE_PASS_MAX_COLUMNS` (64 here, 32768 in
    use) are covered block by block: the maxima, then the codes, each a
    read of the value; the payload is the one-pass kernel's, bit for bit."""
    from adacc_compile.kernels import oplib

    compress, decompress, make, _written = ONE_PASS[name]
    x = make(3, 320)
    one_pass = compress(x)
    monkeypatch.setattr(oplib, "ONE_PASS_MAX_COLUMNS", 64)
    x_reads, (code_writes,), code_reads, out_writes = _measure(compress, decompress, x, (0,))
    assert int(x_reads.min()) == int(x_reads.max()) == 2, (int(x_reads.min()), int(x_reads.max()))
    assert _once(code_writes) and _once(code_reads) and _once(out_writes)
    assert all(torch.equal(a, b) for a, b in zip(compress(x), one_pass))
