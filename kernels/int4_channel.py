"""Codec "int4_channel": int4 codes, one scale per channel and block of 32 rows.

Why: the 4-bit twin of `int8_channel` (see that module for the layout's
reasoning): `int4_outlier`'s group pass (outlier channels chosen from all
rows, a horizontal maximum per group of 32 channels, a gather) runs at about
14x a copy of the value in Inductor's CPU code; per channel and block of
rows every step is vertical and elementwise. Strong channels get their own
scales, so no outlier slots are needed.

Layout: ``x`` is viewed as R rows x C channels (C = last dim; a 0-d tensor is
1 x 1), with B = 32 rows per block, N = ceil(R / B) blocks and H = B / 2.
The payload::

    [0] codes   uint8    [N H, C]  byte (n H + i, c): row n B + i of channel c
                                   in its low nibble, row n B + H + i in its
                                   high one (rows past R: code 0)
    [1] scales  float32  [N, C]    block n, channel c

Pairing a row with the row half a block further on (not with its
neighbour) keeps packing and unpacking elementwise over contiguous memory.
Every size depends on the shape alone. A block of 32 rows (not 64 as for
int8) keeps the error of skewed inputs such as GELU outputs, the inputs of
MLP down projections, inside the declared bound; its float32 scales cost
1/8 byte per element (0.625 bytes in all, int4_outlier 0.59).

Codes: ``scale = max(m / L, 2^-126)`` with m the block's largest finite |x|
in that channel and L = 7, and
``code = round_half_even(clamp(x * (1 / scale), -7, 7))``. NaN and ±Inf:
a (block, channel) holding one is flagged by the sign of its scale and
quantises with L = 6, so that its codes 7 and -7 are free for ±Inf (an
infinite product clamps there by itself); NaN is -8 (never a finite
code). Only flagged blocks lose a level. The reciprocal is computed once
per block and channel, correctly rounded on every path (torch; Inductor
through `aten_graphs.divide`, float64 on a GPU; Triton's ``div_rn`` by a
tensor), and the product is one float32 multiply: the three stay
bit-exact, and the codes loop multiplies instead of dividing each
element (a vector division cost more than the rest of that loop on
AVX512, measured in `bench/RESULTS.md`).

Error: each code is within half a step (m / 14, m / 12 when flagged) of its
value, so the relative error can never exceed sqrt(32) / 12 = 0.47. Measured
(tests/kernels/test_int4_channel.py, bench/bench_codec_error.py) about 0.1;
declared 0.16 like `int4_outlier`, and offered, like it, for the inputs of
linear layers only.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import REGISTRY
from .aten_graphs import divide, nibble_bytes, packed_fields, written
from .int_channel import (
    DTYPES,
    MIN_SCALE,
    ChannelCodec,
    aten_block_max,
    block_absmax,
    blocked,
    check_channel_payload,
    row_blocks,
    triton_channel_compress,
    triton_channel_decompress,
)
from .oplib import (
    PayloadSpec,
    Workspace,
    check_input,
    known_true,
    register_dispatched_ops,
    rne_cast,
    rows_channels,
    tl,
    triton_jit,
)

NAME = "int4_channel"
#: Rows per block sharing one scale per channel.
BLOCK_ROWS = 32
HALF = BLOCK_ROWS // 2
#: Largest code; flagged blocks keep it (and -QMAX) for ±Inf, and -QMAX - 1 is NaN.
QMAX = 7
_SMALL = 256


def int4_channel_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """Shapes and dtypes of [codes, scales] (see module docstring)."""
    rows, channels = rows_channels(shape)
    blocks = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    return [((blocks * HALF, channels), torch.uint8), ((blocks, channels), torch.float32)]


def _scales(peak: torch.Tensor, flagged: torch.Tensor) -> torch.Tensor:
    """Stored scales (negative where flagged) from the blocks' largest finite
    |x| and their NaN/Inf flags, float32 [N, C]."""
    scale = torch.clamp_min(divide(peak, torch.where(flagged, QMAX - 1.0, float(QMAX))), MIN_SCALE)
    return torch.where(flagged, -scale, scale)


# --------------------------------------------------------------------------
# Torch reference (eager CPU path and oracle)
# --------------------------------------------------------------------------


def torch_int4_channel_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Reference compress: one owned float32 copy of ``x`` padded to whole
    blocks, divided, clamped and rounded in place, cast to int8 codes once
    and packed; the codes of non-finite values are written from ``x``."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    blocks = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    x2d = x.reshape(rows, channels)
    xf = torch.zeros(blocks * BLOCK_ROWS, channels, dtype=torch.float32, device=x.device)
    xf[:rows].copy_(x2d)
    peak = block_absmax(xf, BLOCK_ROWS)
    finite = known_true(torch.isfinite(peak).all(), x)
    flagged = torch.zeros_like(peak, dtype=torch.bool)
    if not finite:
        # isfinite / isinf would allocate |x| in float32; these three do not.
        nonfinite = torch.isnan(xf).logical_or_(torch.isposinf(xf)).logical_or_(torch.isneginf(xf))
        flagged = nonfinite.view(blocks, BLOCK_ROWS, channels).any(dim=1)
        peak = block_absmax(xf.masked_fill_(nonfinite, 0.0), BLOCK_ROWS)
        del nonfinite
    scale = _scales(peak, flagged)
    for view, part in row_blocks(xf, BLOCK_ROWS):
        view.mul_(scale[part].abs().reciprocal().unsqueeze(1)).clamp_(-QMAX, QMAX).round_()
    codes = xf.to(torch.int8)  # |code| <= QMAX: exact
    del xf
    if not finite:
        head = codes[:rows]
        head.masked_fill_(torch.isposinf(x2d), QMAX)
        head.masked_fill_(torch.isneginf(x2d), -QMAX)
        head.masked_fill_(torch.isnan(x2d), -QMAX - 1)
    # uint8 shifts keep the low four bits of each two's-complement code.
    halves = codes.view(torch.uint8).view(blocks, 2, HALF, channels)
    packed = (halves[:, 0] & 15).bitwise_or_(halves[:, 1] << 4)
    return [packed.view(blocks * HALF, channels), scale]


def torch_int4_channel_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Reference decompress: ``code * |scale|``, ±7 as ±Inf and -8 as NaN in
    flagged blocks; one float32 buffer worked in place."""
    shape = _check_decompress(payload, shape, dtype)
    packed, scale = payload
    rows, channels = rows_channels(shape)
    blocks = scale.shape[0]
    halves = packed.view(blocks, 1, HALF, channels)
    # Nibbles n in 0..15 -> (n ^ 8) - 8 in -8..7, all in 8-bit integers.
    codes = torch.cat((halves & 15, halves >> 4), dim=1).bitwise_xor_(8).view(torch.int8).sub_(8)
    codes = codes.view(blocks * BLOCK_ROWS, channels)[:rows]
    v = torch.empty(rows, channels, dtype=torch.float32, device=packed.device)
    v.copy_(codes)
    flagged = scale < 0
    for view, part in row_blocks(v, BLOCK_ROWS):
        view.mul_(scale[part].abs().unsqueeze(1))
    if rows and not known_true(~flagged.any(), scale):
        for (view, part), (q, _) in zip(row_blocks(v, BLOCK_ROWS), row_blocks(codes, BLOCK_ROWS)):
            mark = flagged[part].unsqueeze(1)
            view.masked_fill_((q == QMAX).logical_and_(mark), torch.inf)
            view.masked_fill_((q == -QMAX).logical_and_(mark), -torch.inf)
            view.masked_fill_(q == -QMAX - 1, torch.nan)
    return v.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py)
# --------------------------------------------------------------------------


def _aten_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """`torch_int4_channel_compress` for Inductor (the same payload, bit for
    bit): the maxima and the NaN/Inf counts (one reduction kernel), then the
    codes and their packing (one elementwise kernel reading the stored
    scales)."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    if rows == 0 or channels == 0:
        return torch_int4_channel_compress(x)
    xf = blocked(x.reshape(rows, channels).float(), BLOCK_ROWS)
    a = xf.abs()
    ok = a < float("inf")  # false exactly at NaN and ±Inf
    peak = aten_block_max(torch.where(ok, a, 0.0))
    flagged = aten_block_max(torch.where(ok, 0.0, 1.0)) > 0  # amax of 0/1: NaN never enters
    scale = _scales(peak, flagged)
    q = (xf * written(divide(1.0, scale.abs())).unsqueeze(1)).clamp(-float(QMAX), float(QMAX)).round()
    q = torch.where(q != q, -QMAX - 1.0, q)  # exactly the NaN positions
    halves = q.view(q.shape[0], 2, HALF, channels)
    packed = nibble_bytes(halves[:, 0], halves[:, 1])
    return [packed.view(-1, channels), scale]


def _aten_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """`torch_int4_channel_decompress` for Inductor (the same values): the
    nibbles as int32 fields, the reserved codes as a factor and a select."""
    shape = _check_decompress(payload, shape, dtype)
    rows, channels = rows_channels(shape)
    if rows == 0 or channels == 0:
        return torch_int4_channel_decompress(payload, shape, dtype)
    packed, scale = payload
    blocks = scale.shape[0]
    byte = packed_fields(packed, 8).view(blocks, 1, HALF, channels)
    first = (torch.arange(2, device=packed.device) == 0).view(1, 2, 1, 1)
    nibble = torch.where(first, byte & 15, byte >> 4).float()
    q = torch.where(nibble >= 8.0, nibble - 16.0, nibble).view(blocks, BLOCK_ROWS, channels)
    s = scale.unsqueeze(1)
    v = q * torch.where((s < 0) & (q.abs() > QMAX - 0.5), float("inf"), s.abs())
    v = torch.where(q < -QMAX - 0.5, float("nan"), v)
    return v.view(-1, channels)[:rows].to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _load_half(x_ptr, rows, cols, R, C, stride_r, stride_c):
    valid = (rows < R)[:, None] & (cols < C)[None, :]
    offsets = rows[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_c
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    a = tl.abs(x)
    ok = a < float("inf")
    return x, ok, tl.max(tl.where(ok, a, 0.0), axis=0), tl.max((~ok).to(tl.int32), axis=0)


@triton_jit
def _codes(x, inverse, QMAX_: tl.constexpr):
    y = x * inverse[None, :]
    y = tl.minimum(tl.maximum(y, -QMAX_ * 1.0), QMAX_ * 1.0)
    # Adding then subtracting 1.5 * 2^23 rounds float32 |y| < 2^22 to nearest
    # even, like torch.round (libdevice rint is not available in the interpreter).
    q = ((y + 12582912.0) - 12582912.0).to(tl.int32)
    return tl.where(x != x, -QMAX_ - 1, q)


@triton_jit
def _compress_kernel(
    x_ptr, code_ptr, scale_ptr, R, C, stride_r, stride_c,
    QMAX_: tl.constexpr, MIN_SCALE_: tl.constexpr, HALF_: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # Program (n, j): rows block n (its two halves), channels [j * BLOCK_C, (j + 1) * BLOCK_C).
    first = (tl.program_id(0) * 2 * HALF_ + tl.arange(0, HALF_)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    x_a, ok_a, peak_a, bad_a = _load_half(x_ptr, first, cols, R, C, stride_r, stride_c)
    x_b, ok_b, peak_b, bad_b = _load_half(x_ptr, first + HALF_, cols, R, C, stride_r, stride_c)
    flagged = tl.maximum(bad_a, bad_b) > 0
    limit = tl.where(flagged, QMAX_ - 1.0, QMAX_ * 1.0)
    magnitude = tl.maximum(tl.math.div_rn(tl.maximum(peak_a, peak_b), limit), MIN_SCALE_)
    inverse = tl.math.div_rn(1.0, magnitude)
    byte = (_codes(x_a, inverse, QMAX_) & 15) | ((_codes(x_b, inverse, QMAX_) & 15) << 4)
    out_rows = (tl.program_id(0) * HALF_ + tl.arange(0, HALF_)).to(tl.int64)
    tl.store(code_ptr + out_rows[:, None] * C + cols[None, :], byte.to(tl.uint8), mask=cmask[None, :])
    tl.store(scale_ptr + tl.program_id(0) * C + cols, tl.where(flagged, -magnitude, magnitude), mask=cmask)


@triton_jit
def _store_half(out_ptr, q, scale, rows, cols, R, C, QMAX_: tl.constexpr):
    flagged = (scale < 0)[None, :]
    v = q.to(tl.float32) * tl.abs(scale)[None, :]
    v = tl.where(flagged & (q == QMAX_), float("inf"), v)
    v = tl.where(flagged & (q == -QMAX_), float("-inf"), v)
    v = tl.where(q == -QMAX_ - 1, float("nan"), v)
    valid = (rows < R)[:, None] & (cols < C)[None, :]
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], rne_cast(v, out_ptr.dtype.element_ty), mask=valid)


@triton_jit
def _decompress_kernel(
    code_ptr, scale_ptr, out_ptr, R, C,
    QMAX_: tl.constexpr, HALF_: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    in_rows = (tl.program_id(0) * HALF_ + tl.arange(0, HALF_)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    byte = tl.load(code_ptr + in_rows[:, None] * C + cols[None, :], mask=cmask[None, :], other=0).to(tl.int32)
    scale = tl.load(scale_ptr + tl.program_id(0) * C + cols, mask=cmask, other=0.0)
    first = (tl.program_id(0) * 2 * HALF_ + tl.arange(0, HALF_)).to(tl.int64)
    _store_half(out_ptr, ((byte & 15) ^ 8) - 8, scale, first, cols, R, C, QMAX_)
    _store_half(out_ptr, (((byte >> 4) & 15) ^ 8) - 8, scale, first + HALF_, cols, R, C, QMAX_)


def triton_int4_channel_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_int4_channel_compress` (same bits)."""
    return triton_channel_compress(
        x, codec=NAME, spec=int4_channel_payload_spec, kernel=_compress_kernel,
        QMAX_=QMAX, MIN_SCALE_=MIN_SCALE, HALF_=HALF,
    )  # fmt: skip


def triton_int4_channel_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Triton twin of `torch_int4_channel_decompress` (same bits)."""
    return triton_channel_decompress(
        payload, shape, dtype, codec=NAME, spec=int4_channel_payload_spec, kernel=_decompress_kernel,
        QMAX_=QMAX, HALF_=HALF,
    )  # fmt: skip


# --------------------------------------------------------------------------
# Ops and codec
# --------------------------------------------------------------------------


def _check_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> tuple[Any, ...]:
    return check_channel_payload(payload, shape, dtype, codec=NAME, spec=int4_channel_payload_spec)


int4_channel_compress_op, int4_channel_decompress_op = register_dispatched_ops(
    NAME,
    dtypes=DTYPES,
    payload_spec=int4_channel_payload_spec,
    torch_impl=(torch_int4_channel_compress, torch_int4_channel_decompress),
    triton_impl=(triton_int4_channel_compress, triton_int4_channel_decompress),
)


class Int4ChannelCodec(ChannelCodec):
    """int4 with one scale per channel and block of 32 rows (see module
    docstring); like int4_outlier, offered for the inputs of linear layers only."""

    def __init__(self) -> None:
        super().__init__(
            NAME, 0.16, int4_channel_payload_spec, (_aten_compress, _aten_decompress)
        )

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Scratch bytes. The Triton kernels need none. The torch reference,
        on P = R x C padded to whole blocks: compress holds its float32 copy
        (4P), then the int8 codes (P) and with NaN/Inf the masks (P each, two
        at a time), then the packing's two half-size temporaries; decompress
        the unpacked codes (2P while unpacking, then P, beside which one mask
        at a time) and, for a half-precision result, its float32 buffer."""
        if triton:
            return Workspace()
        rows, channels = rows_channels(shape)
        blocks = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        padded = blocks * BLOCK_ROWS * channels
        per_block = 16 * blocks * channels + _SMALL
        buffer = 0 if dtype == torch.float32 else 4 * rows * channels
        compress = 4 * padded + 2 * padded + per_block
        decompress = 2 * padded + buffer + per_block
        return Workspace(compress=compress, decompress=decompress)


INT4_CHANNEL = REGISTRY.register(Int4ChannelCodec())
