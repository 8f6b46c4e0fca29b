"""Codec "softmax_u8": attention probabilities as uint8 on a fixed [0, 1] grid.

Why: softmax outputs are saved for the softmax backward (and the P @ V
backward) and are as large as the score matrix, but their range is known in
advance, so no scale needs storing: one byte per element, nothing else.

Grid: ``q = round(clamp(p, 0, 1) * 252)``, ``p_hat = q / 252``; the absolute
error is at most 1/504 (~0.002) and 0 and 1 are exact. Three codes are
reserved so non-finite values survive (the design requires it, and a NaN in
the probabilities is exactly what one wants to see again in backward):
253 = -Inf, 254 = +Inf, 255 = NaN. Reserving them costs 1.2% of resolution
against a 255-step grid.

Rounding is done as ``(trunc(p * 504) + 1) >> 1`` (round half up): one float
multiply followed by integer ops, so no fused multiply-add can change the
result and the torch reference and the Triton kernels agree bit for bit.

Error: a linear 8-bit grid is coarse for small probabilities, so the
relative Frobenius error depends on how peaked attention is (measured on
softmax of Gaussian logits, rows of L keys; SQNR in brackets):

    logit std   L=128          L=512          L=2048
    1 (flat)    0.094 (20 dB)  0.34  (9 dB)   0.74 (3 dB)
    2           0.035 (29 dB)  0.078 (22 dB)  0.17 (16 dB)
    4           0.010 (40 dB)  0.015 (36 dB)  0.020 (34 dB)
    8           0.004 (48 dB)  0.005 (46 dB)  0.006 (44 dB)

Declared bound 0.12: logit std >= 2 with up to 1024 keys. Flat attention
over long rows (every probability below 1/504) is where this codec is poor;
`calibrate` measures the real error so the planner can refuse it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import REGISTRY
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
    tl,
    triton_jit,
)

NAME = "softmax_u8"
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Steps of the [0, 1] grid; codes above it are reserved.
LEVELS = 252
NEG_INF_CODE = 253
POS_INF_CODE = 254
NAN_CODE = 255
_BLOCK = 1024
#: Workspace slack for the scalars of the torch reference.
_SMALL = 64


def softmax_u8_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """One uint8 code per element, shaped like the input."""
    return [(tuple(shape), torch.uint8)]


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def torch_softmax_u8_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Reference compress (see module docstring for the grid and codes)."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    # A finite sum means finite values (the usual case): the NaN/Inf passes
    # are then skipped. One owned float32 copy worked in place; (trunc(w) +
    # 1) >> 1 is a floor division in float32, exact for these small integers.
    finite = x.numel() == 0 or known_true(torch.isfinite(x.sum(dtype=torch.float32)), x)
    w = x.to(torch.float32, copy=True)
    if not finite:
        w.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    w.clamp_(0.0, 1.0).mul_(2 * LEVELS).trunc_().add_(1.0).div_(2.0, rounding_mode="floor")
    q = w.to(torch.uint8)  # 0..252
    del w
    if not finite:
        q.masked_fill_(torch.isnan(x), NAN_CODE)
        q.masked_fill_(torch.isposinf(x), POS_INF_CODE)
        q.masked_fill_(torch.isneginf(x), NEG_INF_CODE)
    return [q.reshape(x.shape)]


def torch_softmax_u8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Reference decompress: ``q * (1/252)`` in float32, reserved codes mapped back."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, softmax_u8_payload_spec(shape, dtype), codec=NAME)
    q = payload[0]
    p = q.float().mul_(1.0 / LEVELS)
    if q.numel() and not known_true(q.max() <= LEVELS, q):  # reserved codes present
        p.masked_fill_(q == NAN_CODE, float("nan"))
        p.masked_fill_(q == POS_INF_CODE, float("inf"))
        p.masked_fill_(q == NEG_INF_CODE, float("-inf"))
    return p.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py)
# --------------------------------------------------------------------------


def aten_softmax_u8_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """`torch_softmax_u8_compress` in float arithmetic up to one final cast
    to uint8 (what Inductor compiles well), the same codes."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    p = x.float()
    # NaN stays NaN through the clamp and ±Inf become 0 or 1: the codes of
    # all three are replaced below. The cast to uint8 truncates, which is
    # the floor of (trunc(w) + 1) / 2 (non-negative); fewer ops per element
    # matter: Inductor's C++ for this kernel is bound by them, not by memory.
    w = p.clamp(0.0, 1.0)
    q = (torch.trunc(w * (2 * LEVELS)) + 1.0) * 0.5
    q = torch.where(p != p, float(NAN_CODE), q)
    q = torch.where(p == float("inf"), float(POS_INF_CODE), q)
    q = torch.where(p == float("-inf"), float(NEG_INF_CODE), q)
    return [q.to(torch.uint8)]


def aten_softmax_u8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """`torch_softmax_u8_decompress` with the codes compared as floats."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, softmax_u8_payload_spec(shape, dtype), codec=NAME)
    q = byte_values(payload[0])  # one scalar load per 8 codes (see aten_graphs)
    p = q * (1.0 / LEVELS)
    p = torch.where(q == NAN_CODE, float("nan"), p)
    p = torch.where(q == POS_INF_CODE, float("inf"), p)
    p = torch.where(q == NEG_INF_CODE, float("-inf"), p)
    return p.to(dtype).reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _softmax_u8_compress_kernel(x_ptr, q_ptr, n, LEVELS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    finite = tl.abs(p) <= 3.4028234663852886e38
    w = tl.minimum(tl.maximum(tl.where(finite, p, 0.0), 0.0), 1.0) * (2 * LEVELS)
    q = (w.to(tl.int32) + 1) >> 1
    q = tl.where(p != p, LEVELS + 3, q)
    q = tl.where(p == p, tl.where(finite, q, tl.where(p > 0, LEVELS + 2, LEVELS + 1)), q)
    tl.store(q_ptr + offs, q.to(tl.uint8), mask=mask)


@triton_jit
def _softmax_u8_decompress_kernel(q_ptr, out_ptr, n, LEVELS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    q = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.int32)
    bits = (q.to(tl.float32) * (1.0 / LEVELS)).to(tl.int32, bitcast=True)
    bits = tl.where(q == LEVELS + 1, -8388608, bits)  # 0xFF800000, -Inf
    bits = tl.where(q == LEVELS + 2, 0x7F800000, bits)
    bits = tl.where(q == LEVELS + 3, 0x7FC00000, bits)
    p = bits.to(tl.float32, bitcast=True)
    tl.store(out_ptr + offs, rne_cast(p, out_ptr.dtype.element_ty), mask=mask)


def triton_softmax_u8_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_softmax_u8_compress` (same codes)."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    require_triton(x, _softmax_u8_compress_kernel)
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    n = x.numel()
    launch(_softmax_u8_compress_kernel, ((n + _BLOCK - 1) // _BLOCK,), x, q, n,
           LEVELS=LEVELS, BLOCK=_BLOCK)
    return [q]


def triton_softmax_u8_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """Triton twin of `torch_softmax_u8_decompress`."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, softmax_u8_payload_spec(shape, dtype), codec=NAME)
    q = payload[0].contiguous()
    require_triton(q, _softmax_u8_decompress_kernel)
    out = torch.empty(shape, dtype=dtype, device=q.device)
    n = out.numel()
    launch(_softmax_u8_decompress_kernel, ((n + _BLOCK - 1) // _BLOCK,), q, out, n,
           LEVELS=LEVELS, BLOCK=_BLOCK)
    return out


# --------------------------------------------------------------------------
# Ops and codec
# --------------------------------------------------------------------------


softmax_u8_compress_op, softmax_u8_decompress_op = register_dispatched_ops(
    NAME,
    dtypes=_DTYPES,
    payload_spec=softmax_u8_payload_spec,
    torch_impl=(torch_softmax_u8_compress, torch_softmax_u8_decompress),
    triton_impl=(triton_softmax_u8_compress, triton_softmax_u8_decompress),
)


class SoftmaxU8Codec(OpCodec):
    """Fixed-range 8-bit probabilities (see module docstring)."""

    name = NAME
    lossless = False
    error_bound = 0.12

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return softmax_u8_payload_spec(shape, dtype)

    def aten_compress(self, x: torch.Tensor) -> list[torch.Tensor]:
        return aten_softmax_u8_compress(x)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return aten_softmax_u8_decompress(payload, shape, dtype)

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Torch reference: compress works on a float32 copy of x; decompress
        builds the result in float32 and needs one bool mask at a time. The
        kernels need nothing."""
        if triton:
            return Workspace()
        return Workspace(
            compress=float32_scratch(shape) + _SMALL,
            decompress=float32_result_scratch(shape, dtype) + _SMALL,
        )

    def applies(self, query: ApplyQuery) -> bool:
        """Only softmax outputs: the fixed [0, 1] grid is wrong for anything
        else, log-softmax (same op class, values in (-inf, 0]) included."""
        return (
            query.producer_class == "softmax"
            and "log_softmax" not in query.producer_target
            and query.dtype in _DTYPES
            and numel_of(query.shape) > 0
        )


SOFTMAX_U8 = REGISTRY.register(SoftmaxU8Codec())
