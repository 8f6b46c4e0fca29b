"""A codec's compress and decompress as graphs of plain aten ops.

Why: a codec inserted as ``torch.ops.adacc.*`` custom ops reaches Inductor
as an opaque extern call running the eager torch reference (many passes
over memory). Traced into aten ops instead, the same reference is just more
graph: Inductor fuses compress into the kernel that produces the value and
decompress into the kernel that reads it, generating C++ on CPU and Triton
on GPU. The graph rewrite (`adacc_compile.passes.compress_rewrite`) splices
these graphs into the forward and backward.

The graphs come from `Codec.aten_compress` / `Codec.aten_decompress`
traced on fake tensors (`compat_inductor.trace_aten`), so they depend on the value's
shape, strides, dtype and device only: one trace serves every value alike
(identical transformer blocks share it), and it is kept per fake mode (a
graph's fake tensors belong to the mode it was traced under).

A traced graph holds no tensor constants (every codec builds its constants
from ops such as ``arange``), so splicing it needs nothing but its nodes.
Parameters measured by calibration (`Codec.calibration_parameters`) are not
constants of the trace either: the compress graph then takes them as a
second input, which the rewrite binds to a constant of the compiled graph.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat_inductor
from adacc_compile.graph_splice import traced_outputs

from .codec import Codec


@dataclass(frozen=True, slots=True)
class CodecGraphs:
    """The two traced graphs of one codec on one kind of value.

    ``compress``: ``(x) -> payload`` (a tuple of tensors), or
    ``(x, parameters) -> payload`` when traced with parameters;
    ``decompress``: ``(*payload) -> (x_hat,)`` (for a DERIVATIVE codec, the
    derivative).
    """

    codec: str
    compress: fx.GraphModule
    decompress: fx.GraphModule


_Key = tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype, str, bool]
_TRACED: "weakref.WeakKeyDictionary[Any, dict[_Key, CodecGraphs]]" = weakref.WeakKeyDictionary()
"""Fake mode -> traces made under it (dropped with the mode)."""


def codec_graphs(codec: Codec, example: torch.Tensor, parameters: torch.Tensor | None = None) -> CodecGraphs:
    """The aten graphs of ``codec`` for values like ``example`` (a fake or
    real tensor; only its metadata is read); with ``parameters`` (a tensor
    like those `Codec.calibration_parameters` returns, only its metadata
    read), the compress takes them as its second input.

    Raises:
        ValueError: the codec's reference produced a graph that cannot be
            spliced (it holds tensor constants).
    """
    key: _Key = (
        codec.name,
        tuple(int(s) for s in example.shape),
        tuple(int(s) for s in example.stride()),
        example.dtype,
        str(example.device),
        parameters is not None,
    )
    mode = compat_inductor.ambient_fake_mode([example])
    cache = _TRACED.setdefault(mode, {}) if mode is not None else {}
    if key not in cache:
        cache[key] = _trace(codec, example, parameters)
    return cache[key]


def _trace(codec: Codec, example: torch.Tensor, parameters: torch.Tensor | None) -> CodecGraphs:
    shape, dtype = [int(s) for s in example.shape], example.dtype

    if parameters is None:
        def compress(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(codec.aten_compress(x))

        compress_gm = compat_inductor.trace_aten(compress, [example])
    else:
        def compress_with(x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(codec.aten_compress(x, p))

        compress_gm = compat_inductor.trace_aten(compress_with, [example, parameters])
    payload = [node.meta["val"] for node in traced_outputs(compress_gm)]

    def decompress(*parts: torch.Tensor) -> tuple[torch.Tensor]:
        return (codec.aten_decompress(list(parts), shape, dtype),)

    decompress_gm = compat_inductor.trace_aten(decompress, payload)
    for gm in (compress_gm, decompress_gm):
        constants = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
        if constants:
            raise ValueError(f"{codec.name}: traced graph holds tensor constants {constants}; build them from ops")
    return CodecGraphs(codec=codec.name, compress=compress_gm, decompress=decompress_gm)


# --------------------------------------------------------------------------
# Reading one-byte payloads in aten forms
# --------------------------------------------------------------------------
#
# Inductor's C++ (torch 2.13, AVX2) loads vectors of one-byte (and int32)
# values through a zero-filled stack buffer (`Vectorized<T>::loadu(ptr,
# count)`), several times slower than the float loads around them: a
# uint8 -> float32 cast of 1M values ran at 5.4x a float32 copy, measured.
# A load that does not depend on the vectorised index is a plain scalar
# load, though. So a decompress reads its bytes as int64 words, one scalar
# load per 8 bytes, and spreads each word over a vector of lanes with int32
# shifts by an iota (2.0-2.7x a float32 copy for the same cast, measured). Both need whole words; other sizes keep the plain cast.
# With AVX512 it is the other way round (see `vector_lanes`): eight bytes
# spread over a 16-lane vector leave the loop scalar, and the plain byte
# load is the fast one, so 8-bit fields are read plainly there.


def written(value: torch.Tensor) -> torch.Tensor:
    """``value``, which Inductor writes once to a buffer that its readers
    load (`compat_inductor.realize_op`), instead of inlining its computation into
    each of them: for a small per-channel factor read by a loop over every
    element, such as a reciprocal, that is one division per channel
    instead of one per element. ``value`` itself where the op is missing."""
    op = compat_inductor.realize_op()
    return value if op is None else op(value, list(value.stride()))


def plain_division_is_exact(device: torch.device) -> bool:
    """Whether Inductor's code for ``device`` divides float32 correctly
    rounded: its C++ does, its Triton does not (see `divide`)."""
    return device.type == "cpu"


def divide(numerator: torch.Tensor | float, denominator: torch.Tensor | float) -> torch.Tensor:
    """``numerator / denominator`` in float32, correctly rounded wherever
    Inductor compiles it, as the torch references give it. Inductor's
    Triton code divides float32 with the approximate
    ``div.full.f32`` (on an H200, torch 2.11: 569668 of 4M reciprocals
    differed from eager's, and the codes of four codecs with them), so on
    a GPU the quotient is taken in float64 and rounded once to float32:
    Triton's float64 division is ``div.rn.f64``, and a correctly rounded
    float64 quotient rounds to the correctly rounded float32 one (53 >= 2 *
    24 + 2). Inductor's C++ divides float32 exactly, so on the CPU this is
    the plain division (no float64 work where it is not needed).

    A float denominator becomes, in Inductor's GPU code, a float64 product
    with its reciprocal (Inductor folds division by a constant): within
    2^-52 of the quotient, which for the codecs' divisors (126, 7, 6: odd
    parts with binary periods of at most 6 bits) never lies that close to a
    float32 rounding midpoint without being exact, so it rounds the same."""
    tensor = numerator if isinstance(numerator, torch.Tensor) else denominator
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("divide needs a tensor numerator or denominator")
    if plain_division_is_exact(tensor.device):
        return numerator / denominator
    wide = [v.double() if isinstance(v, torch.Tensor) else v for v in (numerator, denominator)]
    return (wide[0] / wide[1]).float()


def vector_lanes(device: torch.device) -> int:
    """float32 lanes per vector of the code Inductor generates for
    ``device``: 16 on a CPU whose ATen capability is AVX512 (Inductor picks
    its vector ISA from the same ``ATEN_CPU_CAPABILITY``), else 8 (AVX2, and
    the GPU, where it does not matter).

    The word-wise reads below spread one int64 word over the lanes of one
    vector; a word of eight bytes spread over a 16-lane vector makes
    Inductor's AVX512 code give up vectorising the whole loop (the int8
    decompress ran at 39x a copy, measured), while a plain byte load, slow
    on AVX2, is vectorised well there (a uint8 -> float32 cast at 0.8x a
    float32 copy, against 3.5x on AVX2, measured)."""
    if torch.device(device).type != "cpu":
        return 8
    return 16 if torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512") else 8


def packed_fields(data: torch.Tensor, bits: int) -> torch.Tensor:
    """The ``bits``-wide fields (1, 2, 4 or 8) of a one-byte tensor, LSB
    first, as int32 ``0 .. 2**bits - 1``: field ``i`` is field ``i % (8 //
    bits)`` of byte ``i // (8 // bits)`` of ``data`` flattened."""
    flat = data.reshape(-1).view(torch.uint8)
    mask = (1 << bits) - 1
    if bits == 8 and vector_lanes(data.device) > 8:
        return flat.to(torch.int32)  # a plain byte load (see vector_lanes)
    if flat.numel() % 8 or flat.numel() == 0:
        shifts = torch.arange(8 // bits, dtype=torch.int32, device=data.device) * bits
        return ((flat.to(torch.int32).unsqueeze(-1) >> shifts) & mask).reshape(-1)
    lanes = 64 // bits  # fields per int64 word; each int32 half holds lanes / 2
    words = flat.view(torch.int64).unsqueeze(-1)
    low = (words & 0xFFFFFFFF).to(torch.int32)
    high = (words >> 32).to(torch.int32)
    lane = torch.arange(lanes, dtype=torch.int32, device=data.device)
    first = lane < lanes // 2
    half = torch.where(first, low, high)
    shift = torch.where(first, lane, lane - lanes // 2) * bits
    return ((half >> shift) & mask).reshape(-1)


def byte_values(data: torch.Tensor) -> torch.Tensor:
    """The bytes of a one-byte tensor (uint8, int8 or bool) as float32
    0..255 (int8 as two's complement bytes), shaped like ``data``.

    A plain byte load with 16-lane vectors (see `vector_lanes`), and where
    the last dimension is not a whole number of int64 words: a reader that
    loops over rows of such a tensor finds a row's bytes starting mid-word,
    and Inductor's C++ then indexes each byte with a division and a modulo
    and runs the whole kernel scalar (the int8_channel and fp8 decompress
    of a [4096, 682] value ran at 24-27x a copy, AMD EPYC with AVX2; 682 is
    a Llama-style FFN width, 8/3 of 256)."""
    if vector_lanes(data.device) > 8 or not _whole_words(data):
        return data.view(torch.uint8).float()
    return packed_fields(data, 8).float().view(data.shape)


def _whole_words(data: torch.Tensor) -> bool:
    """Every row (last dimension) of ``data`` is a whole number of int64 words."""
    return data.dim() == 0 or data.shape[-1] % 8 == 0


def int8_values(data: torch.Tensor) -> torch.Tensor:
    """An int8 tensor as float32 -128..127, shaped like ``data``. With
    16-lane vectors through int32 (a sign-extending load: 0.7x a float32
    copy, measured), not through a uint8 view, which Inductor's C++ bit-casts
    lane by lane through a buffer (the int8_channel decompress ran at 2.3x
    a copy that way instead of 1.0x, AMD EPYC with AVX512); with 8 lanes
    through `byte_values`."""
    if vector_lanes(data.device) > 8 or not _whole_words(data):
        return data.to(torch.int32).float()  # no uint8 bit-cast (see byte_values)
    byte = byte_values(data)
    return torch.where(byte >= 128.0, byte - 256.0, byte)


def bfloat16_values(data: torch.Tensor) -> torch.Tensor:
    """A bfloat16 tensor as float32 (exact), shaped like ``data``, read as
    int32 pairs: a bfloat16 load in a kernel otherwise turns Inductor's
    whole loop scalar (the int8 decompress ran at 24x a copy, measured)."""
    if data.numel() % 2 or data.numel() == 0 or not data.is_contiguous():
        return data.float()
    pairs = data.reshape(-1).view(torch.int32).unsqueeze(-1)
    lane = torch.arange(2, dtype=torch.int32, device=data.device)
    bits = torch.where(lane == 0, pairs << 16, pairs & -65536)
    return bits.reshape(-1).view(torch.float32).view(data.shape)


def nibble_bytes(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Two float tensors of int4 codes (-8..7, whole numbers) as uint8
    bytes: ``low``'s two's-complement nibble in the low four bits, ``high``'s
    in the high four.

    With 16-lane vectors in float arithmetic, cast once: ``16 * high + (low
    mod 16)`` is the byte read as int8 (-128..127), and its cast through
    int32 to uint8 wraps it to the unsigned byte (integer narrowing keeps
    the low 8 bits). The int32 form (``(low & 15) | (high & 15) << 4``: two
    float -> int32 casts and an int32 -> uint8 one) made an int4 compress of
    1024 x 1024 float32 cost 0.96 ms against 0.63 ms, AVX512, measured; with
    8 lanes the int32 form stays (0.63 against 0.68 ms for the float one).
    Adding 256 below zero with a select instead of the wrapping cast took
    0.05-0.16 copies of the value more (standalone compress of int4_channel
    and int4_outlier, 4096 x 1024, two runs, measured)."""
    if vector_lanes(low.device) > 8:
        byte = 16.0 * high + torch.where(low < 0, low + 16.0, low)
        return byte.to(torch.int32).to(torch.uint8)
    low32, high32 = low.to(torch.int32), high.to(torch.int32)
    return ((low32 & 15) | ((high32 & 15) << 4)).to(torch.uint8)


# --------------------------------------------------------------------------
# Plane-major ("vertical") packing
# --------------------------------------------------------------------------
#
# Packing neighbours into one byte (element i to bit i % 8 of byte i // 8)
# needs horizontal work per byte, which Inductor's C++ vectorises poorly.
# The codecs instead pack *planes*: the padded values viewed as [8, M] (M
# bytes), byte i holds bit j of element (j, i). Each plane is a contiguous
# slice, so packing is eight vector loads combined lane by lane and
# unpacking eight vector stores: elementwise loops over contiguous memory.


def pack_planes(bits: torch.Tensor) -> torch.Tensor:
    """Eight 0/1 values per byte, plane-major: ``bits`` (float32 0.0 / 1.0,
    numel ``8 * M``) viewed as ``[8, M]``, as uint8 ``[M]`` with byte ``i``
    = ``sum_j bits[j, i] << j``.

    A float sum of the planes (exact: at most 255), cast once: float adds
    are what Inductor's C++ vectorises best."""
    planes = bits.reshape(8, -1)
    word = planes[0]
    for j in range(1, 8):
        word = word + planes[j] * float(1 << j)
    return word.to(torch.uint8)


def unpack_planes(packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`pack_planes` undone: the first ``numel(shape)`` bits of a one-byte
    tensor of ``M`` bytes, as int32 0 / 1 shaped ``shape``: element ``e``
    is bit ``e // M`` of byte ``e % M``.

    Where the last dim ``B`` divides ``M`` (and no padding is cut), the
    planes are built as ``[8, M / B, B]`` and merged into ``shape``, so the
    byte of output ``[..., b]`` is ``b`` plus a row offset: a contiguous
    load. Through the flat view, Inductor indexes the bytes with
    ``flat % M``, which it does not simplify, and gathers them one by one."""
    numel = math.prod(shape)
    nbytes = packed.numel()
    width = shape[-1] if len(shape) and shape[-1] and nbytes % shape[-1] == 0 else max(nbytes, 1)
    byte = packed_fields(packed, 8).view(-1, width)
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device).view(8, 1, 1)
    planes = (byte.unsqueeze(0) >> shifts) & 1
    if numel == 8 * nbytes:
        return planes.reshape(shape)
    return planes.reshape(-1)[:numel].reshape(shape)
