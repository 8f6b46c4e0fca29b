"""Codec "int8_channel": int8 codes, one scale per channel and block of 64 rows.

Why: `int8_outlier` quantises groups of 64 *neighbouring channels* of a row
and keeps the few outlier channels exact. That needs the channel statistics
of all rows before any group is quantised (two full passes over the value),
a horizontal reduction per group and a gather of the outlier channels, and
Inductor's CPU code for it runs at 5-7x a copy of the value
(bench/RESULTS.md). Here each scale covers one channel over a block of rows
instead. Outliers stop mattering by construction: activation outliers live in
channels (a few channels 10-100x larger than the rest), and every channel has
its own scales, so a strong channel never costs its neighbours resolution.
And every step is vertical: a block's maxima are an elementwise maximum over
its rows, vectorised over channels, and its codes one product with the
reciprocals of the block's row of scales, elementwise.

Layout: ``x`` is viewed as R rows x C channels (C = last dim; a 0-d tensor is
1 x 1), with B = 64 rows per block and N = ceil(R / B) blocks. The payload::

    [0] codes   int8     [R, C]
    [1] scales  float32  [N, C]   block n, channel c: rows [n B, (n + 1) B)

Every size depends on the shape alone (the planner needs that before data).
Float32 scales cost 1/16 byte per element (bfloat16 ones would save half of
that, but a bfloat16 row broadcast over a block's rows is a gather in
Inductor's C++, which leaves the decompress loop scalar: 24x slower, measured).

Codes: ``scale = max(m / 126, 2^-126)`` with m the block's largest finite
|x| in that channel, and ``code = round_half_even(clamp(x * (1 / scale), -127, 127))``:
finite values land in -126..126, so the codes -128, -127 and 127 are free
for NaN, -Inf and +Inf, in every block, with no flag and no extra byte
(an infinite product clamps to ±127 by itself; NaN is one select). Giving
up one level of 127 costs 0.8% of the resolution. The floor keeps the
reciprocal of a scale finite; a block whose values are all below
126 * 2^-126 (1.5e-36) in magnitude is stored at that resolution.
The reciprocal is computed once per block and channel and correctly
rounded wherever it runs (torch; Inductor through `aten_graphs.divide`,
float64 on a GPU; Triton through `oplib.div_exact`), and the product is
one float32 multiply, so the three give the same codes bit for bit (on an
H200 too, `bench/gpu_check.py`); a division per element cost more than
the rest of the codes loop in Inductor's AVX512 code (`bench/RESULTS.md`).

Error: in one (block, channel) of n <= 64 values with largest magnitude m,
each code is within half a step (m / 252) of its value, so the relative
error of the tensor can never exceed sqrt(64) / 252 = 0.032 whatever the
input. Measured (tests/kernels/test_int_channel.py, bench/bench_codec_error.py)
it is far lower; declared 0.015 like `int8_outlier`, so that both serve the
"balanced" accuracy mode and the planner picks between them by cost where
both apply: int8_channel is offered for the inputs of linear layers only
(see `ChannelCodec.applies`), int8_outlier for any float activation.

Triton: one program per block of rows and 64 channels does the whole
compress in registers (maxima and codes), one more the decompress.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from . import REGISTRY
from .aten_graphs import divide, int8_values, written
from .codec import ApplyQuery
from .int_outlier import ACTIVATION_PRODUCERS
from .oplib import (
    div_exact,
    OpCodec,
    PayloadSpec,
    Workspace,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    known_true,
    launch,
    numel_of,
    register_dispatched_ops,
    require_triton,
    rne_cast,
    rows_channels,
    tl,
    triton_jit,
)

#: A payload spec: (shape, dtype) -> [(shape, dtype) of codes, of scales].
SpecFn = Callable[[Sequence[Any], torch.dtype], PayloadSpec]
NAME = "int8_channel"
#: Input dtypes of the per-channel codecs.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SCALE_DTYPE = torch.float32
#: Rows per block sharing one scale per channel.
BLOCK_ROWS = 64
#: Largest code of a finite value; QMAX + 1 (= 127) and -QMAX - 1 are ±Inf, -QMAX - 2 NaN.
QMAX = 126
#: Smallest scale: the smallest normal float32, whose reciprocal is finite.
MIN_SCALE = 2.0**-126
#: Producer op classes whose outputs it is offered for (annotate pass names).
#: Ops whose values are laid out channels first (NCHW): see `ChannelCodec.applies`.
_CHANNELS_FIRST_OPS = ("convolution", "batch_norm", "pool")
_BLOCK_CHANNELS = 64
#: Rows per sub-block of the aten form's two-stage maxima (see `aten_block_max`).
_SUB_ROWS = 8
_SMALL = 256


def int8_channel_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """Shapes and dtypes of [codes, scales] (see module docstring)."""
    rows, channels = rows_channels(shape)
    blocks = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    return [((rows, channels), torch.int8), ((blocks, channels), _SCALE_DTYPE)]


def scales_of(peak: torch.Tensor) -> torch.Tensor:
    """Scales from the blocks' largest finite |x| (float32 [N, C])."""
    return torch.clamp_min(divide(peak, float(QMAX)), MIN_SCALE)


# --------------------------------------------------------------------------
# Torch reference (eager CPU path and oracle)
# --------------------------------------------------------------------------


def row_blocks(t2d: torch.Tensor, block: int = BLOCK_ROWS) -> list[tuple[torch.Tensor, slice]]:
    """A [R, C] tensor as its whole blocks ``[R // B, B, C]`` and its last
    partial block ``[1, R % B, C]`` (views), each with its rows of the
    [N, C] scales: the reference works block by block, without padding."""
    rows, channels = t2d.shape
    whole = rows // block
    parts = []
    if whole:
        parts.append((t2d[: whole * block].view(whole, block, channels), slice(0, whole)))
    if rows % block:
        parts.append((t2d[whole * block :].unsqueeze(0), slice(whole, whole + 1)))
    return parts


def block_absmax(t2d: torch.Tensor, block: int = BLOCK_ROWS) -> torch.Tensor:
    """Largest |x| per block and channel, float32 [N, C] (NaN where a block
    holds a NaN), with no temporary of the input's size."""
    maxima = [torch.zeros(0, t2d.shape[1], dtype=torch.float32, device=t2d.device)]
    for view, _ in row_blocks(t2d, block):
        low, high = torch.aminmax(view, dim=1)
        maxima.append(torch.maximum(high, low.neg_()).abs_())
    return torch.cat(maxima)


def torch_int8_channel_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Reference compress: one owned float32 copy of ``x``, divided, clamped
    and rounded in place block by block, then cast once.

    The block maxima are taken first; where they are all finite, so is
    ``x`` (the usual case). Otherwise the copy's non-finite values are
    zeroed for the maxima, and their codes are written afterwards from ``x``.
    """
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    xf = torch.empty(rows, channels, dtype=torch.float32, device=x.device)
    xf.copy_(x2d)
    peak = block_absmax(xf)
    finite = known_true(torch.isfinite(peak).all(), x)
    if not finite:
        # isfinite / isinf would allocate |x| in float32; these three do not.
        nonfinite = torch.isnan(xf).logical_or_(torch.isposinf(xf)).logical_or_(torch.isneginf(xf))
        peak = block_absmax(xf.masked_fill_(nonfinite, 0.0))
        del nonfinite
    scale = scales_of(peak)
    for view, blocks in row_blocks(xf):
        view.mul_(scale[blocks].reciprocal().unsqueeze(1)).clamp_(-QMAX, QMAX).round_()
    codes = xf.to(torch.int8)  # |code| <= QMAX: exact
    del xf
    if not finite:
        codes.masked_fill_(torch.isposinf(x2d), QMAX + 1)
        codes.masked_fill_(torch.isneginf(x2d), -QMAX - 1)
        codes.masked_fill_(torch.isnan(x2d), -QMAX - 2)
    return [codes, scale]


def torch_int8_channel_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Reference decompress: ``code * scale``, the reserved codes as NaN/±Inf;
    one float32 buffer worked in place block by block."""
    shape = _check_decompress(payload, shape, dtype)
    codes, scale = payload
    rows, channels = rows_channels(shape)
    v = torch.empty(rows, channels, dtype=torch.float32, device=codes.device)
    v.copy_(codes)
    for view, blocks in row_blocks(v):
        view.mul_(scale[blocks].unsqueeze(1))
    if rows and channels and not known_true((codes.amin() >= -QMAX) & (codes.amax() <= QMAX), codes):
        v.masked_fill_(codes == QMAX + 1, torch.inf)
        v.masked_fill_(codes == -QMAX - 1, -torch.inf)
        v.masked_fill_(codes == -QMAX - 2, torch.nan)
    return v.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py): the reference's
# arithmetic in functional float ops, cast to int8 once at the end.
# --------------------------------------------------------------------------


def blocked(x2d: torch.Tensor, block: int = BLOCK_ROWS) -> torch.Tensor:
    """[R, C] -> [N, B, C], zero rows appended to whole blocks (Inductor
    folds the padding into the kernels' indexing)."""
    rows, channels = x2d.shape
    blocks = (rows + block - 1) // block
    if blocks * block != rows:
        x2d = F.pad(x2d, (0, 0, 0, blocks * block - rows))
    return x2d.reshape(blocks, block, channels)


def aten_block_max(values: torch.Tensor) -> torch.Tensor:
    """Largest value per block and channel of a [N, B, C] tensor (no NaN),
    in two stages: Inductor's CPU code for a reduction over rows walks one
    column strip through all of them, a cache line per row; over sub-blocks
    of 8 rows, then over the sub-blocks, it runs at half the time (measured:
    1.2x a copy of the value instead of 2.3x)."""
    blocks, rows, channels = values.shape
    return values.view(blocks, rows // _SUB_ROWS, _SUB_ROWS, channels).amax(dim=2).amax(dim=1)


def _aten_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """`torch_int8_channel_compress` for Inductor (the same payload, bit for
    bit): the maxima (one reduction kernel), then the codes (one
    elementwise kernel dividing by the stored scales)."""
    check_input(x, codec=NAME, dtypes=DTYPES)
    rows, channels = rows_channels(x.shape)
    if rows == 0 or channels == 0:
        return torch_int8_channel_compress(x)
    xf = blocked(x.reshape(rows, channels).float())
    a = xf.abs()
    scale = scales_of(aten_block_max(torch.where(a < float("inf"), a, 0.0)))
    # ±Inf times a (finite) reciprocal stay ±Inf and clamp to the ±Inf codes; NaN stays NaN.
    q = (xf * written(divide(1.0, scale)).unsqueeze(1)).clamp(-QMAX - 1.0, QMAX + 1.0).round()
    codes = torch.where(q != q, -QMAX - 2.0, q).to(torch.int8)
    return [codes.view(-1, channels)[:rows], scale]


def _aten_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """`torch_int8_channel_decompress` for Inductor (the same values): the
    reserved codes as a factor, ``code * (inf if |code| > QMAX else scale)``,
    and one select for NaN."""
    shape = _check_decompress(payload, shape, dtype)
    rows, channels = rows_channels(shape)
    if rows == 0 or channels == 0:
        return torch_int8_channel_decompress(payload, shape, dtype)
    codes, scale = payload
    q = blocked(int8_values(codes))
    v = q * torch.where(q.abs() > QMAX + 0.5, float("inf"), scale.unsqueeze(1))
    v = torch.where(q < -QMAX - 1.5, float("nan"), v)
    return v.view(-1, channels)[:rows].to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _compress_kernel(
    x_ptr, code_ptr, scale_ptr, R, C, stride_r, stride_c,
    QMAX_: tl.constexpr, MIN_SCALE_: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # Program (n, j): rows block n, channels [j * BLOCK_C, (j + 1) * BLOCK_C).
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    valid = (rows < R)[:, None] & cmask[None, :]
    offsets = rows[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_c
    x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
    a = tl.abs(x)
    amax = tl.max(tl.where(a < float("inf"), a, 0.0), axis=0)
    scale = tl.maximum(div_exact(amax, QMAX_ * 1.0), MIN_SCALE_)
    y = x * div_exact(1.0, scale)[None, :]
    y = tl.minimum(tl.maximum(y, -QMAX_ - 1.0), QMAX_ + 1.0)
    # Adding then subtracting 1.5 * 2^23 rounds float32 |y| < 2^22 to nearest
    # even, like torch.round (libdevice rint is not available in the interpreter).
    q = ((y + 12582912.0) - 12582912.0).to(tl.int32)
    q = tl.where(x != x, -QMAX_ - 2, q)
    tl.store(code_ptr + rows[:, None] * C + cols[None, :], q.to(tl.int8), mask=valid)
    tl.store(scale_ptr + tl.program_id(0) * C + cols, scale, mask=cmask)


@triton_jit
def _decompress_kernel(
    code_ptr, scale_ptr, out_ptr, R, C,
    QMAX_: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    valid = (rows < R)[:, None] & cmask[None, :]
    offsets = rows[:, None] * C + cols[None, :]
    q = tl.load(code_ptr + offsets, mask=valid, other=0).to(tl.int32)
    scale = tl.load(scale_ptr + tl.program_id(0) * C + cols, mask=cmask, other=0.0)
    v = q.to(tl.float32) * scale[None, :]
    v = tl.where(q == QMAX_ + 1, float("inf"), v)
    v = tl.where(q == -QMAX_ - 1, float("-inf"), v)
    v = tl.where(q == -QMAX_ - 2, float("nan"), v)
    tl.store(out_ptr + offsets, rne_cast(v, out_ptr.dtype.element_ty), mask=valid)


def triton_channel_compress(
    x: torch.Tensor, *, codec: str, spec: SpecFn, kernel: Any, **constexprs: Any
) -> list[torch.Tensor]:
    """Runs a per-channel codec's compress kernel: one program per block of
    rows and `_BLOCK_CHANNELS` channels, writing [codes, scales] of ``spec``."""
    check_input(x, codec=codec, dtypes=DTYPES)
    require_triton(x, kernel)
    rows, channels = rows_channels(x.shape)
    x2d = x.reshape(rows, channels)
    codes, scale = (torch.empty(s, dtype=d, device=x.device) for s, d in spec(x.shape, x.dtype))
    if rows and channels:
        grid = (scale.shape[0], (channels + _BLOCK_CHANNELS - 1) // _BLOCK_CHANNELS)
        launch(
            kernel, grid, x2d, codes, scale, rows, channels, x2d.stride(0), x2d.stride(1),
            BLOCK_C=_BLOCK_CHANNELS, **constexprs,
        )  # fmt: skip
    return [codes, scale]


def triton_channel_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype,
    *, codec: str, spec: SpecFn, kernel: Any, **constexprs: Any,
) -> torch.Tensor:  # fmt: skip
    """Runs a per-channel codec's decompress kernel (programs as for compress)."""
    shape = check_channel_payload(payload, shape, dtype, codec=codec, spec=spec)
    codes, scale = (t.contiguous() for t in payload)
    require_triton(codes, kernel)
    rows, channels = rows_channels(shape)
    out = torch.empty(rows, channels, dtype=dtype, device=codes.device)
    if rows and channels:
        grid = (scale.shape[0], (channels + _BLOCK_CHANNELS - 1) // _BLOCK_CHANNELS)
        launch(kernel, grid, codes, scale, out, rows, channels, BLOCK_C=_BLOCK_CHANNELS, **constexprs)
    return out.reshape(shape)


def triton_int8_channel_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_int8_channel_compress` (same bits)."""
    return triton_channel_compress(
        x, codec=NAME, spec=int8_channel_payload_spec, kernel=_compress_kernel,
        QMAX_=QMAX, MIN_SCALE_=MIN_SCALE, BLOCK_R=BLOCK_ROWS,
    )  # fmt: skip


def triton_int8_channel_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Triton twin of `torch_int8_channel_decompress` (same bits)."""
    return triton_channel_decompress(
        payload, shape, dtype, codec=NAME, spec=int8_channel_payload_spec, kernel=_decompress_kernel,
        QMAX_=QMAX, BLOCK_R=BLOCK_ROWS,
    )  # fmt: skip


# --------------------------------------------------------------------------
# Ops and codec
# --------------------------------------------------------------------------


def check_channel_payload(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, *, codec: str, spec: SpecFn
) -> tuple[Any, ...]:
    """Validates a decompress call of a per-channel codec; returns the shape."""
    shape = check_shape(shape, codec=codec)
    check_output_dtype(dtype, codec=codec, dtypes=DTYPES)
    check_payload(payload, spec(shape, dtype), codec=codec)
    return shape


def _check_decompress(payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype) -> tuple[Any, ...]:
    return check_channel_payload(payload, shape, dtype, codec=NAME, spec=int8_channel_payload_spec)


int8_channel_compress_op, int8_channel_decompress_op = register_dispatched_ops(
    NAME,
    dtypes=DTYPES,
    payload_spec=int8_channel_payload_spec,
    torch_impl=(torch_int8_channel_compress, torch_int8_channel_decompress),
    triton_impl=(triton_int8_channel_compress, triton_int8_channel_decompress),
)


class ChannelCodec(OpCodec):
    """A codec with one scale per channel and block of rows: what
    `int8_channel` and `int4_channel` share (the payload spec and aten forms
    they are built with, and where they apply)."""

    def __init__(
        self, name: str, error_bound: float, spec: SpecFn, aten: tuple[Callable[..., Any], Callable[..., Any]]
    ) -> None:
        self.name = name
        self.error_bound = error_bound
        self._spec = spec
        self._aten_compress, self._aten_decompress = aten

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return self._spec(shape, dtype)

    def aten_compress(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self._aten_compress(x)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return self._aten_decompress(payload, shape, dtype)

    def applies(self, query: ApplyQuery) -> bool:
        """Float values of the producer classes in `ACTIVATION_PRODUCERS` that
        a matmul reads in backward, where the payload is smaller than the
        tensor (a handful of rows can make the scales outweigh the codes).

        Kept to the inputs of linear layers, the values whose
        last dim is certainly a feature dim (rows are tokens), and never to
        values of convolutional layers (made or read by a convolution, batch
        norm or pooling, which the annotate pass also calls "matmul"): a
        channels-first layout puts space in the last dim, and a block of rows
        then spans conv channels of unrelated scale. Offered for a conv-BN
        net's ReLU outputs, int8_channel rounded its small positive values to
        0 and so changed the ReLU backward's mask: a BN bias gradient moved
        by 0.12 where the plan's bounds allowed 0.06 (measured)."""
        targets = (query.producer_target, *query.consumer_targets)
        if not (
            query.dtype in DTYPES
            and len(query.shape) >= 1
            and query.producer_class in ACTIVATION_PRODUCERS
            and "matmul" in query.consumer_classes
            and not any(op in target for target in targets for op in _CHANNELS_FIRST_OPS)
        ):
            return False
        original = numel_of([int(s) for s in query.shape]) * query.dtype.itemsize
        return self.compressed_nbytes(query.shape, query.dtype) < original


class Int8ChannelCodec(ChannelCodec):
    """int8 with one scale per channel and block of rows (see module docstring)."""

    def __init__(self) -> None:
        super().__init__(
            NAME, 0.015, int8_channel_payload_spec, (_aten_compress, _aten_decompress)
        )

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Scratch bytes. The Triton kernels need none. The torch reference,
        on P = R x C elements: compress holds its float32 copy (4P) and, with
        NaN/Inf present, the non-finite mask (P), or beside the codes one
        mask at a time (P); decompress its float32 buffer (4P; the result
        itself for float32 output) and one mask at a time (P). Both add a
        few float32 tensors per block and channel."""
        if triton:
            return Workspace()
        rows, channels = rows_channels(shape)
        blocks = (rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        numel = rows * channels
        per_block = 16 * blocks * channels + _SMALL
        buffer = 0 if dtype == torch.float32 else 4 * numel
        return Workspace(compress=5 * numel + per_block, decompress=buffer + numel + per_block)


INT8_CHANNEL = REGISTRY.register(Int8ChannelCodec())
