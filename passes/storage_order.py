"""The layout a codec sees: a saved value in the order its elements lie in memory.

Used by: `compress_rewrite` (what the compress reads, how the decompressed
value gets its layout back), `codec_options` (the shape a codec is offered
and costed for), `calibrate` and `monitor` (the shape its error is
measured on), so that all four agree.

Why: a value saved in a permuted layout (a GPT's attention output, kept in
the batched matmul's (b, h, t, d) memory while its logical shape is
(b, t, h, d)) read in its logical order makes the codec's loops stride
through memory. Inductor's C++ for int4_channel on such a value (1 MiB)
was a scalar loop with an integer division and modulo per element: 5.1 ms
per step of a GPT d256 mixed plan, where a copy of the value takes under
0.1 ms (`bench/profile_step_kernels.py`, bench/RESULTS.md). Decompression
then had to copy the contiguous result back into the permuted layout (a
``permute`` / ``clone`` / ``permute``). Compressed in storage order (a
``permute`` that is a contiguous view), the codec runs the same contiguous
loops as on any other value, and the decompressed value, permuted back, has
the original layout with no copy.

What changes for the codec: its "channels" are the innermost dim in
memory (for the attention output: the head dim, its rows the tokens of
each head) instead of the logical last dim. Every codec's error bound is
declared for any float value, and calibration measures each option on
the same storage-ordered view the compiled graph compresses.
"""

from __future__ import annotations

import torch


def physical_order(val: torch.Tensor) -> list[int] | None:
    """Dims from outermost to innermost in memory, for a dense,
    non-overlapping tensor (None otherwise); the identity when contiguous."""
    dims = list(range(val.dim()))
    order = sorted(dims, key=lambda d: -int(val.stride(d)))
    expected = 1
    for d in reversed(order):
        if val.shape[d] != 1 and int(val.stride(d)) != expected:
            return None
        expected *= int(val.shape[d])
    return order


def storage_permutation(val: torch.Tensor) -> list[int] | None:
    """The permutation that makes ``val`` a contiguous view of its
    storage, or None when none is needed (already contiguous) or none
    exists (not dense: overlapping or with gaps)."""
    if val.is_contiguous():
        return None
    order = physical_order(val)
    if order is None or order == list(range(val.dim())):
        return None
    return order


def inverse(order: list[int]) -> list[int]:
    """The permutation that undoes ``order``."""
    return [order.index(d) for d in range(len(order))]


def in_storage_order(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the codec sees it: permuted into memory order (a view),
    or ``x`` itself."""
    order = storage_permutation(x)
    return x if order is None else x.permute(order)


def storage_shape(val: torch.Tensor) -> tuple[int, ...]:
    """The shape of `in_storage_order` (``val``)."""
    order = storage_permutation(val)
    shape = tuple(int(s) for s in val.shape)
    return shape if order is None else tuple(shape[d] for d in order)
