"""Codec "bitmask": boolean tensors at one bit per element, lossless.

Why: torch stores a bool in a whole byte, and the masks autograd saves
(dropout keep-masks, ReLU ``x > 0`` signs, attention masks) are pure bools,
so packing eight per byte cuts them 8x at memory-copy cost and no error.

Layout: the tensor is flattened in row-major order and element ``i`` becomes
bit ``i % 8`` (least significant first) of byte ``i // 8``; the last byte is
zero-padded. Payload: one uint8 tensor of ``ceil(numel / 8)`` bytes.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from . import REGISTRY
from .aten_graphs import pack_bits, packed_fields
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
#: Workspace slack for the tiny tensors (bit weights) of the torch reference.
_SMALL = 64


def bitmask_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """One uint8 byte per eight elements, rounded up."""
    return [(((numel_of(shape) + 7) // 8,), torch.uint8)]


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def _bit_weights(device: torch.device) -> torch.Tensor:
    """[1, 2, 4, ..., 128] as uint8: the value of bit i of a byte."""
    one = torch.ones(8, dtype=torch.uint8, device=device)
    return one << torch.arange(8, dtype=torch.uint8, device=device)


def torch_bitmask_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Packs ``x`` (bool) eight elements per byte, LSB first.

    Stays in uint8 throughout (the eight weighted bits of a byte are distinct,
    so their uint8 sum cannot overflow); several times faster on CPU than
    widening to int32.
    """
    check_input(x, codec=NAME, dtypes=_DTYPES)
    flat = x.reshape(-1).view(torch.uint8)  # reshape copies non-contiguous input once
    n = flat.numel()
    nbytes = (n + 7) // 8
    # Padding copies the input; only a tail that is not a whole byte needs it.
    bits = (flat if n % 8 == 0 else F.pad(flat, (0, nbytes * 8 - n))).view(nbytes, 8)
    return [(bits * _bit_weights(x.device)).sum(dim=1, dtype=torch.uint8)]


def torch_bitmask_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """Unpacks the bytes back into a bool tensor of ``shape``."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, bitmask_payload_spec(shape, dtype), codec=NAME)
    packed = payload[0]
    # ne_ in place keeps the 0/1 bytes in the uint8 buffer, which then is
    # the bool result: no second tensor of the output's size.
    bits = (packed.unsqueeze(1) & _bit_weights(packed.device)).ne_(0).view(torch.bool)
    return bits.reshape(-1)[: numel_of(shape)].reshape(shape)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py)
# --------------------------------------------------------------------------


def aten_bitmask_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """`torch_bitmask_compress` as float sums of the bits (exact), cast
    once: Inductor's CPU code handles one-byte arithmetic and bool vectors
    poorly, floats well. Whole 16-bit words go through `pack_bits`; other
    sizes sum the eight bits of each byte."""
    check_input(x, codec=NAME, dtypes=_DTYPES)
    flat = x.reshape(-1).float()
    n = flat.numel()
    if n and n % 16 == 0:
        return [pack_bits(flat)]  # one vectorised float sum per 16 bits (see aten_graphs)
    nbytes = (n + 7) // 8
    bits = (flat if n % 8 == 0 else F.pad(flat, (0, nbytes * 8 - n))).view(nbytes, 8)
    word = bits[:, 0]
    for k in range(1, 8):
        word = word + bits[:, k] * float(1 << k)
    return [word.to(torch.uint8)]


def aten_bitmask_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """`torch_bitmask_decompress`: the bits of whole int64 words of the
    payload, spread over lanes by int32 shifts, compared to 0 once."""
    shape = check_shape(shape, codec=NAME)
    check_output_dtype(dtype, codec=NAME, dtypes=_DTYPES)
    check_payload(payload, bitmask_payload_spec(shape, dtype), codec=NAME)
    bits = packed_fields(payload[0], 1)  # int32 shifts of int64 words (see aten_graphs)
    return (bits != 0)[: numel_of(shape)].reshape(shape)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _bitmask_pack_kernel(x_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    # One program packs BLOCK bytes: a contiguous [BLOCK, 8] tile of input.
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bit = tl.arange(0, 8)
    idx = byte[:, None] * 8 + bit[None, :]
    v = tl.load(x_ptr + idx, mask=idx < n, other=0)
    word = tl.sum((v != 0).to(tl.int32) << bit[None, :], axis=1)
    tl.store(out_ptr + byte, word.to(tl.uint8), mask=byte < nbytes)


@triton_jit
def _bitmask_unpack_kernel(packed_ptr, out_ptr, n, nbytes, BLOCK: tl.constexpr):
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bit = tl.arange(0, 8)
    word = tl.load(packed_ptr + byte, mask=byte < nbytes, other=0).to(tl.int32)
    bits = (word[:, None] >> bit[None, :]) & 1
    idx = byte[:, None] * 8 + bit[None, :]
    tl.store(out_ptr + idx, bits.to(tl.uint8), mask=idx < n)


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
        """Torch reference: compress multiplies the whole bytes by their bit
        weights (one byte per element, twice when a partial last byte needs
        a padded copy); decompress only rounds its result up to whole bytes.
        The kernels need nothing."""
        if triton:
            return Workspace()
        numel = numel_of(shape)
        whole = (numel + 7) // 8 * 8
        return Workspace(
            compress=whole * (1 if numel % 8 == 0 else 2) + _SMALL,
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
