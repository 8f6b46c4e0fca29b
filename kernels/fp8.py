"""Codecs "fp8_e4m3" and "fp8_e5m2": float activations as 8-bit floats, one scale per row.

Why fp8: a floating-point code keeps the *relative* precision of every element
(3 or 2 mantissa bits) whatever its magnitude, which suits activations with a
wide dynamic range better than a linear int8 grid, at 1 byte per element.

Why per-row power-of-two scales: a row (the last dimension; a 0-d or 1-d
tensor is one row) is scaled so its largest finite magnitude lands in
``[2**TOP, 2**(TOP+1))`` (128..256 for e4m3, 16384..32768 for e5m2). A power
of two makes scaling and unscaling exact, so the only error is the fp8
rounding itself and the torch reference and the Triton kernels agree bit for
bit. The top binade of each format is left unused; that costs one binade of
dynamic range, never precision, and frees the codes that encode ±Inf.

Non-finite values: the scale comes from finite values only, so a NaN or Inf
never poisons its row; NaN is stored as code 0x7F and ±Inf as 0x7E / 0xFE
(e4m3fn has no Inf; these codes mean ±448, which the scaling never produces)
or the native 0x7C / 0xFC (e5m2). Every payload size follows from shape alone.

Payload: ``codes`` (uint8 holding fp8 bit patterns, same shape as the input)
and ``scales`` (float32, one per row). ``x_hat = fp8(codes) * scales[row]``.

Calibrated scale (fp8_e5m2 only; `Fp8Codec.calibration_parameters`, the
aten form only): a row's scale needs the row's maximum before its first
code, and Inductor's CPU code computes that maximum and the codes in two
loops over all rows, so the value is read from memory a second time
(2.2-2.4 copies of the value for fp8_e5m2 inside a compiled graph,
LayerNorm -> matmul, against 0.4-0.7 for a plain one-byte cast;
bench/RESULTS.md). A calibrated plan instead holds one power of two
measured on the calibration batch (its largest finite |x| scaled into
``[2**calibrated_top, 2**(calibrated_top+1))``, ten binades below the
per-row placement) and writes it as every row's scale: the codes are then
elementwise, and Inductor writes them in the producer's own loop (1.2-1.9
copies in the same graphs). The payload and the decompress are the same.
The headroom is the price: a finite value more than ``saturation /
2**(calibrated_top+1)`` times the calibrated maximum (1792-3584x)
saturates to ``±saturation`` (its error is then its excess; NaN and ±Inf
keep their codes), and values far below the tensor's maximum meet the
subnormal range sooner than with a scale per row (below 2**-18 of the
maximum; the measured errors of the test families did not move in the
fourth digit). The calibrate pass measures the error with the calibrated
scale and drops the option above the declared bound, and the monitor
measures it again during training (`adacc_compile.monitor`), so
activations that outgrow the headroom show as drift and the replan
measures a new scale. e4m3 takes none: its 15 binades leave little
headroom, and with its values nearer the subnormal range torch's e4m3
casts (which branch on subnormal lanes) made the calibrated form slower
in the same graphs (3.9-4.4 copies against 2.8-3.0 per row).

Error (relative Frobenius, checked by ``tests/kernels/test_fp8.py`` on
Gaussian, LayerNorm, GELU/ReLU-output, Student-t and outlier-channel
activations in fp32 and bf16): 0.026-0.027 (SQNR 31.5 dB) for e4m3 and
0.052-0.054 (25.5 dB) for e5m2, nearly independent of the data because the
format is relative. Per element the worst case in the normal range is half
an ulp, 2**-4 and 2**-3. Declared bounds: 0.03 and 0.06.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from . import REGISTRY
from . import aten_graphs
from .aten_graphs import byte_values
from .codec import ApplyQuery
from .oplib import (
    OpCodec,
    PayloadSpec,
    Workspace,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    float32_result_scratch,
    float32_scratch,
    known_true,
    launch,
    numel_of,
    register_dispatched_ops,
    require_triton,
    rne_cast,
    row_tile,
    rows_channels,
    tl,
    triton_jit,
)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Elements per Triton program tile (rows x columns) where rows are narrow
#: (`oplib.row_tile`: a wide row is one program's tile, up to
#: `oplib.ONE_PASS_MAX_COLUMNS`).
_TILE = 2048
#: Workspace slack for the scalars of the torch reference.
_SMALL = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Fp8Format:
    """Bit layout of one fp8 format and the codes reserved for non-finite values."""

    name: str
    torch_dtype: torch.dtype
    #: Mantissa bits.
    mantissa_bits: int
    #: Unbiased exponent of the smallest normal number (1 - bias).
    min_exponent: int
    #: A row's largest finite magnitude is scaled into [2**top, 2**(top+1)).
    top: int
    nan_code: int
    pos_inf_code: int
    neg_inf_code: int
    #: Declared relative Frobenius error on realistic activations.
    error_bound: float
    #: Largest magnitude a calibrated compress writes; finite values beyond
    #: it saturate. Below the reserved ±Inf codes (e4m3fn: 448; e5m2: Inf).
    saturation: float
    #: A calibrated scale puts the calibration value's largest finite |x|
    #: into [2**calibrated_top, 2**(calibrated_top+1)) (see the module
    #: docstring); None: the format takes no calibrated scale.
    calibrated_top: int | None = None


E4M3 = Fp8Format(
    name="fp8_e4m3",
    torch_dtype=torch.float8_e4m3fn,
    mantissa_bits=3,
    min_exponent=-6,
    top=7,
    nan_code=0x7F,
    pos_inf_code=0x7E,
    neg_inf_code=0xFE,
    error_bound=0.03,
    saturation=416.0,
)
E5M2 = Fp8Format(
    name="fp8_e5m2",
    torch_dtype=torch.float8_e5m2,
    mantissa_bits=2,
    min_exponent=-14,
    top=14,
    nan_code=0x7F,
    pos_inf_code=0x7C,
    neg_inf_code=0xFC,
    error_bound=0.06,
    saturation=57344.0,
    calibrated_top=4,
)



def fp8_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """uint8 codes shaped like the input plus one float32 scale per row."""
    rows, _ = rows_channels(shape)
    return [(tuple(shape), torch.uint8), ((rows,), torch.float32)]


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float32, built from bits (exact; exponent in [-126, 127])."""
    return ((exponent + 127) << 23).view(torch.float32)


def _scale_exponent(amax: torch.Tensor, fmt: Fp8Format, top: int | None = None) -> torch.Tensor:
    """Power-of-two exponent putting ``amax`` into [2**top, 2**(top+1))
    (``top``: the format's per-row placement unless given); 0 for 0."""
    e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
    s = (e - (fmt.top if top is None else top)).clamp(-126, 126)
    return torch.where(amax == 0, 0, s)


def _canonical_nan(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes with the negative NaN code 0xFF made 0x7F (both formats
    encode NaN as 0x7F | sign, and torch's cast keeps a NaN's sign): byte
    arithmetic, ``c & (255 - (((c & 127) + 1) & 128))``, which clears bit 7
    exactly where the low seven bits are all ones. It replaces a select on
    the float value, which cost 0.4-0.8 copies of the value more in
    Inductor's AVX512 code (its masks go through vectors and back; 4096 x
    1024 float32, 1 thread, medians of 15 interleaved rounds)."""
    return codes & (255 - (((codes & 127) + 1) & 128))


def check_calibrated_scale(scale: torch.Tensor, device: torch.device, *, codec: str) -> torch.Tensor:
    """``scale`` as a calibrated fp8 scale for a value on ``device``:
    float32 of shape (1,) (its value is a power of two by construction,
    `fp8_calibrated_scale`; not read here, so fake tensors pass)."""
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != (1,):
        raise ValueError(f"{codec}: a calibrated scale is a float32 tensor of shape (1,), got {_describe(scale)}")
    if scale.device != torch.device(device):
        raise ValueError(f"{codec}: calibrated scale on {scale.device}, the value on {device}")
    return scale


def _describe(t: Any) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def fp8_calibrated_scale(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """The calibrated scale of ``x`` (float32 ``[1]``, a power of two, on
    ``x``'s device): ``x``'s largest finite |x| divided by it lies in
    ``[2**fmt.calibrated_top, 2**(fmt.calibrated_top+1))``; 1 when ``x``
    holds no finite non-zero value."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    if fmt.calibrated_top is None:
        raise ValueError(f"{fmt.name}: takes no calibrated scale")
    if x.numel() == 0:
        return torch.ones(1, dtype=torch.float32, device=x.device)
    a = x.detach().abs().float()
    amax = torch.where(a < float("inf"), a, 0.0).amax().reshape(1)
    return _pow2(_scale_exponent(amax, fmt, fmt.calibrated_top))


def torch_fp8_compress(x: torch.Tensor, fmt: Fp8Format) -> list[torch.Tensor]:
    """Reference compress: per-row pow2 scale, torch's own round-to-nearest fp8 cast."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    rows, cols = rows_channels(x.shape)
    if x.numel() == 0:
        return [torch.empty(x.shape, dtype=torch.uint8, device=x.device),
                torch.ones(rows, dtype=torch.float32, device=x.device)]
    x2 = x.reshape(rows, cols)
    # The row maxima of x itself first: where they are finite, so is every
    # value (the usual case), and the NaN/Inf passes are skipped. Otherwise
    # one owned float32 copy is zeroed where x is not finite and scaled in
    # place, and the codes of non-finite values are filled in from x.
    low, high = torch.aminmax(x2, dim=1)
    amax = torch.maximum(high, low.neg_()).abs_().float()  # max |x|; abs() turns -0.0 into 0.0
    finite = known_true(torch.isfinite(amax).all(), x)
    v = x2.to(torch.float32, copy=True)
    if not finite:
        v.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        low, high = torch.aminmax(v, dim=1)
        amax = torch.maximum(high, low.neg_()).abs_()
    s = _scale_exponent(amax, fmt)
    codes = v.mul_(_pow2(-s)[:, None]).to(fmt.torch_dtype).view(torch.uint8)
    del v
    if not finite:
        codes.masked_fill_(torch.isnan(x2), fmt.nan_code)
        codes.masked_fill_(torch.isposinf(x2), fmt.pos_inf_code)
        codes.masked_fill_(torch.isneginf(x2), fmt.neg_inf_code)
    return [codes.reshape(x.shape), _pow2(s)]


def torch_fp8_compress_calibrated(x: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format) -> list[torch.Tensor]:
    """Reference of the calibrated compress (see the module docstring):
    every row scaled by the one calibrated power of two ``scale``, finite
    values saturated at ``±fmt.saturation``, torch's round-to-nearest fp8
    cast; NaN as 0x7F, ±Inf as the format's Inf codes. The payload is the
    uncalibrated one's, with ``scale`` as every row's scale."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    scale = check_calibrated_scale(scale, x.device, codec=fmt.name)
    rows, cols = rows_channels(x.shape)
    scales = scale.expand(rows).contiguous()
    if x.numel() == 0:
        return [torch.empty(x.shape, dtype=torch.uint8, device=x.device), scales]
    x2 = x.reshape(rows, cols)
    v = x2.float() * (1.0 / scale)  # exact: a power of two (a huge finite x may overflow to ±Inf here)
    v = torch.where(torch.isfinite(x2), v.clamp(-fmt.saturation, fmt.saturation), v)
    codes = v.to(fmt.torch_dtype).view(torch.uint8)
    codes.masked_fill_(torch.isnan(x2), fmt.nan_code)
    return [codes.reshape(x.shape), scales]


def torch_fp8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, fmt: Fp8Format
) -> torch.Tensor:
    """Reference decompress: ``fp8(codes) * scale`` per row, Inf codes mapped back."""
    shape = check_shape(shape, codec=fmt.name)
    check_output_dtype(dtype, codec=fmt.name, dtypes=_DTYPES)
    check_payload(payload, fp8_payload_spec(shape, dtype), codec=fmt.name)
    codes, scales = payload
    rows, cols = rows_channels(shape)
    if numel_of(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=codes.device)
    c2 = codes.reshape(rows, cols)
    vals = c2.view(fmt.torch_dtype).float().mul_(scales[:, None])
    # The reserved Inf codes and the NaN codes are the largest magnitudes:
    # below them (the usual case), nothing needs patching.
    if not known_true((c2 & 0x7F).max() < fmt.pos_inf_code & 0x7F, codes):
        vals.masked_fill_(c2 == fmt.pos_inf_code, float("inf"))
        vals.masked_fill_(c2 == fmt.neg_inf_code, float("-inf"))
    return vals.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py). With AVX512
# vectors it is torch's own fp8 cast (`native_fp8_casts`). Otherwise it is
# the rounding of the Triton kernels below: Inductor's AVX2 code runs
# torch's fp8 casts element by element (compress: 4.6x a float32 copy,
# measured) and integer -> one-byte casts slowly; exponent bits, then
# floats, then one cast to uint8 stay vectorised. Decompress builds float32
# bits from the code.
# --------------------------------------------------------------------------


def _aten_encode(v: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """fp8 code (as a float in 0..255) of finite, pre-scaled float32 ``v``
    (``|v|`` at most the format's largest finite value, ``fmt.saturation``
    for e5m2, 416 for e4m3fn), rounded to nearest even: the same bits as
    ``v.to(fmt.torch_dtype)`` (checked on every float32 of that range).

    Normal codes round the float32 bits themselves (add half a code ulp
    less one, plus the lowest kept bit, then shift: a mantissa carry moves
    into the exponent as it should); subnormal ones are ``|v|`` in units of
    the smallest subnormal, rounded. One float -> int32 view per element:
    each view is a stack round trip in Inductor's C++ (the former form,
    with a second view building 2**-e, ran at ~1.5x a float32 copy alone
    on AVX2)."""
    m_bits, emin = fmt.mantissa_bits, fmt.min_exponent
    bits = v.view(torch.int32)
    magnitude_bits = bits & 0x7FFFFFFF
    shift = 23 - m_bits
    rounded = (magnitude_bits + ((1 << (shift - 1)) - 1) + ((magnitude_bits >> shift) & 1)) >> shift
    normal = (rounded - ((127 + emin - 1) << m_bits)).float()
    a = v.abs()
    subnormal = torch.round(a * float(2.0 ** (m_bits - emin)))  # exact scaling; ties to even
    return torch.where(a < 2.0**emin, subnormal, normal) + torch.where(bits < 0, 128.0, 0.0)


def _aten_decode(code: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Float32 value of fp8 codes (int32, 0..255); the NaN codes and the
    reserved ±Inf codes are patched by the caller. Normal codes become the
    float32 bits of their value (exact); subnormal ones (exponent field 0)
    are mantissa * 2**(EMIN - M)."""
    m_bits = fmt.mantissa_bits
    field = (code >> m_bits) & ((1 << (7 - m_bits)) - 1)
    mantissa = code & ((1 << m_bits) - 1)
    normal = (((field + (127 + fmt.min_exponent - 1)) << 23) | (mantissa << (23 - m_bits))).view(torch.float32)
    value = torch.where(field == 0, mantissa.float() * 2.0 ** (fmt.min_exponent - m_bits), normal)
    return torch.where(code >= 128, -value, value)


def native_fp8_casts(device: torch.device) -> bool:
    """Whether Inductor's code for ``device`` casts float32 <-> fp8 in
    vectors: on a CPU whose vectors are AVX512 (`aten_graphs.vector_lanes`;
    ATen has vectorised fp8 conversions there), where torch's own cast is
    then both the reference's rounding and the fastest form (compress +
    decompress at ~1.3x a float32 copy standalone, measured; the bit-level
    encode below ran at 2.3x in a graph). With AVX2 the casts run element
    by element; on a GPU the bit-level form is the one the Triton kernels
    use (hardware casts differ across generations)."""
    return torch.device(device).type == "cpu" and aten_graphs.vector_lanes(device) > 8


def aten_fp8_compress(x: torch.Tensor, fmt: Fp8Format, scale: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`torch_fp8_compress` written for Inductor (same codes and scales);
    with a calibrated ``scale``, `torch_fp8_compress_calibrated`: no
    statistics, the codes elementwise."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    if scale is not None:
        scale = check_calibrated_scale(scale, x.device, codec=fmt.name)
    if x.numel() == 0:
        return torch_fp8_compress(x, fmt) if scale is None else torch_fp8_compress_calibrated(x, scale, fmt)
    rows, cols = rows_channels(x.shape)
    v = x.reshape(rows, cols).float()
    # |v| < inf is false exactly at NaN and ±Inf.
    ok = v.abs() < float("inf")
    if scale is None:
        s = _scale_exponent(torch.where(ok, v.abs(), 0.0).amax(dim=1), fmt)
        scaled, scales = v * _pow2(-s)[:, None], _pow2(s)
    else:
        # Saturated where finite (a finite x beyond the range may overflow
        # to ±Inf in the product, and saturates too); ±Inf and NaN pass.
        product = v * aten_graphs.divide(1.0, scale)  # exact where Inductor compiles it (Triton too)
        scaled = torch.where(ok, product.clamp(-fmt.saturation, fmt.saturation), product)
        scales = scale.expand(rows).contiguous()
    if native_fp8_casts(x.device):
        # torch's cast saturates ±Inf to the reserved ±Inf codes of both
        # formats already (e4m3fn: ±448; e5m2: ±Inf) and gives NaN as
        # 0x7F | its sign, which `_canonical_nan` makes 0x7F.
        return [_canonical_nan(scaled.reshape(x.shape).to(fmt.torch_dtype).view(torch.uint8)), scales]
    code = _aten_encode(torch.where(ok, scaled, 0.0), fmt)
    special = torch.where(
        v != v, float(fmt.nan_code), torch.where(v > 0, float(fmt.pos_inf_code), float(fmt.neg_inf_code))
    )
    code = torch.where(ok, code, special)
    return [code.to(torch.uint8).reshape(x.shape), scales]


def aten_fp8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, fmt: Fp8Format
) -> torch.Tensor:
    """`torch_fp8_decompress` written for Inductor (same values; NaN is the
    canonical quiet NaN)."""
    shape = check_shape(shape, codec=fmt.name)
    check_output_dtype(dtype, codec=fmt.name, dtypes=_DTYPES)
    check_payload(payload, fp8_payload_spec(shape, dtype), codec=fmt.name)
    if numel_of(shape) == 0:
        return torch_fp8_decompress(payload, shape, dtype, fmt)
    codes, scales = payload
    rows, cols = rows_channels(shape)
    if native_fp8_casts(codes.device):
        # NaN codes and e5m2's ±Inf codes decode as such; e4m3fn's reserved
        # ±Inf codes decode as ±448, which no finite code reaches (a row is
        # scaled below 2**(top+1) = 256).
        value = codes.reshape(rows, cols).view(fmt.torch_dtype).float()
        scale = scales[:, None]
        if fmt.mantissa_bits == 3:  # a select of the factor, not of the product: 0.92x a copy, not 1.17x
            scale = torch.where(value.abs() == 448.0, float("inf"), scale)
        return (value * scale).to(dtype).reshape(shape)
    code = byte_values(codes).reshape(rows, cols).to(torch.int32)  # see aten_graphs.byte_values
    value = _aten_decode(code, fmt) * scales[:, None]
    low = code & 0x7F
    if fmt.mantissa_bits == 3:
        nan = low == 0x7F
    else:
        nan = low > 0x7C  # exponent field all ones, mantissa not 0
    value = torch.where(nan, float("nan"), value)
    value = torch.where(code == fmt.pos_inf_code, float("inf"), value)
    value = torch.where(code == fmt.neg_inf_code, float("-inf"), value)
    return value.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels: fp8 rounding by integer ops (the interpreter's fp8 cast
# truncates, and hardware casts differ across GPU generations).
# --------------------------------------------------------------------------


@triton_jit
def _pow2_t(exponent):
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


@triton_jit
def _finite_abs(x):
    ax = tl.abs(x)
    return tl.where(ax <= 3.4028234663852886e38, ax, 0.0)


@triton_jit
def _encode(x, inv, M: tl.constexpr, EMIN: tl.constexpr, NAN_CODE: tl.constexpr,
            POS_CODE: tl.constexpr, NEG_CODE: tl.constexpr):
    # Round |v| to the fp8 grid: quantum 2**(max(e, EMIN) - M), ties to even.
    finite = tl.abs(x) <= 3.4028234663852886e38
    v = tl.where(finite, x, 0.0) * inv
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    w = tl.abs(v) * _pow2_t(M - e)  # exact: power-of-two scaling, w < 2**(M+1)
    k = w.to(tl.int32)
    frac = w - k.to(tl.float32)
    k += ((frac > 0.5) | ((frac == 0.5) & ((k & 1) == 1))).to(tl.int32)
    code = (((e - EMIN) << M) + k) | ((bits >> 24) & 0x80)
    code = tl.where(x != x, NAN_CODE, code)
    code = tl.where(finite | (x != x), code, tl.where(x > 0, POS_CODE, NEG_CODE))
    return code.to(tl.uint8)


@triton_jit
def _decode(c, scale, M: tl.constexpr, EMIN: tl.constexpr, POS_CODE: tl.constexpr,
            NEG_CODE: tl.constexpr):
    c = c.to(tl.int32)
    f = (c >> M) & ((1 << (7 - M)) - 1)
    m = c & ((1 << M) - 1)
    k = tl.where(f == 0, m, m + (1 << M))
    val = k.to(tl.float32) * _pow2_t(tl.maximum(f, 1) - 1 + EMIN - M)
    val = tl.where((c & 0x80) != 0, -val, val) * scale
    if M == 3:
        is_nan = (c & 0x7F) == 0x7F
    else:
        is_nan = (f == 31) & (m != 0)
    bits = val.to(tl.int32, bitcast=True)
    bits = tl.where(is_nan, 0x7FC00000, bits)
    bits = tl.where(c == POS_CODE, 0x7F800000, bits)
    bits = tl.where(c == NEG_CODE, -8388608, bits)  # 0xFF800000
    return bits.to(tl.float32, bitcast=True)


@triton_jit
def _fp8_compress_kernel(x_ptr, codes_ptr, scale_ptr, rows, cols,
                         M: tl.constexpr, EMIN: tl.constexpr, TOP: tl.constexpr,
                         NAN_CODE: tl.constexpr, POS_CODE: tl.constexpr,
                         NEG_CODE: tl.constexpr, R: tl.constexpr, BLOCK_C: tl.constexpr,
                         ONE_TILE: tl.constexpr):
    # A program owns R whole rows. Rows up to oplib.ONE_PASS_MAX_COLUMNS
    # wide fit one tile and are read once; wider rows are read twice (max
    # pass, encode pass).
    row = tl.program_id(0) * R + tl.arange(0, R)
    row_ok = row < rows
    base = row.to(tl.int64) * cols
    col = tl.arange(0, BLOCK_C)
    if ONE_TILE:
        mask = row_ok[:, None] & (col[None, :] < cols)
        offs = base[:, None] + col[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(_finite_abs(x), axis=1)
    else:
        amax = tl.zeros([R], dtype=tl.float32)
        for c0 in range(0, cols, BLOCK_C):
            cc = c0 + col
            m2 = row_ok[:, None] & (cc[None, :] < cols)
            xt = tl.load(x_ptr + base[:, None] + cc[None, :], mask=m2, other=0.0)
            amax = tl.maximum(amax, tl.max(_finite_abs(xt.to(tl.float32)), axis=1))
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.where(amax == 0, 0, tl.minimum(tl.maximum(e - TOP, -126), 126))
    tl.store(scale_ptr + row, _pow2_t(s), mask=row_ok)
    inv = _pow2_t(-s)[:, None]
    if ONE_TILE:
        code = _encode(x, inv, M, EMIN, NAN_CODE, POS_CODE, NEG_CODE)
        tl.store(codes_ptr + offs, code, mask=mask)
    else:
        for c0 in range(0, cols, BLOCK_C):
            cc = c0 + col
            m2 = row_ok[:, None] & (cc[None, :] < cols)
            offs2 = base[:, None] + cc[None, :]
            xt = tl.load(x_ptr + offs2, mask=m2, other=0.0).to(tl.float32)
            code = _encode(xt, inv, M, EMIN, NAN_CODE, POS_CODE, NEG_CODE)
            tl.store(codes_ptr + offs2, code, mask=m2)


@triton_jit
def _fp8_decompress_kernel(codes_ptr, scale_ptr, out_ptr, rows, cols,
                           M: tl.constexpr, EMIN: tl.constexpr, POS_CODE: tl.constexpr,
                           NEG_CODE: tl.constexpr, R: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0) * R + tl.arange(0, R)
    row_ok = row < rows
    base = row.to(tl.int64) * cols
    scale = tl.load(scale_ptr + row, mask=row_ok, other=1.0)[:, None]
    col = tl.arange(0, BLOCK_C)
    for c0 in range(0, cols, BLOCK_C):
        cc = c0 + col
        mask = row_ok[:, None] & (cc[None, :] < cols)
        offs = base[:, None] + cc[None, :]
        c = tl.load(codes_ptr + offs, mask=mask, other=0)
        val = _decode(c, scale, M, EMIN, POS_CODE, NEG_CODE)
        tl.store(out_ptr + offs, rne_cast(val, out_ptr.dtype.element_ty), mask=mask)


def triton_fp8_compress(x: torch.Tensor, fmt: Fp8Format) -> list[torch.Tensor]:
    """Triton twin of `torch_fp8_compress` (same bytes and scales)."""
    check_input(x, codec=fmt.name, dtypes=_DTYPES)
    require_triton(x, _fp8_compress_kernel)
    rows, cols = rows_channels(x.shape)
    x = x.contiguous()
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scales = torch.ones(rows, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return [codes, scales]
    t = row_tile(rows, cols, tile=_TILE)
    launch(_fp8_compress_kernel, ((rows + t.rows - 1) // t.rows,), x, codes, scales, rows, cols,
           M=fmt.mantissa_bits, EMIN=fmt.min_exponent, TOP=fmt.top, NAN_CODE=fmt.nan_code,
           POS_CODE=fmt.pos_inf_code, NEG_CODE=fmt.neg_inf_code, R=t.rows, BLOCK_C=t.block_cols,
           ONE_TILE=t.one_pass, num_warps=t.num_warps)
    return [codes, scales]


def triton_fp8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, fmt: Fp8Format
) -> torch.Tensor:
    """Triton twin of `torch_fp8_decompress`."""
    shape = check_shape(shape, codec=fmt.name)
    check_output_dtype(dtype, codec=fmt.name, dtypes=_DTYPES)
    check_payload(payload, fp8_payload_spec(shape, dtype), codec=fmt.name)
    codes, scales = (t.contiguous() for t in payload)
    require_triton(codes, _fp8_decompress_kernel)
    rows, cols = rows_channels(shape)
    out = torch.empty(shape, dtype=dtype, device=codes.device)
    if out.numel() == 0:
        return out
    t = row_tile(rows, cols, tile=_TILE)
    launch(_fp8_decompress_kernel, ((rows + t.rows - 1) // t.rows,), codes, scales, out, rows, cols,
           M=fmt.mantissa_bits, EMIN=fmt.min_exponent, POS_CODE=fmt.pos_inf_code,
           NEG_CODE=fmt.neg_inf_code, R=t.rows, BLOCK_C=t.block_cols, num_warps=t.num_warps)
    return out


# --------------------------------------------------------------------------
# Ops and codecs
# --------------------------------------------------------------------------


class Fp8Codec(OpCodec):
    """Per-row power-of-two-scaled fp8 (see module docstring)."""

    lossless = False

    def __init__(self, fmt: Fp8Format) -> None:
        self.fmt = fmt
        self.name = fmt.name
        self.error_bound = fmt.error_bound

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return fp8_payload_spec(shape, dtype)

    def calibration_parameters(self, x: torch.Tensor) -> torch.Tensor | None:
        """The calibrated scale of ``x`` (`fp8_calibrated_scale`): with it
        the compress is elementwise (see the module docstring). None for
        e4m3, which takes none."""
        if self.fmt.calibrated_top is None:
            check_input(x, codec=self.name, dtypes=_DTYPES)
            return None
        return fp8_calibrated_scale(x, self.fmt)

    def aten_compress(self, x: torch.Tensor, parameters: torch.Tensor | None = None) -> list[torch.Tensor]:
        """See `aten_fp8_compress`; ``parameters``: the calibrated scale."""
        return aten_fp8_compress(x, self.fmt, parameters)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return aten_fp8_decompress(payload, shape, dtype, self.fmt)

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Torch reference: compress scales a float32 copy of x (plus a few
        float32 / int32 values per row); decompress builds its result in
        float32. The kernels need nothing."""
        if triton:
            return Workspace()
        rows, _ = rows_channels(shape)
        return Workspace(
            compress=float32_scratch(shape) + 32 * int(rows) + _SMALL,
            decompress=float32_result_scratch(shape, dtype) + _SMALL,
        )

    def applies(self, query: ApplyQuery) -> bool:
        """Floating activations whose payload is smaller than the original.

        Rows shorter than ~4 elements (fp32) or ~8 (fp16/bf16) do not pay for
        their float32 scale, so they are refused.
        """
        if query.dtype not in _DTYPES:
            return False
        original = numel_of(query.shape) * torch.empty((), dtype=query.dtype).element_size()
        return self.compressed_nbytes(query.shape, query.dtype) < original


def _register(fmt: Fp8Format) -> Fp8Codec:
    register_dispatched_ops(
        fmt.name,
        dtypes=_DTYPES,
        payload_spec=fp8_payload_spec,
        torch_impl=(
            functools.partial(torch_fp8_compress, fmt=fmt),
            functools.partial(torch_fp8_decompress, fmt=fmt),
        ),
        triton_impl=(
            functools.partial(triton_fp8_compress, fmt=fmt),
            functools.partial(triton_fp8_decompress, fmt=fmt),
        ),
    )
    return REGISTRY.register(Fp8Codec(fmt))


FP8_E4M3 = _register(E4M3)
FP8_E5M2 = _register(E5M2)
