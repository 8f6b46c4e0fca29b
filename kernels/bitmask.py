"""Codec "bitmask": boolean tensors at one bit per element, lossless.

Why: torch stores a bool in a whole byte, and the masks autograd saves
(dropout keep-masks, ReLU ``x > 0`` signs, attention masks) are pure bools,
so packing eight per byte cuts them 8x at memory-copy cost and no error.

Layout: plane-major. The tensor is flattened in row-major order, padded
with False to ``8 * M`` elements (M = ``ceil(numel / 8)``) and viewed as
``[8, M]``; byte ``i`` holds element ``(j, i)``, that is element
``j * M + i``, in bit ``j`` (least significant first). Payload: one uint8
tensor of M bytes.

Why planes and not eight neighbours per byte: each plane is a contiguous
slice, so packing and unpacking are elementwise over contiguous memory,
which Inductor's C++ vectorises fully (see `aten_graphs.pack_planes`);
gathering neighbours into a byte is horizontal work per byte.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import REGISTRY
from .aten_graphs import pack_planes, unpack_planes
from .codec import ApplyQuery, CodecStats
from .oplib import (
    OpCodec,
    PayloadSpec,
    Workspace,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    launch,
    numel_of,
    register_dispatched_ops,
    require_triton,
    tl,
    triton_jit,
)

NAME = "bitmask"
_DTYPES = (torch.bool,)
#: Bytes written per Triton program (8 input elements each).
_BLOCK_BYTES = 1024
#: Workspace slack for the torch reference's scalars.
_SMALL = 64


def bitmask_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """One uint8 byte per eight elements, rounded up."""
    return [(((numel_of(shape) + 7) // 8,), torch.uint8)]


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def torch_bitmask_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Packs ``x`` (bool) eight planes per byte (see module docstring).

    Stays in uint8 throughout, ORing one shifted plane at a time into the
    result: one plane-sized temporary, no widening.
    """
    check_input(x, codec=NAME, dtypes=_DTYPES)
    flat = x.reshape(-1).view(torch.uint8)  # reshape copies non-contiguous input once
    n = flat.numel()
    nbytes = (n + 7) // 8
    # Padding copies the input; only a tail that is not a whole byte needs it.
    planes = (flat if n % 8 == 0 else F.pad(flat, (0, nbytes * 8 - n))).view(8, nbytes)
    packed = planes[0].clone()
    for j in range(1, 8):
        packed.bitwise_or_(planes[j] << j)
    return [packed]


def torch_bitmask_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """Unpacks the bytes back into a bool tensor of ``shape``."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, bitmask_payload_spec(shape, dtype), codec=NAME)
    packed = payload[0]
    # The 0/1 bytes are written plane by plane into one uint8 buffer, which
    # then is the bool result: no second tensor of the output's size.
    bits = torch.empty(8, packed.numel(), dtype=torch.uint8, device=packed.device)
    for j in range(8):
        torch.bitwise_right_shift(packed, j, out=bits[j])
    bits.bitwise_and_(1)
    return bits.view(torch.bool).reshape(-1)[: numel_of(shape)].reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py)
# --------------------------------------------------------------------------


def aten_bitmask_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """`torch_bitmask_compress` as a float sum of the eight planes (exact),
    cast once: Inductor's CPU code handles one-byte arithmetic and bool
    vectors poorly, floats well (see `aten_graphs.pack_planes`)."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    flat = x.reshape(-1).float()
    n = flat.numel()
    nbytes = (n + 7) // 8
    return [pack_planes(flat if n % 8 == 0 else F.pad(flat, (0, nbytes * 8 - n)))]


def aten_bitmask_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """`torch_bitmask_decompress`: each plane is the payload shifted,
    compared to 0 once (see `aten_graphs.unpack_planes`)."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, bitmask_payload_spec(shape, dtype), codec=NAME)
    return unpack_planes(payload[0], shape) != 0


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _bitmask_pack_kernel(x_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    # One program packs BLOCK bytes: the same BLOCK columns of all 8 planes.
    byte = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    word = tl.zeros([BLOCK], dtype=tl.int32)
    for plane in tl.static_range(8):
        idx = plane * nbytes + byte
        v = tl.load(x_ptr + idx, mask=(byte < nbytes) & (idx < n), other=0)
        word = word | ((v != 0).to(tl.int32) << plane)
    tl.store(out_ptr + byte, word.to(tl.uint8), mask=byte < nbytes)


@triton_jit
def _bitmask_unpack_kernel(packed_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    byte = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    word = tl.load(packed_ptr + byte, mask=byte < nbytes, other=0).to(tl.int32)
    for plane in tl.static_range(8):
        idx = plane * nbytes + byte
        tl.store(out_ptr + idx, ((word >> plane) & 1).to(tl.uint8), mask=(byte < nbytes) & (idx < n))


def triton_bitmask_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_bitmask_compress` (same bytes)."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    require_triton(x, _bitmask_pack_kernel)
    x_bytes = x.contiguous().view(torch.uint8).reshape(-1)
    n = x_bytes.numel()
    nbytes = (n + 7) // 8
    out = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    grid = ((nbytes + _BLOCK_BYTES - 1) // _BLOCK_BYTES,)
    launch(_bitmask_pack_kernel, grid, x_bytes, out, n, nbytes, BLOCK=_BLOCK_BYTES)
    return [out]


def triton_bitmask_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """Triton twin of `torch_bitmask_decompress`."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, bitmask_payload_spec(shape, dtype), codec=NAME)
    packed = payload[0].contiguous()
    require_triton(packed, _bitmask_unpack_kernel)
    n = numel_of(shape)
    nbytes = packed.numel()
    out = torch.empty(n, dtype=torch.uint8, device=packed.device)
    grid = ((nbytes + _BLOCK_BYTES - 1) // _BLOCK_BYTES,)
    launch(_bitmask_unpack_kernel, grid, packed, out, n, nbytes, BLOCK=_BLOCK_BYTES)
    return out.view(torch.bool).reshape(shape)


# --------------------------------------------------------------------------
# Ops and codec
# --------------------------------------------------------------------------


bitmask_compress_op, bitmask_decompress_op = register_dispatched_ops(
    NAME,
    dtypes=_DTYPES,
    payload_spec=bitmask_payload_spec,
    torch_impl=(torch_bitmask_compress, torch_bitmask_decompress),
    triton_impl=(triton_bitmask_compress, triton_bitmask_decompress),
)


class BitmaskCodec(OpCodec):
    """Lossless 1-bit packing of bool tensors (see module docstring)."""

    name = NAME
    lossless = True
    error_bound = 0.0

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return bitmask_payload_spec(shape, dtype)

    def aten_compress(self, x: torch.Tensor) -> list[torch.Tensor]:
        return aten_bitmask_compress(x)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return aten_bitmask_decompress(payload, shape, dtype)

    def applies(self, query: ApplyQuery) -> bool:
        """Any bool tensor: packing is lossless, so the producer does not matter."""
        return query.dtype == torch.bool

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Torch reference: compress holds one shifted plane (a byte per
        eight elements) beside the result, plus a padded copy of the input
        when a partial last byte needs one; decompress only rounds its
        result up to whole bytes. The kernels need nothing."""
        if triton:
            return Workspace()
        numel = numel_of(shape)
        nbytes = (numel + 7) // 8
        whole = nbytes * 8
        return Workspace(
            compress=nbytes + (0 if numel % 8 == 0 else whole) + _SMALL,
            decompress=whole - numel + _SMALL,
        )

    def calibrate(self, samples: Sequence[torch.Tensor]) -> CodecStats:
        """Lossless: reports the fraction of True values (density) only."""
        total = sum(x.numel() for x in samples)
        ones = sum(int(x.sum()) for x in samples)
        return CodecStats(
            codec=NAME,
            abs_max=1.0 if ones else 0.0,
            relative_error=0.0,
            extra={"true_fraction": ones / total if total else 0.0},
        )


BITMASK = REGISTRY.register(BitmaskCodec())
