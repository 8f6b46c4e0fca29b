"""Codec "int8_smooth": int8 codes, one scale per row (token), channels
smoothed by power-of-two factors.

Why: a per-row (per-token) scale is the one statistic Inductor computes at
about a copy's cost: it fuses a row's maximum and its codes into one loop
over the row while the row is in cache (measured in-graph: ~1.0-1.2x a copy
of the value, against ~2x for `int8_channel`'s per-channel-block scales,
which need a separate pass over the rows, and ~6x for `int8_outlier`). But
activation outliers live in channels (a few channels 10-100x larger than
the rest), and one such channel would set every row's scale. So each
channel c is first divided by a factor ``f[c] = 2^k[c] >= 1`` that brings
outlier channels down to the typical range (SmoothQuant's idea); powers of
two make the division and the multiplication back exact. The factors depend
on channel maxima over all rows; measured on the calibration batch
(`Int8SmoothCodec.calibration_parameters`) they are a constant of the
compiled graph (``parameters`` of `aten_compress`) and the compress reads
the value once; without them the compress measures them on the value itself
(one more pass).

Layout: ``x`` is viewed as R rows x C channels (C = last dim; a 0-d tensor
is 1 x 1). The payload::

    [0] codes    int8     [R, C]
    [1] scales   float32  [R]     one per row
    [2] factors  float32  [C]     f[c] = 2^k[c], 0 <= k[c] <= KMAX

Every size depends on the shape alone: R C + 4 R + 4 C bytes.

Factors (`channel_maxima`, `channel_factors`: the same torch glue for every
path, so all paths agree bit for bit): ``m_c`` the largest finite |x| of
channel c over all rows (exact anywhere: a maximum does not depend on the
order), ``ref`` the lower median of the ``m_c`` (element (C - 1) // 2 of
them sorted), and ``k[c] = ceil(log2(m_c / (RATIO ref)))`` clamped to
[0, KMAX] (0 where ``ref`` is 0), with RATIO = 4: a channel up to 4x the
median keeps factor 1, one 64x the median gets 2^4 (ratio 16 -> 4). The
ceil(log2) is read from the float32 bits of the ratio (exponent, plus one
if any mantissa bit is set), never from ``log2``, whose last bit differs
between backends; ``f`` is built from its bits too.

Codes: ``y = x * (1 / f[c])`` (exact: a power of two), ``m_r`` the largest
finite |y| of row r, ``scale_r = max(m_r / 126, 2^-126)`` and ``code =
round_half_even(clamp(y * (1 / scale_r), -127, 127))``, the reciprocal
computed once per row: exactly `int8_channel`'s scheme, so finite values
land in -126..126 and the codes -128, -127 and 127 are NaN, -Inf and +Inf.
Decompress: ``code * scale_r * f[c]`` (the last product exact), the
reserved codes as NaN/±Inf. (A value below 2^-126 f[c] in an outlier
channel goes subnormal when divided; that is the one place where the
division by f is not exact, and the loss is below 2^-149 f[c] anyway.)

Error: each code is within half a step (m_r / 252) of its y, so over a
row of C values whose largest |y| is m_r the relative error, measured in
the smoothed units y, is at most sqrt(C) / 252 whatever the input (a row
with one value at m_r and the rest just under half a step): 0.13 for
C = 1024, 0.25 for C = 4096. Unlike `int8_channel`'s fixed block of 64 rows
(0.032), the worst case grows with C, and so does the typical error of
heavy-tailed rows (one element sets the row's scale); a channel multiplied
back by f > 1 keeps its error relative to its own, larger values. Measured
(tests/kernels/test_int8_smooth.py; 256 rows of 512 channels unless said;
`int8_channel` in brackets): gaussian 0.0075 (0.0060), layer norm 0.0078,
GELU 0.0109 (0.0082), SiLU 0.0112, llm-like rows with outlier channels at
20-30x 0.0066-0.0075 (0.0045), 0.0095 with 4096 channels, outlier channels
at 10-100x of 1024 channels 0.0053; heavy tails: Student-t rows nu = 3
0.019 (0.011), 0.032 with 4096 channels; nu = 2 0.022-0.028 (0.013), 0.045
with 4096 channels. Declared 0.05 (`ERROR_BOUND`), above every measured
case: light-tailed and channel-outlier activations stay near 0.01, but
element-wise heavy tails exceed the 0.015 of `int8_channel` / `int8_outlier`
at every width, so it is an "aggressive" codec, not a "balanced" one (the
calibrate pass still drops it wherever a real value measures above 0.05).
Offered where `int8_channel` is (inputs of linear layers only:
`ChannelCodec.applies`).

Triton: without calibrated factors, the channel maxima by one kernel (a
program per block of channels looping over the rows) and the factors by the
torch glue on those C numbers; then one program per block of whole rows
(`oplib.row_tile`) takes each row's maximum and writes its codes from the
same registers, so with calibrated factors the value is read once (rows
wider than `oplib.ONE_PASS_MAX_COLUMNS` are read twice: maxima, then
codes); the decompress is elementwise. `tests/kernels/test_kernel_traffic.py`
counts the reads and writes.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import REGISTRY
from .aten_graphs import divide, int8_values, written
from .int_channel import DTYPES, MIN_SCALE, QMAX, ChannelCodec, check_channel_payload
from .oplib import (
    div_exact,
    PayloadSpec,
    Workspace,
    check_input,
    known_true,
    launch,
    register_dispatched_ops,
    require_triton,
    rne_cast,
    row_tile,
    rows_channels,
    tl,
    triton_jit,
)

NAME = "int8_smooth"
_SCALE_DTYPE = torch.float32
#: A channel keeps factor 1 up to RATIO times the median channel maximum.
RATIO = 4.0
#: Largest exponent of a factor: f <= 2^KMAX (its reciprocal stays normal).
KMAX = 64
_SMALL = 256
#: Declared relative error (see the module docstring for the measurements).
ERROR_BOUND = 0.05
#: Triton tiles: rows per compress program, channels per loaded chunk.
_BLOCK_ROWS = 16
_BLOCK_CHANNELS = 128


def int8_smooth_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """Shapes and dtypes of [codes, scales, factors] (see module docstring)."""
    rows, channels = rows_channels(shape)
    return [((rows, channels), torch.int8), ((rows,), _SCALE_DTYPE), ((channels,), _SCALE_DTYPE)]


# --------------------------------------------------------------------------
# Factors: the glue every path shares (plain functional torch ops)
# --------------------------------------------------------------------------


def channel_maxima(x: torch.Tensor) -> torch.Tensor:
    """Largest finite |x| per channel (last dim) over all rows, float32 [C];
    NaN and ±Inf are ignored, and a channel with no finite value (or no
    rows) gives 0. Functional ops only: it runs inside traced graphs."""
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    if rows == 0:
        return torch.zeros(channels, dtype=torch.float32, device=x.device)
    a = x2d.float().abs()
    return torch.where(a < float("inf"), a, 0.0).amax(dim=0)


def channel_factors(maxima: torch.Tensor) -> torch.Tensor:
    """Power-of-two factors ``2^k`` (float32 [C]) of channels whose largest
    finite |x| are ``maxima`` (see module docstring): ``k = ceil(log2(m /
    (RATIO ref)))`` clamped to [0, KMAX], ``ref`` the lower median of the
    maxima, k = 0 where ``ref`` is 0. Exact on every backend: the ceil(log2)
    comes from the ratio's float32 bits, the factor is built from bits."""
    channels = maxima.shape[0]
    maxima = maxima.float()
    if channels == 0:
        return torch.ones(0, dtype=torch.float32, device=maxima.device)
    ref = torch.sort(maxima).values[(channels - 1) // 2]
    ratio = divide(maxima, ref * RATIO)
    bits = ratio.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    k = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # ceil(log2(ratio)); NaN is masked below
    k = torch.where((ref > 0) & (ref < float("inf")), k.clamp(0, KMAX), 0)
    return ((k + 127) << 23).view(torch.float32)


def _check_factors(factors: torch.Tensor, channels: int, device: torch.device) -> torch.Tensor:
    if not isinstance(factors, torch.Tensor) or factors.dtype != torch.float32:
        raise TypeError(f"{NAME}: factors must be a float32 tensor, got {getattr(factors, 'dtype', type(factors))}")
    if tuple(factors.shape) != (channels,):
        raise ValueError(f"{NAME}: factors have shape {tuple(factors.shape)}, expected ({channels},)")
    if factors.device != device:
        raise ValueError(f"{NAME}: factors on {factors.device}, value on {device}")
    return factors


def scales_of(peak: torch.Tensor) -> torch.Tensor:
    """Scales from the rows' largest finite |y| (float32 [R])."""
    return torch.clamp_min(divide(peak, float(QMAX)), MIN_SCALE)


# --------------------------------------------------------------------------
# Torch reference (eager CPU path and oracle)
# --------------------------------------------------------------------------


def torch_int8_smooth_compress(x: torch.Tensor, factors: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Reference compress: one owned float32 copy of ``x``, its non-finite
    values zeroed in place (``nan_to_num_``) when there are any, divided by
    the factors, scaled, clamped and rounded in place, then cast once; the
    codes of the non-finite values are written afterwards from ``x``.

    ``factors``: float32 [C] (e.g. `Int8SmoothCodec.calibration_parameters`
    of another value); None measures them on ``x`` (`channel_factors` of
    its channel maxima, taken here without a temporary of ``x``'s size)."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    if factors is not None:
        factors = _check_factors(factors, channels, x.device)
    xf = torch.empty(rows, channels, dtype=torch.float32, device=x.device)
    xf.copy_(x2d)
    finite, maxima = True, None
    if rows and channels:
        maxima = _absmax(xf, dim=0, size=channels)  # NaN / Inf where a channel holds them
        finite = known_true(torch.isfinite(maxima).all(), x)
        if not finite:
            xf.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            maxima = None
    if factors is None:
        factors = channel_factors(_absmax(xf, dim=0, size=channels) if maxima is None else maxima)
    xf.mul_(factors.reciprocal())
    scale = scales_of(_absmax(xf, dim=1, size=rows))
    xf.mul_(scale.reciprocal().unsqueeze(1)).clamp_(-QMAX, QMAX).round_()
    codes = xf.to(torch.int8)  # |code| <= QMAX: exact
    del xf
    if not finite:
        codes.masked_fill_(torch.isposinf(x2d), QMAX + 1)
        codes.masked_fill_(torch.isneginf(x2d), -QMAX - 1)
        codes.masked_fill_(torch.isnan(x2d), -QMAX - 2)
    return [codes, scale, factors]


def _absmax(xf: torch.Tensor, *, dim: int, size: int) -> torch.Tensor:
    """Largest |x| of a finite [R, C] float32 tensor along ``dim`` (0 where
    empty), with no temporary of its size."""
    if xf.numel() == 0:
        return torch.zeros(size, dtype=torch.float32, device=xf.device)
    low, high = torch.aminmax(xf, dim=dim)
    return torch.maximum(high, low.neg_()).abs_()


def torch_int8_smooth_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Reference decompress: ``code * scale * factor``, the reserved codes
    as NaN/±Inf; one float32 buffer worked in place."""
    shape = _check_decompress(payload, shape, dtype)
    codes, scale, factors = payload
    rows, channels = rows_channels(shape)
    v = torch.empty(rows, channels, dtype=torch.float32, device=codes.device)
    v.copy_(codes.reshape(rows, channels))
    v.mul_(scale.reshape(rows, 1)).mul_(factors.reshape(channels))
    if rows and channels and not known_true((codes.amin() >= -QMAX) & (codes.amax() <= QMAX), codes):
        codes2d = codes.reshape(rows, channels)
        v.masked_fill_(codes2d == QMAX + 1, torch.inf)
        v.masked_fill_(codes2d == -QMAX - 1, -torch.inf)
        v.masked_fill_(codes2d == -QMAX - 2, torch.nan)
    return v.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py)
# --------------------------------------------------------------------------


def _aten_compress(x: torch.Tensor, parameters: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`torch_int8_smooth_compress` for Inductor (the same payload, bit for
    bit). With ``parameters`` (the factors) one pass over ``x``: each row's
    maximum and its codes, which Inductor fuses into one loop over the row;
    without, the channel maxima (a reduction over the rows) first."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    if parameters is not None:
        parameters = _check_factors(parameters, channels, x.device)
    if rows == 0 or channels == 0:
        return torch_int8_smooth_compress(x, parameters)
    x2d = x.reshape(rows, channels)
    factors = channel_factors(channel_maxima(x2d)) if parameters is None else parameters
    y = x2d.float() * written(divide(1.0, factors))  # exact: powers of two
    a = y.abs()
    scale = scales_of(torch.where(a < float("inf"), a, 0.0).amax(dim=1))
    # ±Inf times a (finite) reciprocal stay ±Inf and clamp to the ±Inf codes; NaN stays NaN.
    q = (y * written(divide(1.0, scale)).unsqueeze(1)).clamp(-QMAX - 1.0, QMAX + 1.0).round()
    codes = torch.where(q != q, -QMAX - 2.0, q).to(torch.int8)
    return [codes, scale, factors]


def _aten_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """`torch_int8_smooth_decompress` for Inductor (the same values): the
    reserved codes as a factor, ``code * (inf if |code| > QMAX else scale)
    * f``, and one select for NaN."""
    shape = _check_decompress(payload, shape, dtype)
    rows, channels = rows_channels(shape)
    if rows == 0 or channels == 0:
        return torch_int8_smooth_decompress(payload, shape, dtype)
    codes, scale, factors = payload
    q = int8_values(codes.reshape(rows, channels))
    v = q * torch.where(q.abs() > QMAX + 0.5, float("inf"), scale.reshape(rows, 1)) * factors.reshape(channels)
    v = torch.where(q < -QMAX - 1.5, float("nan"), v)
    return v.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _channel_max_kernel(
    x_ptr, out_ptr, R, C, stride_r, stride_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # Program j: channels [j * BLOCK_C, (j + 1) * BLOCK_C), all rows.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    col_off = cols.to(tl.int64)[None, :] * stride_c
    peak = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        valid = (rows < R)[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_r + col_off, mask=valid, other=0.0).to(tl.float32)
        a = tl.abs(x)
        peak = tl.maximum(peak, tl.max(tl.where(a < float("inf"), a, 0.0), axis=0))
    tl.store(out_ptr + cols, peak, mask=cmask)


@triton_jit
def _smooth_codes(x, inv_f, inv_s, QMAX_: tl.constexpr):
    # int8 codes of x (float32) smoothed by 1 / f, scaled by 1 / s per row.
    y = (x * inv_f[None, :]) * inv_s[:, None]
    y = tl.minimum(tl.maximum(y, -QMAX_ - 1.0), QMAX_ + 1.0)
    # Adding then subtracting 1.5 * 2^23 rounds float32 |y| < 2^22 to nearest
    # even, like torch.round (libdevice rint is not available in the interpreter).
    q = ((y + 12582912.0) - 12582912.0).to(tl.int32)
    return tl.where(x != x, -QMAX_ - 2, q).to(tl.int8)


@triton_jit
def _smoothed_tile(x_ptr, factor_ptr, rows, rmask, c0, C, stride_r, stride_c, BLOCK_C: tl.constexpr):
    # Channels [c0, c0 + BLOCK_C) of ``rows`` as float32, with 1 / f of each
    # channel, the channels and the mask of the tile.
    cols = c0 + tl.arange(0, BLOCK_C)
    cmask = cols < C
    valid = rmask[:, None] & cmask[None, :]
    offsets = rows[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_c
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    inv_f = div_exact(1.0, tl.load(factor_ptr + cols, mask=cmask, other=1.0))
    return x, inv_f, cols, valid


@triton_jit
def _row_peak(x, inv_f):
    # The largest finite |x / f| of each row of a tile.
    a = tl.abs(x * inv_f[None, :])
    return tl.max(tl.where(a < float("inf"), a, 0.0), axis=1)


@triton_jit
def _compress_kernel(
    x_ptr, factor_ptr, code_ptr, scale_ptr, R, C, stride_r, stride_c,
    QMAX_: tl.constexpr, MIN_SCALE_: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    ONE_PASS: tl.constexpr,
):  # fmt: skip
    # Program n: rows [n * BLOCK_R, (n + 1) * BLOCK_R), all channels. Rows
    # that fit one block (ONE_PASS) are read once, the row maxima and the
    # codes from the same registers; wider rows twice (maxima, then codes).
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    if ONE_PASS:
        x, inv_f, cols, valid = _smoothed_tile(x_ptr, factor_ptr, rows, rmask, 0, C, stride_r, stride_c, BLOCK_C)
        scale = tl.maximum(div_exact(_row_peak(x, inv_f), QMAX_ * 1.0), MIN_SCALE_)
        tl.store(scale_ptr + rows, scale, mask=rmask)
        q = _smooth_codes(x, inv_f, div_exact(1.0, scale), QMAX_)
        tl.store(code_ptr + rows[:, None] * C + cols[None, :], q, mask=valid)
    else:
        peak = tl.zeros([BLOCK_R], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            x, inv_f, cols, valid = _smoothed_tile(x_ptr, factor_ptr, rows, rmask, c0, C, stride_r, stride_c, BLOCK_C)
            peak = tl.maximum(peak, _row_peak(x, inv_f))
        scale = tl.maximum(div_exact(peak, QMAX_ * 1.0), MIN_SCALE_)
        inv_s = div_exact(1.0, scale)
        tl.store(scale_ptr + rows, scale, mask=rmask)
        for c0 in range(0, C, BLOCK_C):
            x, inv_f, cols, valid = _smoothed_tile(x_ptr, factor_ptr, rows, rmask, c0, C, stride_r, stride_c, BLOCK_C)
            q = _smooth_codes(x, inv_f, inv_s, QMAX_)
            tl.store(code_ptr + rows[:, None] * C + cols[None, :], q, mask=valid)


@triton_jit
def _decompress_kernel(
    code_ptr, scale_ptr, factor_ptr, out_ptr, R, C,
    QMAX_: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < R
    cmask = cols < C
    valid = rmask[:, None] & cmask[None, :]
    offsets = rows[:, None] * C + cols[None, :]
    q = tl.load(code_ptr + offsets, mask=valid, other=0).to(tl.int32)
    scale = tl.load(scale_ptr + rows, mask=rmask, other=0.0)
    factor = tl.load(factor_ptr + cols, mask=cmask, other=1.0)
    v = (q.to(tl.float32) * scale[:, None]) * factor[None, :]
    v = tl.where(q == QMAX_ + 1, float("inf"), v)
    v = tl.where(q == -QMAX_ - 1, float("-inf"), v)
    v = tl.where(q == -QMAX_ - 2, float("nan"), v)
    tl.store(out_ptr + offsets, rne_cast(v, out_ptr.dtype.element_ty), mask=valid)


def triton_channel_maxima(x: torch.Tensor) -> torch.Tensor:
    """`channel_maxima` by a Triton kernel (the same values: a maximum is
    exact), with no temporary of ``x``'s size and no host sync."""
    require_triton(x, _channel_max_kernel)
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    out = torch.zeros(channels, dtype=torch.float32, device=x.device)
    if rows and channels:
        grid = ((channels + _BLOCK_CHANNELS - 1) // _BLOCK_CHANNELS,)
        launch(
            _channel_max_kernel, grid, x2d, out, rows, channels, x2d.stride(0), x2d.stride(1),
            BLOCK_R=_BLOCK_ROWS, BLOCK_C=_BLOCK_CHANNELS,
        )  # fmt: skip
    return out


def triton_int8_smooth_compress(x: torch.Tensor, factors: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Triton twin of `torch_int8_smooth_compress` (same bits)."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    require_triton(x, _compress_kernel, _channel_max_kernel)
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    if factors is None:
        factors = channel_factors(triton_channel_maxima(x2d))
    else:
        factors = _check_factors(factors, channels, x.device).contiguous()
    (code_spec, code_dtype), (scale_spec, scale_dtype), _ = int8_smooth_payload_spec(x.shape, x.dtype)
    codes = torch.empty(code_spec, dtype=code_dtype, device=x.device)
    scale = torch.empty(scale_spec, dtype=scale_dtype, device=x.device)
    if rows and channels:
        t = row_tile(rows, channels)
        launch(
            _compress_kernel, ((rows + t.rows - 1) // t.rows,), x2d, factors, codes, scale, rows, channels,
            x2d.stride(0), x2d.stride(1), QMAX_=QMAX, MIN_SCALE_=MIN_SCALE, BLOCK_R=t.rows,
            BLOCK_C=t.block_cols, ONE_PASS=t.one_pass, num_warps=t.num_warps,
        )  # fmt: skip
    else:
        scale.fill_(MIN_SCALE)
    return [codes, scale, factors]


def triton_int8_smooth_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Triton twin of `torch_int8_smooth_decompress` (same bits)."""
    shape = _check_decompress(payload, shape, dtype)
    codes, scale, factors = (t.contiguous() for t in payload)
    require_triton(codes, _decompress_kernel)
    rows, channels = rows_channels(shape)
    out = torch.empty(rows, channels, dtype=dtype, device=codes.device)
    if rows and channels:
        grid = ((rows + _BLOCK_ROWS - 1) // _BLOCK_ROWS, (channels + _BLOCK_CHANNELS - 1) // _BLOCK_CHANNELS)
        launch(
            _decompress_kernel, grid, codes, scale, factors, out, rows, channels,
            QMAX_=QMAX, BLOCK_R=_BLOCK_ROWS, BLOCK_C=_BLOCK_CHANNELS,
        )  # fmt: skip
    return out.reshape(shape)


# --------------------------------------------------------------------------
# Ops and codec
# --------------------------------------------------------------------------


def _check_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> tuple[Any, ...]:
    return check_channel_payload(payload, shape, dtype, codec=NAME, spec=int8_smooth_payload_spec)


int8_smooth_compress_op, int8_smooth_decompress_op = register_dispatched_ops(
    NAME,
    dtypes=DTYPES,
    payload_spec=int8_smooth_payload_spec,
    torch_impl=(torch_int8_smooth_compress, torch_int8_smooth_decompress),
    triton_impl=(triton_int8_smooth_compress, triton_int8_smooth_decompress),
)


class Int8SmoothCodec(ChannelCodec):
    """int8 with one scale per row, channels smoothed by power-of-two
    factors (see module docstring). Applies where `int8_channel` does
    (`ChannelCodec.applies`: inputs of linear layers, no channels-first
    values, payload smaller than the value)."""

    def __init__(self) -> None:
        super().__init__(NAME, ERROR_BOUND, int8_smooth_payload_spec, (_aten_compress, _aten_decompress))

    def calibration_parameters(self, x: torch.Tensor) -> torch.Tensor:
        """The factors of ``x``'s channels, float32 [C] on ``x``'s device."""
        check_input(x, codec=NAME, dtypes=DTYPES)
        return channel_factors(channel_maxima(x.detach()))

    def triton_calibrated_compress(self, x: torch.Tensor, parameters: torch.Tensor) -> list[torch.Tensor]:
        """`triton_int8_smooth_compress` with the calibrated factors: one read of ``x``."""
        return triton_int8_smooth_compress(x, parameters)

    def aten_compress(self, x: torch.Tensor, parameters: torch.Tensor | None = None) -> list[torch.Tensor]:
        """See `_aten_compress`; ``parameters`` are the factors, passed
        through as the payload's third tensor."""
        return _aten_compress(x, parameters)

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Scratch bytes. The Triton kernels need none of the value's size:
        the channel maxima and the factors' sort (values and int64 indices)
        take a few bytes per channel. The torch reference, on P = R x C
        elements: compress holds its float32 copy (4P; non-finite values
        are zeroed in it in place) and, beside the codes, one mask at a
        time (P); decompress its float32 buffer (4P; the result itself for
        float32 output) and one mask at a time (P). Compress adds a few
        float32 tensors per row and channel."""
        rows, channels = rows_channels(shape)
        small = 24 * channels + 16 * rows + _SMALL  # maxima, the sort's values and indices, factors; scales
        if triton:
            return Workspace(compress=small)
        numel = rows * channels
        buffer = 0 if dtype == torch.float32 else 4 * numel
        return Workspace(compress=5 * numel + small, decompress=buffer + numel + _SMALL)


INT8_SMOOTH = REGISTRY.register(Int8SmoothCodec())
