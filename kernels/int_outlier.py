"""Codecs "int8_outlier" and "int4_outlier": group-wise integers, outlier channels exact.

Why: the inputs of linear layers in transformers (norm outputs, attention
outputs, MLP activations) are mostly well behaved, but a few *channels* carry
values 10-100x larger than the rest. A symmetric group scale is set by the
largest value in its group, so one such channel wipes out the resolution of
all its neighbours. Adacc keeps those channels at full precision and
quantises the rest; this module does that, choosing the channels per call.

Layout: ``x`` is viewed as R rows x C channels (C = last dim; a 0-d tensor is
1 x 1), with G = 64 (int8) or 32 (int4) channels per group, P = ceil(C / G) * G
channels once padded to whole groups, and K = min(C, max(1, C // 64)) outlier
slots. The payload is::

    [0] codes   int8  [R, P]       int8_outlier
                uint8 [R, P / 2]   int4_outlier: byte j of a row holds channel j
                                   in its low nibble, channel j + P / 2 in
                                   its high one
    [1] scales  bfloat16 [R, P / G]  one symmetric scale per row and group
    [2] index   int32 [K]          outlier channels, ascending
    [3] values  x.dtype [R, K]     those channels, bit for bit

The int4 nibbles pair channel j with channel j + P / 2 (P is even: whole
groups of 32), not with its neighbour, so that packing and unpacking
combine two contiguous halves of a row elementwise, which Inductor's C++
vectorises; pairing neighbours needs horizontal work per byte.

Every size depends on the shape and dtype only, so `compressed_nbytes` is
exact before any data is seen (the planner needs that). Padding codes (0)
cost nothing for the usual hidden sizes (multiples of 64); they are stored
because Inductor's CPU backend (torch 2.13) miscompiles the per-group
broadcast when the code tensor is cut back to C channels (it splits the C
loop into groups of G and drops the remainder when G does not divide C).

Outlier channels: the score of a channel is its largest finite |x| over all
rows; the K best scores win (ties: lower channel first). Filling all K slots,
rather than only those above a z-score threshold, is deliberate: the slots
are stored whether used or not, and each extra exact channel can only shrink
its group's scale. The threshold (`OUTLIER_RATIO` times the median channel)
is still what `calibrate` reports as "outlier channels", and its
``outlier_slot_coverage`` tells the planner when K was too small. Outlier
channels are zeroed before the group scales are taken.

Scales are bfloat16: fp32's range (an fp16 scale overflows for |x| > 458k in
int4, and underflows for tiny fp32 inputs) at half the bytes. They are
rounded toward zero, so no dequantised value can exceed its group's largest
one (no overflow to Inf in fp16); quantisation multiplies by the reciprocal
of the *stored* scale and clamps, so the short mantissa costs at most 2^-8
of the group's largest value on that value. A scale is at least
`MIN_SCALE` (the smallest normal float32), so that its reciprocal is finite:
a group whose values are all below 127 * 2^-126 (1.5e-36) in magnitude is
stored at that resolution. The reciprocal is computed once per group and
correctly rounded wherever it runs (torch; Inductor through
`aten_graphs.divide`; Triton through `oplib.div_exact`), and the product is
one float32 multiply, so the three give the same codes bit for bit; a
division per element cost a quarter of the compress in Inductor's AVX512
code (bench/RESULTS.md). Codes round to nearest even (``torch.round``; the
kernels add and subtract 1.5 * 2^23).

NaN and ±Inf at any position, in any number, survive with no extra bytes:
inside an outlier channel they are stored as they are; elsewhere a group that
holds one is flagged by the sign bit of its scale (scales are otherwise >= 0)
and its codes then reserve ``-QMAX - 1`` for NaN, ``-QMAX`` for -Inf and
``QMAX`` for +Inf, its finite values using ±(QMAX - 1): its scale is the
largest value over `IntFormat.special_limit` (int8: 125.5, int4: 6) instead
of QMAX, low enough that no finite value rounds to QMAX, so the codes clamp
at ±QMAX in every group and ±Inf reach their codes without a select. Only
such a group loses a little resolution (int4: 13 levels instead of 15). Non-finite values
never enter a scale or an outlier score.

Error: with r the rounding error of one group of n values whose largest
magnitude is m, ||r|| <= sqrt(n) * m / (2 * QMAX) <= sqrt(n) / (2 * QMAX) * ||x_group||,
so the relative error can never exceed sqrt(G) / (2 * special_limit) plus the
bfloat16 scale truncation (at most 2^-8): 0.036 for int8, 0.48 for int4,
whatever the input. The declared `error_bound` is tighter and comes from measurement
(tests/kernels/test_int_outlier.py, bench/bench_codec_error.py): int8 / int4
relative error 0.006 / 0.096 on Gaussian input, 0.004 / 0.06 on LLM-like
input with outlier channels, and at worst 0.012 (Student-t, nu = 2) / 0.142
(GELU outputs, whose skew wastes half of a symmetric range); declared 0.015
and 0.16.

Choosing the outlier channels per call reads ``x`` twice (channel
statistics, then quantisation): they must be known before any group scale
is. A calibrated plan instead measures them once on a real batch
(`IntOutlierCodec.calibration_parameters`) and holds them as a constant of
the compiled graph; its compress then needs no channel statistics and no
sort (Inductor's C++ still reads ``x`` twice, group statistics and then
codes: see `_aten_compress`; the Triton kernel reads it once, each program
holding its groups in registers: `IntOutlierCodec.triton_calibrated_compress`,
and for int4 where the number of groups is even, i.e. channels a multiple
of 64; `tests/kernels/test_kernel_traffic.py` counts the reads). On a
later batch whose strongest channels moved, a strong channel outside them
only widens its group's scale (the worst case above still holds);
`adacc_compile.monitor` measures that drift.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import REGISTRY, aten_graphs
from .aten_graphs import bfloat16_values, byte_values, int8_values, nibble_bytes, packed_fields
from .codec import ApplyQuery, CodecStats
from .oplib import (
    OpCodec,
    PayloadSpec,
    Workspace,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    div_exact,
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

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SCALE_DTYPE = torch.bfloat16
#: Smallest scale: the smallest normal float32 (a bfloat16 value too), whose
#: reciprocal is finite.
MIN_SCALE = 2.0**-126
#: One outlier slot per this many channels (at least one, at most C).
OUTLIER_DIVISOR = 64
#: `calibrate` calls a channel an outlier above this multiple of the median channel.
OUTLIER_RATIO = 4.0
#: Producer op classes whose outputs feed linear layers (annotate pass names).
ACTIVATION_PRODUCERS = frozenset({"norm", "attention", "activation", "elementwise", "matmul", "dropout", "view"})
_BLOCK_ROWS = 32
_STATS_ROWS_PER_PROGRAM = 256
_STATS_BLOCK_CHANNELS = 64
#: Workspace bounds (bytes): per channel for the outlier choice (float32
#: scores, int64 sort indices twice, int32 slot map and index), per
#: (row, group) for the scale arithmetic, and a constant slack.
_CHANNEL_SCRATCH = 64
_GROUP_SCRATCH = 16
_SMALL = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class IntFormat:
    """The integer format of one codec."""

    name: str
    #: Largest finite code magnitude in a group without non-finite values.
    qmax: int
    #: Channels per group sharing one scale (a power of two).
    group: int
    #: Two codes per byte.
    pack4: bool
    #: The scale's divisor in a group that holds NaN/Inf: the largest
    #: half-step L with L * (1 + 2^-7) * (1 + 2^-23) < QMAX - 0.5. The stored
    #: scale (bfloat16, toward zero) is at most 2^-7 below the group's
    #: largest value / L, so a finite value's scaled magnitude stays under
    #: QMAX - 0.5 and rounds to at most QMAX - 1 without a clamp at L: the
    #: codes can clamp every group at ±QMAX, which turns ±Inf into its
    #: reserved code ±QMAX with no select (`_aten_compress`).
    special_limit: float


INT8 = IntFormat(name="int8_outlier", qmax=127, group=64, pack4=False, special_limit=125.5)
INT4 = IntFormat(name="int4_outlier", qmax=7, group=32, pack4=True, special_limit=6.0)



def outlier_slots(channels: Any) -> Any:
    """K: fixed by C alone so that the payload size is static (works on SymInts)."""
    return torch.sym_min(channels, torch.sym_max(1, channels // OUTLIER_DIVISOR))


def int_outlier_payload_spec(fmt: IntFormat, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """Shapes and dtypes of [codes, scales, index, values] (see module docstring)."""
    rows, channels = rows_channels(shape)
    groups = (channels + fmt.group - 1) // fmt.group
    slots = outlier_slots(channels)
    if fmt.pack4:
        codes = ((rows, groups * (fmt.group // 2)), torch.uint8)
    else:
        codes = ((rows, groups * fmt.group), torch.int8)
    return [codes, ((rows, groups), _SCALE_DTYPE), ((slots,), torch.int32), ((rows, slots), dtype)]


# --------------------------------------------------------------------------
# Shared glue: outlier choice (a C-sized problem, the same on both paths)
# --------------------------------------------------------------------------


def select_outlier_channels(score: torch.Tensor, slots: int) -> torch.Tensor:
    """The ``slots`` highest-scoring channels, ascending, as int32.

    The stable sort breaks ties by channel index, so the choice is
    deterministic on every backend.
    """
    order = torch.sort(score, descending=True, stable=True).indices[:slots]
    return torch.sort(order).values.to(torch.int32)


def _view2d(x: torch.Tensor) -> torch.Tensor:
    """The rows x channels view; copies only when strides do not allow a view."""
    rows, channels = rows_channels(x.shape)
    return x.reshape(rows, channels)


def slot_map(index: torch.Tensor, channels: int) -> torch.Tensor:
    """Per channel, its position in ``index`` or -1: how kernels route a channel."""
    slots = index.shape[0]
    positions = torch.arange(slots, dtype=torch.int32, device=index.device)
    slot = torch.full((channels,), -1, dtype=torch.int32, device=index.device)
    return slot.index_put((index.long(),), positions)


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def truncate_to_bfloat16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 -> (bfloat16, the same value as float32), rounding toward zero.

    Toward zero so that ``|code| * scale`` never exceeds the group's largest
    value: with an fp16 input near 65504, a scale rounded up would turn the
    largest value into +Inf. Integer ops instead of ``.to(torch.bfloat16)``:
    Inductor drops a down-and-up cast pair (``emulate_precision_casts`` is
    off by default), and the codes must be computed with the stored scale.
    """
    bits = x.view(torch.int32) & -65536
    return (bits >> 16).to(torch.int16).view(torch.bfloat16), bits.view(torch.float32)


def torch_channel_absmax(x2d: torch.Tensor) -> torch.Tensor:
    """Largest finite |x| per channel (float32 [C]); non-finite values count as 0."""
    if x2d.shape[0] == 0:
        return torch.zeros(x2d.shape[1], dtype=torch.float32, device=x2d.device)
    # In the input dtype (abs and max are exact, so the float32 result is the
    # same) and in place: one temporary of the input's size, not three.
    a = x2d.abs()
    return a.nan_to_num_(nan=0.0, posinf=0.0).amax(dim=0).float()


def _absmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x.abs().amax(dim)`` without the temporary ``x.abs()`` (x holds no NaN)."""
    low, high = torch.aminmax(x, dim=dim)
    # abs() only turns a -0.0 maximum (all zeros) into +0.0, as x.abs() would.
    return torch.maximum(high, low.neg_()).abs_()


def _raw_channel_absmax(x2d: torch.Tensor) -> torch.Tensor:
    """Largest |x| per channel (float32 [C]) of any [R, C] tensor, NaN where
    the channel holds a NaN: one pass, no temporary of the input's size."""
    if x2d.shape[0] == 0:
        return torch.zeros(x2d.shape[1], dtype=torch.float32, device=x2d.device)
    low, high = torch.aminmax(x2d, dim=0)
    return torch.maximum(high, low.neg_()).abs_().float()


def _finite_channel_absmax(x2d: torch.Tensor) -> torch.Tensor:
    """`torch_channel_absmax` of a float32 [R, C] view whose non-finite values are 0."""
    if x2d.shape[0] == 0:
        return torch.zeros(x2d.shape[1], dtype=torch.float32, device=x2d.device)
    return _absmax(x2d, dim=0)


def check_index(fmt: IntFormat, index: torch.Tensor, channels: int, device: torch.device) -> torch.Tensor:
    """Calibrated outlier channels (`IntOutlierCodec.calibration_parameters`):
    int32 ``[K]`` on ``x``'s device. Their values (distinct, ascending, in
    ``[0, C)``) are not checked: that needs the data, which a traced graph
    does not have; `calibration_parameters` gives them so."""
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int32:
        got = getattr(index, "dtype", type(index))
        raise TypeError(f"{fmt.name}: outlier index must be an int32 tensor, got {got}")
    slots = outlier_slots(channels)
    if tuple(index.shape) != (slots,):
        raise ValueError(f"{fmt.name}: outlier index has shape {tuple(index.shape)}, expected ({slots},)")
    if index.device != device:
        raise ValueError(f"{fmt.name}: outlier index on {index.device}, value on {device}")
    return index


def _torch_compress(fmt: IntFormat, x: torch.Tensor, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Torch reference compress; ``index``: calibrated outlier channels
    (`IntOutlierCodec.calibration_parameters`), or None to choose them from
    ``x`` (the op's behaviour).

    Written for a small workspace (see `IntOutlierCodec.workspace`): one
    owned float32 copy of ``x`` padded to whole groups is scaled, clamped and
    rounded in place; codes are int8 from the start (every code fits), and
    the codes of non-finite values are filled in afterwards from ``x`` itself.
    The channel maxima are taken from ``x`` first: where they are all
    finite, so is ``x``, and the passes that mask and patch NaN/Inf are
    skipped (the usual case; half of the passes).
    """
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    x2d = _view2d(x)
    rows, channels = x2d.shape
    if index is not None:
        index = check_index(fmt, index, channels, x.device)
    groups = (channels + fmt.group - 1) // fmt.group
    padded = groups * fmt.group
    score = _raw_channel_absmax(x2d)  # NaN / Inf where a channel holds one
    finite = known_true(torch.isfinite(score).all(), x)
    # Everything per element happens on the padded [R, groups, G] layout (see
    # the module docstring for the Inductor bug this avoids).
    xf = torch.empty(rows, padded, dtype=torch.float32, device=x.device)
    xf[:, channels:].zero_()
    xf[:, :channels].copy_(x2d)
    nonfinite = None
    if not finite:
        # isfinite / isinf would allocate |x| in float32; these three do not.
        nonfinite = torch.isnan(xf).logical_or_(torch.isposinf(xf)).logical_or_(torch.isneginf(xf))
        xf.masked_fill_(nonfinite, 0.0)
        score = _finite_channel_absmax(xf[:, :channels])
    if index is None:
        index = select_outlier_channels(score, outlier_slots(channels))
    xf = xf.view(rows, groups, fmt.group)
    regular = F.pad(slot_map(index, channels) < 0, (0, padded - channels), value=True)
    regular = regular.view(groups, fmt.group)
    if nonfinite is None:
        special = torch.zeros(rows, groups, dtype=torch.bool, device=x.device)
    else:
        nonfinite = nonfinite.view(rows, groups, fmt.group).logical_and_(regular)
        special = nonfinite.any(dim=-1)
    # Kept values: regular and finite (non-finite ones are 0 already).
    xf.masked_fill_(regular.logical_not(), 0.0)
    absmax = _absmax(xf, dim=-1)
    limit = torch.where(special, fmt.special_limit, float(fmt.qmax))
    scale_f = truncate_to_bfloat16(absmax / limit)[1].clamp_min_(MIN_SCALE)
    scale = scale_f.to(_SCALE_DTYPE)  # exact: a bfloat16 value
    xf.mul_((1.0 / scale_f).unsqueeze(-1))
    xf.clamp_(-fmt.qmax, fmt.qmax).round_()  # finite codes of a flagged group stay within QMAX - 1
    codes = xf.view(rows, padded).to(torch.int8)  # |code| <= QMAX: exact
    del xf
    if nonfinite is not None:
        # Reserved codes of non-finite values, read from x (same positions).
        code_view, flagged = codes[:, :channels], nonfinite.view(rows, padded)[:, :channels]
        code_view.masked_fill_(flagged, -fmt.qmax)
        code_view.masked_fill_((x2d > 0).logical_and_(flagged), fmt.qmax)
        code_view.masked_fill_(torch.isnan(x2d).logical_and_(flagged), -fmt.qmax - 1)
        del nonfinite, code_view, flagged
    if fmt.pack4:
        # uint8 shifts keep the low four bits of each two's-complement code.
        halves = codes.view(torch.uint8)
        packed = (halves[:, : padded // 2] & 15).bitwise_or_(halves[:, padded // 2 :] << 4)
    else:
        packed = codes
    stored_scale = torch.where(special, -scale, scale)
    values = x2d.index_select(1, index.long())
    return [packed, stored_scale, index, values.contiguous()]


def _torch_decompress(
    fmt: IntFormat, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Torch reference decompress: int8 codes, one float32 buffer worked in place."""
    shape = _check_decompress(fmt, payload, shape, dtype)
    packed, scale, index, values = payload
    rows, channels = rows_channels(shape)
    groups = scale.shape[1]
    if fmt.pack4:
        # Nibbles n in 0..15 -> (n ^ 8) - 8 in -8..7, all in 8-bit integers.
        codes = torch.cat((packed & 15, packed >> 4), dim=-1).bitwise_xor_(8).view(torch.int8).sub_(8)
    else:
        codes = packed
    codes = codes.reshape(rows, groups, fmt.group)
    s = scale.float().unsqueeze(-1)
    special = torch.signbit(s)
    v = codes.float().mul_(s.abs())
    if not known_true(~special.any(), scale):  # only groups holding NaN/Inf reserve codes
        v.masked_fill_((codes == -fmt.qmax - 1).logical_and_(special), torch.nan)
        v.masked_fill_((codes == -fmt.qmax).logical_and_(special), -torch.inf)
        v.masked_fill_((codes == fmt.qmax).logical_and_(special), torch.inf)
    del codes
    # Outliers are written into the padded buffer, which is then cut to C.
    out = v.to(dtype).view(rows, groups * fmt.group)  # owned: v itself or a new tensor
    out.index_copy_(1, index.long(), values)
    return out[:, :channels].contiguous().view(shape)


def torch_int8_outlier_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """int8 codes, group 64, plus exact outlier channels (see module docstring)."""
    return _torch_compress(INT8, x)


def torch_int8_outlier_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _torch_decompress(INT8, payload, shape, dtype)


def torch_int4_outlier_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """int4 codes (two per byte), group 32, plus exact outlier channels."""
    return _torch_compress(INT4, x)


def torch_int4_outlier_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _torch_decompress(INT4, payload, shape, dtype)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py): the reference's
# arithmetic in functional float ops, cast to one-byte codes once at the end
# (Inductor's CPU code runs masks, one-byte arithmetic and integer -> int8
# casts slowly), so that the channel statistics are one reduction kernel
# and the group scales plus the codes one more.
# --------------------------------------------------------------------------


#: Rows per block of the two-stage channel maximum: Inductor's CPU code for
#: a reduction over rows walks a column strip through all rows; over blocks
#: of 8 rows, then over the blocks, it stays in cache (measured 0.5x a copy
#: instead of 1.6x, 1024 x 2048 float32).
_ROW_BLOCK = 8


def _aten_channel_absmax(clean: torch.Tensor) -> torch.Tensor:
    """Largest |x| per channel of a [R, C] float32 tensor without NaN/Inf."""
    rows, channels = clean.shape
    whole = rows // _ROW_BLOCK * _ROW_BLOCK
    a = clean.abs()
    if whole == 0:
        return a.amax(dim=0)
    score = a[:whole].view(whole // _ROW_BLOCK, _ROW_BLOCK, channels).amax(dim=1).amax(dim=0)
    return score if whole == rows else torch.maximum(score, a[whole:].amax(dim=0))


def _aten_regular(index: torch.Tensor, channels: int, padded: int) -> torch.Tensor:
    """1.0 for channels quantised into groups (padding included), 0.0 for outliers."""
    ones = torch.ones(padded, dtype=torch.float32, device=index.device)
    return ones.index_put((index.long(),), torch.zeros_like(index, dtype=torch.float32))


def _aten_compress(fmt: IntFormat, x: torch.Tensor, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`_torch_compress` written for Inductor (the same payload, bit for bit).

    With calibrated outlier channels (``index``, passed through as the
    payload's index) no channel statistics: the group statistics, then the
    group scales and the codes. Without, the channel maxima (one reduction
    kernel) come first: the outlier channels, chosen from all rows, decide
    every group scale. Inductor (torch 2.13, C++) emits the group statistics
    and the codes as two loop nests over all rows, so ``x`` is read twice:
    the reciprocal of the scale is written to a buffer between them
    (`aten_graphs.written`; inline it costs two divisions per vector).
    Fusing the two per row and group, by keeping the per-group step's loops
    [rows, groups] and scalar, was slower (3.24 against 2.92 copies of the
    value for the compress alone, 4096 x 1024 float32, AVX512, 1 thread).

    Each element costs a few vector float ops (Inductor's CPU code is bound
    by them here, not by memory), and a select costs most: Inductor's
    AVX512 code turns each comparison's mask into a vector and back. So
    the group statistics take one select: ``|x| < inf`` is the finite test
    and NaN/Inf become -1, a product with a 0/1 float mask of the regular
    channels zeroes outliers and padding, and the non-finite flag is a sum
    of ``kept - |kept|`` (with a second select for the flag, the int8
    compress took 0.1 copies more alone and 0.3 more inside a graph,
    LayerNorm -> matmul; medians of 25-31 interleaved rounds, same shape).
    The codes of non-finite values are one select at the end.
    """
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    rows, channels = rows_channels(x.shape)
    if index is not None:
        index = check_index(fmt, index, channels, x.device)
    if rows == 0 or channels == 0:
        return _torch_compress(fmt, x, index)
    x2d = x.reshape(rows, channels)
    groups = (channels + fmt.group - 1) // fmt.group
    padded = groups * fmt.group
    pad = (0, padded - channels)
    xf = x2d.float()
    if index is None:
        magnitude = xf.abs()
        finite = magnitude < float("inf")  # false exactly at NaN and ±Inf
        clean = torch.where(finite, magnitude, 0.0)
        index = select_outlier_channels(_aten_channel_absmax(clean), outlier_slots(channels))
    regular = _aten_regular(index, channels, padded).view(groups, fmt.group)
    grouped = (F.pad(xf, pad) if padded != channels else xf).view(rows, groups, fmt.group)
    a = grouped.abs()
    ok = a < float("inf")
    # One select for both group statistics: |x| of the quantised values,
    # -1 at NaN/Inf in regular channels, 0 (or -0.0) in outlier channels and
    # padding. Its maximum is the group's largest kept |x| (negative only
    # when every value is NaN/Inf: the scale is then MIN_SCALE, as for 0),
    # and ``kept - |kept|`` is -2 exactly at NaN/Inf in regular channels and
    # 0 elsewhere, so the flag is a plain sum (no second select).
    kept = torch.where(ok, a, -1.0) * regular
    special = (kept - kept.abs()).sum(dim=-1) < 0
    limit = torch.where(special, fmt.special_limit, float(fmt.qmax))
    scale_f = truncate_to_bfloat16(aten_graphs.divide(kept.amax(dim=-1), limit))[1].clamp_min(MIN_SCALE)
    reciprocal = aten_graphs.written(aten_graphs.divide(1.0, scale_f))
    # The reference's product, clamp and rounding on x itself. The clamp is
    # at ±QMAX in every group (`IntFormat.special_limit`): ±Inf land on their
    # reserved codes and only NaN needs a select. The mask then zeroes the
    # outlier channels (whose NaN the select has replaced), so the codes loop
    # needs no cleaned copy of x and no finiteness test.
    q = (grouped * reciprocal.unsqueeze(-1)).clamp(-fmt.qmax, fmt.qmax).round()
    # Cast on the [rows, groups, G] shape: the codes kernel then has the
    # reduction's loops outside, and Inductor fuses the two (viewed as
    # [rows, P] first, their loop ranges differ and they are not fused).
    codes = torch.where(grouped != grouped, -fmt.qmax - 1.0, q) * regular
    if fmt.pack4:
        packed = _aten_pack_halves(codes.view(rows, padded))
    else:
        if aten_graphs.vector_lanes(x.device) > 8:
            # Through int32 (exact: the codes are whole numbers in -128..127):
            # with AVX512 a truncating int32 -> int8 narrowing is cheaper than
            # Inductor's direct float -> int8 cast (the int8 compress added
            # 3.94 copies of the value in a graph instead of 4.13, medians of
            # 31 interleaved rounds). With AVX2 it is the other way round (the
            # compress alone took 5.2 ms instead of 3.6 through int32, measured).
            codes = codes.to(torch.int32)
        packed = codes.to(torch.int8).view(rows, padded)
    stored_scale = torch.where(special, -scale_f, scale_f).to(_SCALE_DTYPE)  # exact: bfloat16 values
    values = x2d.index_select(1, index.long())
    return [packed, stored_scale, index, values]


def _aten_pack_halves(codes: torch.Tensor) -> torch.Tensor:
    """Float codes -8..7 ``[R, P]`` as int4 bytes ``[R, P / 2]``: the first
    half of each row in the low nibbles, the second in the high ones (two
    contiguous reads per byte, `aten_graphs.nibble_bytes`)."""
    half = codes.shape[1] // 2
    return nibble_bytes(codes[:, :half], codes[:, half:])


def _aten_unpack_halves(packed: torch.Tensor, group: int) -> torch.Tensor:
    """`_aten_pack_halves` undone: float codes -8..7 ``[R, P]``, row ``r``
    being the low nibbles of packed row ``r``, then its high nibbles.

    Built as ``[R, 2, P / 2 / group, group]`` where whole groups fit in a
    half (an even number of groups), so that a reader looping over
    ``[R, groups, group]`` finds the byte of a code at its in-group offset
    plus a group's offset: a contiguous load. Through ``[R, 2, P / 2]``
    alone, Inductor indexes the bytes with ``(offset + group * g) % (P / 2)``,
    which it does not simplify, and gathers them one by one.

    The nibbles: with 16-lane vectors, int32 shifts of plainly loaded bytes
    (the int4 decompress added 1.0-1.5x a copy over runs, float arithmetic 1.5x);
    with 8 lanes, float arithmetic on `byte_values` (bytes spread from int64
    words: 2.2-2.5x, against 3.2x for int32 shifts of the same words),
    measured."""
    rows, half = packed.shape
    width = group if half % group == 0 else half
    shape = (rows, 1, half // width, width)
    first = (torch.arange(2, device=packed.device) == 0).view(1, 2, 1, 1)
    if aten_graphs.vector_lanes(packed.device) > 8:
        byte = packed_fields(packed, 8).view(shape)
        nibbles = torch.where(first, byte & 15, byte >> 4).float()
    else:
        byte = byte_values(packed).view(shape)
        high = torch.floor(byte * 0.0625)
        nibbles = torch.where(first, byte - 16.0 * high, high)
    return torch.where(nibbles >= 8.0, nibbles - 16.0, nibbles).view(rows, 2 * half)


def _aten_decompress(
    fmt: IntFormat, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """`_torch_decompress` written for Inductor (the same values)."""
    shape = _check_decompress(fmt, payload, shape, dtype)
    rows, channels = rows_channels(shape)
    if rows == 0 or channels == 0:
        return _torch_decompress(fmt, payload, shape, dtype)
    packed, scale, index, values = payload
    groups = scale.shape[1]
    if fmt.pack4:
        q = _aten_unpack_halves(packed, fmt.group)
    else:
        q = int8_values(packed)
    q = q.reshape(rows, groups, fmt.group)
    s = bfloat16_values(scale).unsqueeze(-1)
    # The sign bit flags a group with NaN/Inf (-0.0 included); read through
    # float32 bits: Inductor's C++ does not vectorise int16.
    special = s.view(torch.int32) < 0
    # The reserved codes as a factor of the code, not a select of the
    # product: ±QMAX * inf is ±Inf and (-QMAX - 1) * NaN is NaN. One select
    # chain instead of three (the compiled decompress alone took 0.79x
    # (int8) and 0.85x (int4) the time of three, paired, 4096 x 1024 float32).
    reserved = torch.where(q < -fmt.qmax - 0.5, float("nan"), float("inf"))
    v = q * torch.where(special & (q.abs() > fmt.qmax - 0.5), reserved, s.abs())
    out = v.to(dtype).view(rows, groups * fmt.group)[:, :channels]
    out = out.index_copy(1, index.long(), values)
    return out.reshape(shape)


def torch_int4_plain_roundtrip(x: torch.Tensor, group: int = INT4.group) -> tuple[torch.Tensor, int]:
    """Test/benchmark baseline, not a codec: int4 group-wise with no outlier channels.

    Same group size, code range and bfloat16 scales as int4_outlier, so the
    difference measures the outlier handling alone. Returns (x_hat, payload
    bytes). Non-finite values are not handled.
    """
    x2d = _view2d(x)
    rows, channels = x2d.shape
    groups = (channels + group - 1) // group
    grouped = F.pad(x2d.float(), (0, groups * group - channels)).view(rows, groups, group)
    scale = truncate_to_bfloat16(grouped.abs().amax(dim=-1, keepdim=True) / INT4.qmax)[1]
    codes = torch.round(grouped / torch.where(scale > 0, scale, 1.0)).clamp(-INT4.qmax, INT4.qmax)
    x_hat = (codes * scale).view(rows, groups * group)[:, :channels].to(x.dtype).reshape(x.shape)
    nbytes = rows * ((channels + 1) // 2) + rows * groups * _SCALE_DTYPE.itemsize
    return x_hat, nbytes


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _channel_absmax_kernel(
    x_ptr, partial_ptr, R, C, stride_r, stride_c,
    ROWS_PER_PROGRAM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # Program (i, j): largest finite |x| of rows [i*RPP, (i+1)*RPP) in channel block j.
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    first = tl.program_id(0) * ROWS_PER_PROGRAM
    last = tl.minimum(first + ROWS_PER_PROGRAM, R)
    for start in range(first, last, BLOCK_R):
        rows = (start + tl.arange(0, BLOCK_R)).to(tl.int64)
        mask = (rows < last)[:, None] & cmask[None, :]
        offsets = rows[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_c
        a = tl.abs(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
        acc = tl.maximum(acc, tl.max(tl.where(a < float("inf"), a, 0.0), axis=0))
    tl.store(partial_ptr + tl.program_id(0) * C + cols, acc, mask=cmask)


@triton_jit
def _load_half(x_ptr, slot_ptr, rows, rmask, cols, C, stride_r, stride_c):
    # One half (even or odd channels) of a group: raw values, float32, masks.
    cmask = cols < C
    valid = rmask[:, None] & cmask[None, :]
    offsets = rows[:, None] * stride_r + cols.to(tl.int64)[None, :] * stride_c
    raw = tl.load(x_ptr + offsets, mask=valid, other=0.0)
    slot = tl.load(slot_ptr + cols, mask=cmask, other=-1)
    x = raw.to(tl.float32)
    finite = tl.abs(x) < float("inf")
    regular = valid & (slot < 0)[None, :]
    return raw, x, slot, valid, finite, regular


@triton_jit
def _codes(x, finite, regular, scale, limit, QMAX: tl.constexpr):
    # Symmetric codes with round-half-even; non-finite values get reserved codes.
    y = tl.where(regular & finite, x, 0.0) * div_exact(1.0, scale)[:, None]
    y = tl.minimum(tl.maximum(y, -limit[:, None]), limit[:, None])
    # Adding then subtracting 1.5 * 2^23 rounds float32 |y| < 2^22 to nearest
    # even, like torch.round (libdevice rint is not available in the interpreter).
    q = ((y + 12582912.0) - 12582912.0).to(tl.int32)
    special = tl.where(x != x, -QMAX - 1, tl.where(x > 0, QMAX, -QMAX))
    return tl.where(regular & ~finite, special, q)


@triton_jit
def _when(mask, flag):
    # ``mask`` where the scalar int ``flag`` is nonzero, broadcast into a
    # tensor (the Triton interpreter rejects a scalar in a mask).
    return mask & ((mask.to(tl.int32) * 0 + flag) != 0)


@triton_jit
def _quantize_group(
    x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, group, own_first, own_second,
    C, K, stride_r, stride_c, num_groups, QMAX: tl.constexpr, GROUP: tl.constexpr,
    SPECIAL_LIMIT: tl.constexpr,
):  # fmt: skip
    # One group, read as its two contiguous halves: returns the codes of
    # both; stores the group's scale where this program owns the first half
    # and the outlier values of each half it owns (each half is owned by one
    # program; own_first / own_second are 0 or 1).
    half = tl.arange(0, GROUP // 2)
    col_a = group * GROUP + half
    col_b = col_a + GROUP // 2
    raw_a, x_a, slot_a, valid_a, fin_a, reg_a = _load_half(
        x_ptr, slot_ptr, rows, rmask, col_a, C, stride_r, stride_c
    )
    raw_b, x_b, slot_b, valid_b, fin_b, reg_b = _load_half(
        x_ptr, slot_ptr, rows, rmask, col_b, C, stride_r, stride_c
    )
    amax = tl.maximum(
        tl.max(tl.where(reg_a & fin_a, tl.abs(x_a), 0.0), axis=1),
        tl.max(tl.where(reg_b & fin_b, tl.abs(x_b), 0.0), axis=1),
    )
    nonfinite = tl.maximum(
        tl.max((reg_a & ~fin_a).to(tl.int32), axis=1), tl.max((reg_b & ~fin_b).to(tl.int32), axis=1)
    )
    special = nonfinite > 0
    limit = tl.where(special, SPECIAL_LIMIT, QMAX * 1.0)
    # bfloat16 scale rounded toward zero (see truncate_to_bfloat16).
    scale = (tl.math.div_rn(amax, limit).to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    scale = tl.maximum(scale, 1.1754943508222875e-38)  # MIN_SCALE
    stored = tl.where(special, -scale, scale).to(tl.bfloat16)  # exact: scale is a bfloat16 value
    tl.store(scale_ptr + rows * num_groups + group, stored, mask=_when(rmask, own_first))
    outlier_a = _when(valid_a & (slot_a >= 0)[None, :], own_first)
    outlier_b = _when(valid_b & (slot_b >= 0)[None, :], own_second)
    tl.store(value_ptr + rows[:, None] * K + slot_a[None, :], raw_a, mask=outlier_a)
    tl.store(value_ptr + rows[:, None] * K + slot_b[None, :], raw_b, mask=outlier_b)
    return _codes(x_a, fin_a, reg_a, scale, limit, QMAX), _codes(x_b, fin_b, reg_b, scale, limit, QMAX)


@triton_jit
def _quantize_kernel(
    x_ptr, slot_ptr, code_ptr, scale_ptr, value_ptr,
    R, C, K, stride_r, stride_c, code_stride, num_groups,
    QMAX: tl.constexpr, GROUP: tl.constexpr, PACK4: tl.constexpr, BLOCK_R: tl.constexpr,
    SPECIAL_LIMIT: tl.constexpr, WHOLE_GROUPS: tl.constexpr,
):  # fmt: skip
    # int8, program (i, g): rows block i, channel group g; writes the group's
    # codes, its scale and the outlier values that fall in it. int4 with an
    # even number of groups (WHOLE_GROUPS), program (i, g): bytes
    # [g * G, (g + 1) * G) of each row, whose low nibbles are group g and
    # high nibbles group g + groups / 2 (P / 2 = groups / 2 * G channels
    # further on): two whole groups, each value read once. int4 otherwise,
    # program (i, k): bytes [k * G/2, (k + 1) * G/2) of each row, whose low
    # nibbles are channels k * G/2 + h (half k % 2 of group k // 2) and high
    # nibbles channels (groups + k) * G/2 + h; it quantises both groups those
    # halves belong to and keeps one half of each (each value read twice).
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    half = tl.arange(0, GROUP // 2)
    if PACK4 and WHOLE_GROUPS:
        g = tl.program_id(1)
        low_a, low_b = _quantize_group(
            x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, g, 1, 1,
            C, K, stride_r, stride_c, num_groups, QMAX, GROUP, SPECIAL_LIMIT,
        )  # fmt: skip
        high_a, high_b = _quantize_group(
            x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, g + num_groups // 2, 1, 1,
            C, K, stride_r, stride_c, num_groups, QMAX, GROUP, SPECIAL_LIMIT,
        )  # fmt: skip
        offsets = rows[:, None] * code_stride + (g * GROUP + half)[None, :]
        first = (low_a & 15) | ((high_a & 15) << 4)
        second = (low_b & 15) | ((high_b & 15) << 4)
        tl.store(code_ptr + offsets, first.to(tl.uint8), mask=rmask[:, None])
        tl.store(code_ptr + offsets + GROUP // 2, second.to(tl.uint8), mask=rmask[:, None])
    elif PACK4:
        k = tl.program_id(1)
        low_part = k % 2
        q_a, q_b = _quantize_group(
            x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, k // 2, 1 - low_part, low_part,
            C, K, stride_r, stride_c, num_groups, QMAX, GROUP, SPECIAL_LIMIT,
        )  # fmt: skip
        low = tl.where(low_part == 0, q_a, q_b)
        high_part = (num_groups + k) % 2
        q_a, q_b = _quantize_group(
            x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, (num_groups + k) // 2,
            1 - high_part, high_part, C, K, stride_r, stride_c, num_groups, QMAX, GROUP, SPECIAL_LIMIT,
        )  # fmt: skip
        high = tl.where(high_part == 0, q_a, q_b)
        byte = (low & 15) | ((high & 15) << 4)
        offsets = rows[:, None] * code_stride + (k * (GROUP // 2) + half)[None, :]
        tl.store(code_ptr + offsets, byte.to(tl.uint8), mask=rmask[:, None])
    else:  # padding channels (col >= C) get code 0
        group = tl.program_id(1)
        q_a, q_b = _quantize_group(
            x_ptr, slot_ptr, scale_ptr, value_ptr, rows, rmask, group, 1, 1,
            C, K, stride_r, stride_c, num_groups, QMAX, GROUP, SPECIAL_LIMIT,
        )  # fmt: skip
        col_a = group * GROUP + half
        offsets = rows[:, None] * code_stride + col_a[None, :]
        tl.store(code_ptr + offsets, q_a.to(tl.int8), mask=rmask[:, None])
        tl.store(code_ptr + offsets + GROUP // 2, q_b.to(tl.int8), mask=rmask[:, None])


@triton_jit
def _store_half(
    out_ptr, slot_ptr, value_ptr, q, magnitude, special, rows, rmask, cols, C, K, QMAX: tl.constexpr
):
    # Dequantises one half of a group, restores non-finite codes and outliers.
    cmask = cols < C
    valid = rmask[:, None] & cmask[None, :]
    v = q.to(tl.float32) * magnitude[:, None]
    flagged = special[:, None]
    v = tl.where(flagged & (q == -QMAX - 1), float("nan"), v)
    v = tl.where(flagged & (q == -QMAX), float("-inf"), v)
    v = tl.where(flagged & (q == QMAX), float("inf"), v)
    v = rne_cast(v, out_ptr.dtype.element_ty)
    slot = tl.load(slot_ptr + cols, mask=cmask, other=-1)
    outlier = valid & (slot >= 0)[None, :]
    exact = tl.load(value_ptr + rows[:, None] * K + slot[None, :], mask=outlier, other=0.0)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], tl.where(outlier, exact, v), mask=valid)


@triton_jit
def _load_scale(scale_ptr, rows, rmask, group, num_groups):
    # A group's scale magnitude per row, and its sign bit: the group holds NaN/Inf.
    scale = tl.load(scale_ptr + rows * num_groups + group, mask=rmask, other=0.0)
    return tl.abs(scale.to(tl.float32)), scale.to(tl.int16, bitcast=True) < 0


@triton_jit
def _dequantize_kernel(
    code_ptr, scale_ptr, slot_ptr, value_ptr, out_ptr,
    R, C, K, code_stride, num_groups,
    QMAX: tl.constexpr, GROUP: tl.constexpr, PACK4: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    # Programs as in _quantize_kernel: (i, g) a group of int8 codes, (i, k)
    # G/2 int4 bytes of each row, holding channels k * G/2 + h (low nibbles)
    # and (groups + k) * G/2 + h (high nibbles).
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rmask = rows < R
    half = tl.arange(0, GROUP // 2)
    if PACK4:
        k = tl.program_id(1)
        col_a = k * (GROUP // 2) + half
        col_b = (num_groups + k) * (GROUP // 2) + half
        magnitude_a, special_a = _load_scale(scale_ptr, rows, rmask, k // 2, num_groups)
        magnitude_b, special_b = _load_scale(scale_ptr, rows, rmask, (num_groups + k) // 2, num_groups)
        offsets = rows[:, None] * code_stride + col_a[None, :]
        byte = tl.load(code_ptr + offsets, mask=rmask[:, None], other=0).to(tl.int32)
        q_a = ((byte & 15) ^ 8) - 8
        q_b = (((byte >> 4) & 15) ^ 8) - 8
    else:
        group = tl.program_id(1)
        col_a = group * GROUP + half
        col_b = col_a + GROUP // 2
        magnitude_a, special_a = _load_scale(scale_ptr, rows, rmask, group, num_groups)
        magnitude_b, special_b = magnitude_a, special_a
        row_offsets = rows[:, None] * code_stride
        mask_a = rmask[:, None] & (col_a < C)[None, :]
        mask_b = rmask[:, None] & (col_b < C)[None, :]
        q_a = tl.load(code_ptr + row_offsets + col_a[None, :], mask=mask_a, other=0).to(tl.int32)
        q_b = tl.load(code_ptr + row_offsets + col_b[None, :], mask=mask_b, other=0).to(tl.int32)
    _store_half(out_ptr, slot_ptr, value_ptr, q_a, magnitude_a, special_a, rows, rmask, col_a, C, K, QMAX)
    _store_half(out_ptr, slot_ptr, value_ptr, q_b, magnitude_b, special_b, rows, rmask, col_b, C, K, QMAX)


def triton_channel_absmax(x2d: torch.Tensor) -> torch.Tensor:
    """Triton twin of `torch_channel_absmax` (max is exact, so equal bits)."""
    rows, channels = x2d.shape
    if rows == 0:
        return torch.zeros(channels, dtype=torch.float32, device=x2d.device)
    chunks = (rows + _STATS_ROWS_PER_PROGRAM - 1) // _STATS_ROWS_PER_PROGRAM
    partial = torch.empty(chunks, channels, dtype=torch.float32, device=x2d.device)
    grid = (chunks, (channels + _STATS_BLOCK_CHANNELS - 1) // _STATS_BLOCK_CHANNELS)
    launch(
        _channel_absmax_kernel, grid, x2d, partial, rows, channels, x2d.stride(0), x2d.stride(1),
        ROWS_PER_PROGRAM=_STATS_ROWS_PER_PROGRAM, BLOCK_R=_BLOCK_ROWS, BLOCK_C=_STATS_BLOCK_CHANNELS,
    )  # fmt: skip
    return partial.amax(dim=0)


def _triton_compress(fmt: IntFormat, x: torch.Tensor, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """``index``: calibrated outlier channels (`IntOutlierCodec.calibration_parameters`),
    which spare the pass of channel maxima (the kernel then reads ``x``
    once), or None to choose them from ``x`` (two reads)."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    require_triton(x, _channel_absmax_kernel, _quantize_kernel)
    x2d = _view2d(x)
    rows, channels = x2d.shape
    if index is None:
        index = select_outlier_channels(triton_channel_absmax(x2d), outlier_slots(channels))
    else:
        index = check_index(fmt, index, channels, x.device)
    slot = slot_map(index, channels)
    spec = int_outlier_payload_spec(fmt, x.shape, x.dtype)
    codes, scale, _, values = (torch.empty(s, dtype=d, device=x.device) for s, d in spec)
    groups = scale.shape[1]
    whole_groups = fmt.pack4 and groups % 2 == 0
    # int4: a pair of whole groups per program, or else as many G/2-byte chunks per row as groups.
    grid = ((rows + _BLOCK_ROWS - 1) // _BLOCK_ROWS, groups // 2 if whole_groups else groups)
    launch(
        _quantize_kernel, grid, x2d, slot, codes, scale, values,
        rows, channels, index.shape[0], x2d.stride(0), x2d.stride(1), codes.shape[1], groups,
        QMAX=fmt.qmax, GROUP=fmt.group, PACK4=fmt.pack4, BLOCK_R=_BLOCK_ROWS, SPECIAL_LIMIT=fmt.special_limit,
        WHOLE_GROUPS=whole_groups,
    )  # fmt: skip
    return [codes, scale, index, values]


def _triton_decompress(
    fmt: IntFormat, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    shape = _check_decompress(fmt, payload, shape, dtype)
    codes, scale, index, values = (t.contiguous() for t in payload)
    require_triton(codes, _dequantize_kernel)
    rows, channels = rows_channels(shape)
    slot = slot_map(index, channels)
    out = torch.empty(rows, channels, dtype=dtype, device=codes.device)
    groups = scale.shape[1]
    grid = ((rows + _BLOCK_ROWS - 1) // _BLOCK_ROWS, groups)
    launch(
        _dequantize_kernel, grid, codes, scale, slot, values, out,
        rows, channels, index.shape[0], codes.shape[1], groups,
        QMAX=fmt.qmax, GROUP=fmt.group, PACK4=fmt.pack4, BLOCK_R=_BLOCK_ROWS,
    )  # fmt: skip
    return out.reshape(shape)


def triton_int8_outlier_compress(x: torch.Tensor, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Triton twin of `torch_int8_outlier_compress` (same bits); ``index``:
    calibrated outlier channels, or None (see `_triton_compress`)."""
    return _triton_compress(INT8, x, index)


def triton_int8_outlier_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _triton_decompress(INT8, payload, shape, dtype)


def triton_int4_outlier_compress(x: torch.Tensor, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Triton twin of `torch_int4_outlier_compress` (same bits); ``index``:
    calibrated outlier channels, or None (see `_triton_compress`)."""
    return _triton_compress(INT4, x, index)


def triton_int4_outlier_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _triton_decompress(INT4, payload, shape, dtype)


# --------------------------------------------------------------------------
# Ops and codecs
# --------------------------------------------------------------------------


def _check_decompress(
    fmt: IntFormat, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> tuple[Any, ...]:
    shape = check_shape(shape, codec=fmt.name)
    check_output_dtype(dtype, codec=fmt.name, dtypes=_DTYPES)
    check_payload(payload, int_outlier_payload_spec(fmt, shape, dtype), codec=fmt.name)
    return shape


def _register(fmt: IntFormat) -> tuple[Any, Any]:
    return register_dispatched_ops(
        fmt.name,
        dtypes=_DTYPES,
        payload_spec=functools.partial(int_outlier_payload_spec, fmt),
        torch_impl=(functools.partial(_torch_compress, fmt), functools.partial(_torch_decompress, fmt)),
        triton_impl=(functools.partial(_triton_compress, fmt), functools.partial(_triton_decompress, fmt)),
    )


int8_outlier_compress_op, int8_outlier_decompress_op = _register(INT8)
int4_outlier_compress_op, int4_outlier_decompress_op = _register(INT4)


class IntOutlierCodec(OpCodec):
    """Group-wise int8/int4 with exact outlier channels (see module docstring)."""

    def __init__(self, fmt: IntFormat, error_bound: float, *, linear_inputs_only: bool) -> None:
        self.fmt = fmt
        self.name = fmt.name
        self.error_bound = error_bound
        #: int4 is kept to linear-layer inputs (its error on skewed values such
        #: as GELU outputs nears its bound); int8 stays far below its bound on
        #: every input family measured, so it is offered for any float value.
        self.linear_inputs_only = linear_inputs_only

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return int_outlier_payload_spec(self.fmt, shape, dtype)

    def calibration_parameters(self, x: torch.Tensor) -> torch.Tensor:
        """The outlier channels of ``x`` (int32 ``[K]``, ascending, on its
        device): the ones its compress would choose. Held by a calibrated
        plan as a constant, they spare the compress its pass of channel
        maxima and its sort (the payload is bit for bit the same on ``x``
        itself). On another batch a large value outside them only widens its
        group's scale (the error stays within the codec's worst case, see
        the module docstring); `adacc_compile.monitor` measures that drift
        with these parameters."""
        check_input(x, codec=self.name, dtypes=_DTYPES)
        x2d = _view2d(x.detach())
        return select_outlier_channels(torch_channel_absmax(x2d), outlier_slots(x2d.shape[1]))

    def triton_calibrated_compress(self, x: torch.Tensor, parameters: torch.Tensor) -> list[torch.Tensor]:
        """`_triton_compress` with the calibrated outlier channels: one read of ``x``."""
        return _triton_compress(self.fmt, x, parameters)

    def aten_compress(self, x: torch.Tensor, parameters: torch.Tensor | None = None) -> list[torch.Tensor]:
        """See `_aten_compress`; ``parameters``: the outlier channels."""
        return _aten_compress(self.fmt, x, parameters)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return _aten_decompress(self.fmt, payload, shape, dtype)

    def applies(self, query: ApplyQuery) -> bool:
        """Float values of the producer classes in `ACTIVATION_PRODUCERS`; for int4 only
        those a matmul reads in backward (inputs of linear layers).

        Refused where the payload would not be smaller than the tensor: narrow
        last dims, where codes padded to whole groups, the scale and the
        outlier slot of each row outweigh the data.
        """
        if not (
            query.dtype in _DTYPES
            and len(query.shape) >= 1
            and query.producer_class in ACTIVATION_PRODUCERS
            and ("matmul" in query.consumer_classes or not self.linear_inputs_only)
        ):
            return False
        original = numel_of([int(s) for s in query.shape]) * query.dtype.itemsize
        return self.compressed_nbytes(query.shape, query.dtype) < original

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Scratch bytes, from the structure of each implementation.

        Both compress paths need C-sized tensors for the outlier choice
        (scores, two sorts, the slot map); the kernels add only the per-chunk
        channel maxima, and their decompress only the slot map.
        The torch reference, on P = R x padded channels elements: compress
        holds a float32 copy (4P), the non-finite mask (P) and a second
        mask or the int8 codes (P); int8 codes are the payload. Decompress
        holds int8 codes (int4: unpacked, P, after 2P while unpacking), a
        float32 buffer (4P) and a mask (P), or the buffer beside its cast to
        ``dtype`` and the copy cut to C channels.
        """
        rows, channels = rows_channels(shape)
        groups = (channels + self.fmt.group - 1) // self.fmt.group
        padded = rows * groups * self.fmt.group
        choice = _CHANNEL_SCRATCH * channels + _SMALL
        if triton:
            chunks = (rows + _STATS_ROWS_PER_PROGRAM - 1) // _STATS_ROWS_PER_PROGRAM
            slots = 16 * channels + _SMALL  # slot map and int64 index
            return Workspace(compress=4 * chunks * channels + choice, decompress=slots)
        per_group = _GROUP_SCRATCH * rows * groups
        compress = 6 * padded - (0 if self.fmt.pack4 else padded) + per_group + choice
        index = 16 * outlier_slots(channels) + _SMALL  # the int64 copy of the index
        codes = padded if self.fmt.pack4 else 0
        result = rows * channels * dtype.itemsize
        cast = 0 if dtype == torch.float32 else padded * dtype.itemsize
        cut = result if padded != rows * channels else 0
        peak = max(2 * codes, codes + 5 * padded, 4 * padded + cast + cut)
        return Workspace(compress=compress, decompress=max(peak - result, 0) + per_group + index)

    def cost_seconds(self, shape: Sequence[int], dtype: torch.dtype, bandwidth_bytes_per_s: float) -> float:
        """The base model plus a read of x for the channel statistics, which
        must be known before any group is quantised (no producer epilogue
        can do both)."""
        extra = numel_of([int(s) for s in shape]) * dtype.itemsize
        return super().cost_seconds(shape, dtype, bandwidth_bytes_per_s) + extra / bandwidth_bytes_per_s

    def calibrate(self, samples: Sequence[torch.Tensor], parameters: torch.Tensor | None = None) -> CodecStats:
        """Round-trip error (as `OpCodec`, with ``parameters`` as the
        outlier channels when given) plus the outlier channels of the samples.

        A channel is reported as an outlier when its largest finite |x| over
        all samples exceeds `OUTLIER_RATIO` times the median channel's.
        ``extra["outlier_slot_coverage"]`` is the share of those channels
        that fit into the K slots (1.0 means K was large enough).

        Raises:
            ValueError: The samples disagree on the channel count.
        """
        base = super().calibrate(samples, parameters)
        if not samples:
            return base
        channel_counts = {rows_channels(x.shape)[1] for x in samples}
        if len(channel_counts) != 1:
            raise ValueError(f"{self.name}: samples have different channel counts {sorted(channel_counts)}")
        (channels,) = channel_counts
        score = torch.zeros(channels, dtype=torch.float32)
        for x in samples:
            score = torch.maximum(score, torch_channel_absmax(_view2d(x.detach())).cpu())
        median = float(score.median()) if channels else 0.0
        flagged = torch.nonzero(score > OUTLIER_RATIO * median).flatten() if median > 0 else score[:0]
        outliers = tuple(int(c) for c in flagged)
        slots = int(outlier_slots(channels))
        extra = dict(base.extra)
        extra["outlier_slots"] = float(slots)
        extra["outlier_slot_coverage"] = min(1.0, slots / len(outliers)) if outliers else 1.0
        return CodecStats(
            codec=self.name,
            outlier_channels=outliers,
            outlier_fraction=len(outliers) / channels if channels else 0.0,
            abs_max=base.abs_max,
            relative_error=base.relative_error,
            extra=extra,
        )


INT8_OUTLIER = REGISTRY.register(IntOutlierCodec(INT8, error_bound=0.015, linear_inputs_only=False))
INT4_OUTLIER = REGISTRY.register(IntOutlierCodec(INT4, error_bound=0.16, linear_inputs_only=True))
