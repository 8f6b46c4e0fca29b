"""Codecs "fewbit_gelu" and "fewbit_silu": a 3-bit code of the activation's derivative.

Why: the input ``x`` of GELU/SiLU is saved only so that the backward can
evaluate ``f'(x)``. "Few-bit backward" (Novikov et al., ICML 2023) stores a
piecewise-constant approximation of ``f'(x)`` instead: a few bits per element
in place of 16 or 32, which the paper reports trains to the same accuracy.

What decompress returns: **the approximate derivative** ``f'(x)`` with the
shape and dtype of ``x``, not ``x`` (`DecompressKind.DERIVATIVE`); the graph
rewrite multiplies it with the incoming gradient instead of calling
``gelu_backward`` / ``silu_backward``.

Levels: 3 bits give 7 derivative values per activation plus a NaN code
(2 bits would leave 3 levels, error 0.18-0.21; 4 bits 15 levels, about 0.04,
at 0.5 bytes per element). They are chosen to minimise
``E[(q(x) - f'(x))^2]`` for ``x ~ N(0, 1)``, with 0 and 1 pinned as levels so
that the saturated regions (and ±Inf, where f' tends to 0 and 1) come back
exact. The constants below were produced by `fit_code_table` (weighted
Lloyd-Max in the derivative's value space on a 96k-point grid over [-12, 12],
from four deterministic starts, keeping the best) and are checked by
tests/kernels/test_fewbit.py, which recomputes them. Quantising the *value*
``f'(x)`` (not contiguous x-intervals) is the optimal assignment; since f' is
continuous, the code only changes by ±1 where f' crosses a midpoint between
levels, so compress needs comparisons of x with fixed breakpoints, nothing
else: bit-exact on every backend, no erf/exp in the kernel.

Error of the derivative (relative, Frobenius) for x ~ N(0, s^2), measured:
GELU 0.137 / 0.115 / 0.083 / 0.061 / 0.046 at s = 0.25 / 0.5 / 1 / 2 / 4;
SiLU between 0.083 and 0.094 for all those s. Declared: 0.12 (GELU, holds
for s >= 0.5) and 0.10 (SiLU). Pre-activations of transformer MLPs have
s around 1-3; `calibrate` reports ``input_std`` so a planner can check.

Codes: the levels are stored by sign and magnitude (`CodeLayout`): code
``4 * side + class``, the class from ``|x|`` against the positive
breakpoints, the side one comparison; the tables (``levels`` ascending,
``breakpoints``/``steps``/``base`` as a function of x) are what the fit
produces, the layout is derived from them. Code 7 is NaN (a NaN input
gives a NaN derivative, as eager does). GELU
means the exact erf form (``approximate="none"``); the tanh form's derivative
differs from it by at most 0.001, far below the quantisation error (ApplyQuery
cannot tell the two apart).

Layout: payload[0] is uint8 [3, M], M = ceil(numel / 8): row ``b`` holds
bit ``b`` of every code, packed plane-major as bitmask packs its bools. The
flattened codes, padded with code 0 to ``8 * M``, are viewed as ``[8, M]``;
bit ``b`` of code ``(j, i)`` (element ``j * M + i``) is bit ``j`` of byte
``i`` of row ``b``. 0.375 bytes per element. Plane-major so that packing
and unpacking are elementwise loops over contiguous memory, which
Inductor's C++ vectorises (see `aten_graphs.pack_planes`).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import REGISTRY
from .aten_graphs import pack_planes, unpack_planes
from .codec import ApplyQuery, CodecStats, DecompressKind
from .oplib import (
    OpCodec,
    PayloadSpec,
    Workspace,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    error_stats,
    float32_scratch,
    launch,
    numel_of,
    register_dispatched_ops,
    require_triton,
    rne_cast,
    tl,
    triton_jit,
)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BITS = 3
#: Smallest input standard deviation the calibrate pass accepts. Below it
#: most inputs sit in the centre interval (|x| < 0.16, derivative 0.5),
#: where the derivative's variation around 0.5 carries the gradient's
#: signal, and the code drops it: the derivative's error stays within its
#: bound (GELU 0.118 at std 0.08) while a sum over tokens loses most of
#: its signal (a 3-layer GELU MLP with inputs of std 0.08, all three GELU
#: inputs in few-bit codes: the first layer's bias gradient 79% off,
#: measured 2026-12-06). GELU's declared bound holds from std 0.5 up
#: (module docstring).
MIN_INPUT_STD = 0.5
NAN_CODE = 7
#: Bytes (of each plane) written per Triton program; 8 elements each.
_BLOCK_BYTES = 256
#: Workspace slack for the scalars and lookup tables of the torch reference.
_SMALL = 256


def gelu_derivative(x: torch.Tensor) -> torch.Tensor:
    """Exact d/dx of erf-GELU, ``Phi(x) + x * phi(x)``, in float64."""
    x = x.double()
    density = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return 0.5 * (1.0 + torch.erf(x * math.sqrt(0.5))) + x * density


def silu_derivative(x: torch.Tensor) -> torch.Tensor:
    """Exact d/dx of SiLU, ``s(x) * (1 + x * (1 - s(x)))``, in float64."""
    x = x.double()
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeTable:
    """The piecewise-constant derivative of one activation.

    ``code(x) = base + sum(step_i for breakpoints_i <= x)``; the derivative is
    ``levels[code]``. All floats are exactly representable in float32.
    """

    name: str
    backward: str
    levels: tuple[float, ...]
    breakpoints: tuple[float, ...]
    steps: tuple[int, ...]
    base: int
    derivative: Callable[[torch.Tensor], torch.Tensor]


# Produced by fit_code_table(gelu_derivative) / fit_code_table(silu_derivative).
GELU = CodeTable(
    name="fewbit_gelu",
    backward="gelu_backward",
    levels=(
        -0.10339878499507904, 0.0, 0.24470356106758118, 0.5, 0.7552964687347412, 1.0, 1.1033987998962402,
    ),  # fmt: skip
    breakpoints=(
        -2.3296825885772705, -0.888422429561615, -0.5166283845901489, -0.1613760143518448,
        0.1613760143518448, 0.5166283845901489, 0.888422429561615, 2.3296825885772705,
    ),  # fmt: skip
    steps=(-1, 1, 1, 1, 1, 1, 1, -1),
    base=1,
    derivative=gelu_derivative,
)
SILU = CodeTable(
    name="fewbit_silu",
    backward="silu_backward",
    levels=(
        0.0, 0.16660885512828827, 0.33330580592155457, 0.5, 0.6666942238807678, 0.8333911299705505, 1.0,
    ),  # fmt: skip
    breakpoints=(
        -0.9643496870994568, -0.5229823589324951, -0.16747379302978516,
        0.16747379302978516, 0.5229823589324951, 0.9643496870994568,
    ),  # fmt: skip
    steps=(1, 1, 1, 1, 1, 1),
    base=0,
    derivative=silu_derivative,
)


#: Magnitude class of the centre interval, |x| below the smallest positive
#: breakpoint: with the sign bit set (NaN, see `CodeLayout`) it is code 7.
_CENTRE = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeLayout:
    """Which 3-bit code stands for which derivative level: sign and magnitude.

    Why: the fitted derivatives are symmetric (``f'(-x) = 1 - f'(x)`` for
    GELU and SiLU; their breakpoints are ``±b``), so ``|x|`` decides a
    magnitude class and one comparison decides the side. The code is
    ``4 * side + class`` with ``side = not (x < b_0)`` (``b_0`` the smallest
    positive breakpoint) and the class counted from ``|x| >= b_k``: 1 + K
    comparisons instead of the 2K the table's own code needs, and no NaN
    select (a NaN fails every comparison: side 1, centre class 3, code 7).
    Inductor's CPU code for the compress took about half the time
    (bench/RESULTS.md). The centre interval has side 0. At ``x = -b_k``
    exactly the value falls in the outer interval, where the table's code
    takes the inner one (both levels are the nearest within float32
    rounding of the breakpoint).
    """

    magnitude_breakpoints: tuple[float, ...]
    """The positive breakpoints, ascending; the first also decides the side."""
    class_base: int
    """Class of the centre interval (``_CENTRE``)."""
    class_steps: tuple[int, ...]
    """Change of the class at each magnitude breakpoint."""
    class_planes: tuple[tuple[int, tuple[int, ...]], ...]
    """Per bit of the class: its value in the centre interval and its
    change (+1, -1, 0) at each magnitude breakpoint (`plane_steps`)."""
    code_levels: tuple[float, ...]
    """The derivative of each code 0..6 (NaN for a code no interval takes);
    code 7 is NaN."""


def _table_level(table: CodeTable, x: float) -> float:
    code = table.base + sum(step for breakpoint, step in zip(table.breakpoints, table.steps) if x >= breakpoint)
    return table.levels[code]


def _bit_changes(sequence: Sequence[int]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Per bit b (of 2): bit b of ``sequence[0]`` and how it changes between neighbours."""
    bits = [[(value >> b) & 1 for value in sequence] for b in range(2)]
    return tuple((bit[0], tuple(after - before for before, after in zip(bit, bit[1:]))) for bit in bits)


def code_layout(table: CodeTable) -> CodeLayout:
    """The sign-magnitude layout of ``table`` (see `CodeLayout`).

    The magnitude classes of the non-centre intervals (at most three
    distinct pairs of levels) get the ids 0..2 that make the fewest
    changes across the class bits (fewest comparisons in the compress).

    Raises:
        ValueError: if the breakpoints are not symmetric about 0, the centre
            interval's level differs by side, or more than three classes
            are needed.
    """
    positive = tuple(b for b in table.breakpoints if b > 0)
    if tuple(-b for b in reversed(positive)) + positive != table.breakpoints:
        raise ValueError(f"{table.name}: breakpoints are not symmetric about 0: {table.breakpoints}")
    edges = positive + (2.0 * positive[-1],)
    centre = _table_level(table, 0.0)
    if _table_level(table, -0.0) != centre:
        raise ValueError(f"{table.name}: the centre interval has two levels")
    # (level above, level below) of each magnitude interval past the centre
    pairs = [
        (_table_level(table, edges[k]), _table_level(table, -0.5 * (edges[k] + edges[k + 1])))
        for k in range(len(positive))
    ]
    distinct = list(dict.fromkeys(pairs))
    if len(distinct) > _CENTRE:
        raise ValueError(f"{table.name}: {len(distinct)} magnitude classes, at most {_CENTRE} fit in two bits")
    best: tuple[int, tuple[int, ...]] | None = None
    for ids in itertools.permutations(range(_CENTRE), len(distinct)):
        sequence = (_CENTRE,) + tuple(ids[distinct.index(pair)] for pair in pairs)
        changes = sum(change != 0 for _, steps in _bit_changes(sequence) for change in steps)
        if best is None or changes < best[0]:
            best = (changes, sequence)
    assert best is not None
    sequence = best[1]
    code_levels = [math.nan] * NAN_CODE
    code_levels[_CENTRE] = centre
    for (above, below), cls in zip(pairs, sequence[1:]):
        code_levels[4 + cls], code_levels[cls] = above, below
    return CodeLayout(
        magnitude_breakpoints=positive,
        class_base=_CENTRE,
        class_steps=tuple(after - before for before, after in zip(sequence, sequence[1:])),
        class_planes=_bit_changes(sequence),
        code_levels=tuple(code_levels),
    )


LAYOUTS = {table.name: code_layout(table) for table in (GELU, SILU)}

#: Each code's level rounded float32 -> dtype, as Python floats: the
#: values `_torch_decompress` looks up, computed here once (a trace of the
#: aten form must not build tensors from Python data).
_LEVELS_IN_DTYPE = {
    (table.name, dtype): tuple(
        torch.tensor(LAYOUTS[table.name].code_levels, dtype=torch.float32).to(dtype).float().tolist()
    )
    for table in (GELU, SILU)
    for dtype in _DTYPES
}


def fewbit_payload_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    """Three bit planes of ceil(numel / 8) bytes each."""
    return [((BITS, (numel_of(shape) + 7) // 8), torch.uint8)]


# --------------------------------------------------------------------------
# Offline derivation of the constants (run by the tests)
# --------------------------------------------------------------------------


def fit_code_table(
    derivative: Callable[[torch.Tensor], torch.Tensor],
    *,
    num_levels: int = NAN_CODE,
    pinned: tuple[float, ...] = (0.0, 1.0),
    points: int = 96001,
    iterations: int = 400,
) -> tuple[tuple[float, ...], tuple[tuple[float, int], ...], int, float]:
    """Weighted Lloyd-Max for ``f'(x)``, x ~ N(0, 1); levels in ``pinned`` stay fixed.

    Four starts (with or without one level below the smallest pinned value
    and one above the largest, the rest evenly spread between) cover the
    shapes the optimum can take; the best is kept.

    Returns:
        (levels ascending, ((breakpoint, step), ...) ascending, code of
        x -> -inf, relative RMS error of the derivative).
    """
    x = torch.linspace(-12.0, 12.0, points, dtype=torch.float64)
    weight = torch.exp(-0.5 * x * x)
    weight = weight / weight.sum()
    y = derivative(x)
    pinned_t = torch.tensor(pinned, dtype=torch.float64)
    low, high = float(y.min()), float(y.max())
    best: tuple[float, torch.Tensor] | None = None
    for below in (0, 1):
        for above in (0, 1):
            inner = num_levels - len(pinned) - below - above
            spread = [(i + 1) / (inner + 1) for i in range(inner)]
            start = [low * 0.8] * below + [high * 0.9] * above + spread
            levels = torch.sort(torch.cat([pinned_t, torch.tensor(start, dtype=torch.float64)])).values
            fixed = torch.isin(levels, pinned_t)
            for _ in range(iterations):
                code = torch.bucketize(y, (levels[1:] + levels[:-1]) / 2)
                mass = torch.bincount(code, weight, num_levels)
                mean = torch.bincount(code, weight * y, num_levels) / mass.clamp_min(1e-300)
                new = torch.where(fixed | (mass == 0), levels, mean)
                if torch.equal(new, levels):
                    break
                levels = new
            quantised = levels[torch.bucketize(y, (levels[1:] + levels[:-1]) / 2)]
            err = float((weight * (quantised - y) ** 2).sum())
            if best is None or err < best[0]:
                best = (err, levels)
    assert best is not None
    err, levels = best
    breakpoints = []
    for t in ((levels[1:] + levels[:-1]) / 2).tolist():
        below_t = y < t
        for i in torch.nonzero(below_t[:-1] != below_t[1:]).flatten().tolist():
            a, b = float(x[i]), float(x[i + 1])
            rising = bool(below_t[i])
            for _ in range(100):  # bisection to float64 precision
                m = 0.5 * (a + b)
                if (float(derivative(torch.tensor(m))) < t) == rising:
                    a = m
                else:
                    b = m
            breakpoints.append((_f32(0.5 * (a + b)), 1 if rising else -1))
    base = int(torch.argmin(levels.abs()))
    relative = math.sqrt(err / float((weight * y * y).sum()))
    return tuple(_f32(v) for v in levels.tolist()), tuple(sorted(breakpoints)), base, relative


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


# --------------------------------------------------------------------------
# Torch reference (CPU path and oracle)
# --------------------------------------------------------------------------


def _torch_codes(table: CodeTable, x: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """uint8 codes of ``x`` flattened (`CodeLayout`), zero-padded to ``size`` elements (default: none).

    8-bit codes and in-place updates keep the workspace near one byte per
    element (plus a float32 copy of a half-precision ``x``: the breakpoints
    must be compared in float32, as the kernels do).
    """
    layout = LAYOUTS[table.name]
    xf = x.reshape(-1).float()
    n = xf.numel()
    code = torch.zeros(n if size is None else size, dtype=torch.int8, device=x.device)
    body = code[:n].fill_(layout.class_base)
    for breakpoint, step in zip(layout.magnitude_breakpoints, layout.class_steps):
        # |x| >= b as two disjoint one-byte masks: no float32 |x| in the workspace
        body.add_((xf >= breakpoint).view(torch.int8), alpha=step)
        body.add_((xf <= -breakpoint).view(torch.int8), alpha=step)
    body.add_((xf < layout.magnitude_breakpoints[0]).logical_not_().view(torch.int8), alpha=4)
    return code.view(torch.uint8)  # codes are 0..7; NaN fails every comparison: 7


def _torch_compress(table: CodeTable, x: torch.Tensor) -> list[torch.Tensor]:
    check_input(x, codec=table.name, dtypes=_DTYPES)
    nbytes = (x.numel() + 7) // 8
    codes = _torch_codes(table, x, nbytes * 8).view(8, nbytes)
    planes = torch.zeros(BITS, nbytes, dtype=torch.uint8, device=x.device)
    for j in range(8):  # one shifted copy of one row of codes at a time
        for plane in range(BITS):
            planes[plane].bitwise_or_((codes[j] >> plane).bitwise_and_(1).bitwise_left_shift_(j))
    return [planes]


def _torch_decompress(
    table: CodeTable, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    shape = _check_decompress(table, payload, shape, dtype)
    planes = payload[0]
    code = torch.zeros(8, planes.shape[1], dtype=torch.uint8, device=planes.device)
    for j in range(8):  # one shifted copy of one plane at a time
        for plane in range(BITS):
            code[j].bitwise_or_((planes[plane] >> j).bitwise_and_(1).bitwise_left_shift_(plane))
    code = code.view(-1)[: numel_of(shape)]
    # One masked fill per level instead of a gather, whose index would have to
    # be int32 or int64 (4-8 bytes per element). The levels are rounded from
    # float32 to ``dtype`` first, as a float32 lookup then .to(dtype) would.
    code_levels = LAYOUTS[table.name].code_levels
    lookup = torch.tensor(code_levels + (math.nan,), dtype=torch.float32, device=planes.device)
    lookup = lookup.to(dtype)
    out = torch.empty(code.numel(), dtype=dtype, device=planes.device).fill_(lookup[NAN_CODE])
    for level in range(len(code_levels)):
        if not math.isnan(code_levels[level]):
            out.masked_fill_(code == level, lookup[level])
    return out.reshape(shape)


def torch_fewbit_gelu_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """3-bit codes of gelu'(x) (see module docstring)."""
    return _torch_compress(GELU, x)


def torch_fewbit_gelu_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """The approximate gelu'(x), not x."""
    return _torch_decompress(GELU, payload, shape, dtype)


def torch_fewbit_silu_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """3-bit codes of silu'(x) (see module docstring)."""
    return _torch_compress(SILU, x)


def torch_fewbit_silu_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """The approximate silu'(x), not x."""
    return _torch_decompress(SILU, payload, shape, dtype)


# --------------------------------------------------------------------------
# Aten form (what compiled graphs run; see aten_graphs.py): codes and bits
# as exact small floats, cast to uint8 once (Inductor's CPU code runs
# one-byte shifts and masks element by element).
# --------------------------------------------------------------------------


def _aten_compress(table: CodeTable, x: torch.Tensor) -> list[torch.Tensor]:
    """`_torch_compress` written for Inductor (the same bit planes).

    Each bit of the magnitude class is summed directly from the 0/1
    comparisons of |x| with the positive breakpoints
    (`CodeLayout.class_planes`; exact small floats), the side bit is one
    comparison, and NaN needs no select (`CodeLayout`). Standalone compress
    of 4M float32 in the benchmark's graphs: GELU 4.8 -> 2.7 ms, SiLU 3.4 ->
    2.3 ms against the table's own code (8 and 6 comparisons, three NaN
    selects; measured 2026-12-06)."""
    check_input(x, codec=table.name, dtypes=_DTYPES)
    layout = LAYOUTS[table.name]
    n = x.numel()
    nbytes = (n + 7) // 8
    xf = x.reshape(-1).float()
    magnitude = xf.abs()
    above = [(magnitude >= breakpoint).float() for breakpoint in layout.magnitude_breakpoints]
    bits = []
    for first, changes in layout.class_planes:
        bit = torch.full_like(xf, float(first))
        for change, a in zip(changes, above):
            bit = bit + a if change == 1 else bit - a if change == -1 else bit
        bits.append(bit)
    bits.append(1.0 - (xf < layout.magnitude_breakpoints[0]).float())  # NaN: 1
    pad = nbytes * 8 - n  # the padding is code 0
    return [torch.stack([pack_planes(bit if pad == 0 else torch.nn.functional.pad(bit, (0, pad))) for bit in bits])]


def _aten_decompress(
    table: CodeTable, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """`_torch_decompress` written for Inductor: the same derivative values
    (the levels rounded to ``dtype``), picked by comparisons."""
    shape = _check_decompress(table, payload, shape, dtype)
    planes = payload[0]
    bits = [unpack_planes(planes[b], shape) for b in range(BITS)]
    code = (bits[0] | (bits[1] << 1) | (bits[2] << 2)).float()
    value = torch.full_like(code, float("nan"))
    for level, rounded in enumerate(_LEVELS_IN_DTYPE[table.name, dtype]):
        value = torch.where(code == float(level), rounded, value)
    return value.to(dtype)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------


@triton_jit
def _fewbit_compress_kernel(
    x_ptr, out_ptr, n, nbytes,
    BREAKPOINTS: tl.constexpr, STEPS: tl.constexpr, BASE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # One program: the same BLOCK columns of x viewed as [8, nbytes] -> BLOCK
    # bytes of each plane. BREAKPOINTS/STEPS/BASE: the magnitude classes of
    # `CodeLayout`; the code is 4 * side + class.
    byte = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    words = tl.zeros([BLOCK], dtype=tl.int32)  # plane b in bits 8b..8b+7
    for j in tl.static_range(8):
        index = j * nbytes + byte
        inside = (byte < nbytes) & (index < n)
        x = tl.load(x_ptr + index, mask=inside, other=0.0).to(tl.float32)
        magnitude = tl.abs(x)
        code = tl.full([BLOCK], BASE, tl.int32)
        for i in tl.static_range(len(BREAKPOINTS)):
            code += tl.where(magnitude >= BREAKPOINTS[i], STEPS[i], 0)
        code += tl.where(x < BREAKPOINTS[0], 0, 4)  # NaN: 4 + the centre class 3
        code = tl.where(inside, code, 0)
        for plane in tl.static_range(3):
            words = words | (((code >> plane) & 1) << (8 * plane + j))
    for plane in tl.static_range(3):
        word = (words >> (8 * plane)) & 255
        tl.store(out_ptr + plane * nbytes + byte, word.to(tl.uint8), mask=byte < nbytes)


@triton_jit
def _fewbit_decompress_kernel(packed_ptr, out_ptr, n, nbytes, LEVELS: tl.constexpr, BLOCK: tl.constexpr):
    byte = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    words = tl.zeros([BLOCK], dtype=tl.int32)  # plane b in bits 8b..8b+7
    for plane in tl.static_range(3):
        word = tl.load(packed_ptr + plane * nbytes + byte, mask=byte < nbytes, other=0).to(tl.int32)
        words = words | (word << (8 * plane))
    for j in tl.static_range(8):
        code = ((words >> j) & 1) | ((words >> (7 + j)) & 2) | ((words >> (14 + j)) & 4)
        value = tl.full([BLOCK], float("nan"), tl.float32)
        for level in tl.static_range(len(LEVELS)):
            value = tl.where(code == level, LEVELS[level], value)
        index = j * nbytes + byte
        tl.store(out_ptr + index, rne_cast(value, out_ptr.dtype.element_ty), mask=(byte < nbytes) & (index < n))


def _triton_compress(table: CodeTable, x: torch.Tensor) -> list[torch.Tensor]:
    check_input(x, codec=table.name, dtypes=_DTYPES)
    require_triton(x, _fewbit_compress_kernel)
    flat = x.reshape(-1)  # copies a non-contiguous input once
    n = flat.numel()
    nbytes = (n + 7) // 8
    out = torch.empty(BITS, nbytes, dtype=torch.uint8, device=x.device)
    grid = ((nbytes + _BLOCK_BYTES - 1) // _BLOCK_BYTES,)
    layout = LAYOUTS[table.name]
    launch(
        _fewbit_compress_kernel, grid, flat, out, n, nbytes,
        BREAKPOINTS=layout.magnitude_breakpoints, STEPS=layout.class_steps, BASE=layout.class_base,
        BLOCK=_BLOCK_BYTES,
    )  # fmt: skip
    return [out]


def _triton_decompress(
    table: CodeTable, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    shape = _check_decompress(table, payload, shape, dtype)
    packed = payload[0].contiguous()
    require_triton(packed, _fewbit_decompress_kernel)
    n = numel_of(shape)
    nbytes = packed.shape[1]
    out = torch.empty(n, dtype=dtype, device=packed.device)
    grid = ((nbytes + _BLOCK_BYTES - 1) // _BLOCK_BYTES,)
    launch(_fewbit_decompress_kernel, grid, packed, out, n, nbytes, LEVELS=LAYOUTS[table.name].code_levels,
           BLOCK=_BLOCK_BYTES)
    return out.reshape(shape)


def triton_fewbit_gelu_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_fewbit_gelu_compress` (same bits)."""
    return _triton_compress(GELU, x)


def triton_fewbit_gelu_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _triton_decompress(GELU, payload, shape, dtype)


def triton_fewbit_silu_compress(x: torch.Tensor) -> list[torch.Tensor]:
    """Triton twin of `torch_fewbit_silu_compress` (same bits)."""
    return _triton_compress(SILU, x)


def triton_fewbit_silu_decompress(
    payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    return _triton_decompress(SILU, payload, shape, dtype)


# --------------------------------------------------------------------------
# Ops and codecs
# --------------------------------------------------------------------------


def _check_decompress(
    table: CodeTable, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
) -> tuple[Any, ...]:
    shape = check_shape(shape, codec=table.name)
    check_output_dtype(dtype, codec=table.name, dtypes=_DTYPES)
    check_payload(payload, fewbit_payload_spec(shape, dtype), codec=table.name)
    return shape


def _register(table: CodeTable) -> tuple[Any, Any]:
    return register_dispatched_ops(
        table.name,
        dtypes=_DTYPES,
        payload_spec=fewbit_payload_spec,
        torch_impl=(functools.partial(_torch_compress, table), functools.partial(_torch_decompress, table)),
        triton_impl=(functools.partial(_triton_compress, table), functools.partial(_triton_decompress, table)),
    )


fewbit_gelu_compress_op, fewbit_gelu_decompress_op = _register(GELU)
fewbit_silu_compress_op, fewbit_silu_decompress_op = _register(SILU)


def _short_op_name(target: str) -> str:
    """``"aten.gelu_backward.default"`` -> ``"gelu_backward"``."""
    parts = target.removeprefix("torch.ops.").split(".")
    if len(parts) > 1 and parts[0] == "aten":
        parts = parts[1:]
    return parts[0]


class FewBitCodec(OpCodec):
    """3-bit derivative codes for GELU/SiLU inputs (see module docstring)."""

    decompress_kind = DecompressKind.DERIVATIVE

    def __init__(self, table: CodeTable, error_bound: float) -> None:
        self.table = table
        self.name = table.name
        self.error_bound = error_bound

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return fewbit_payload_spec(shape, dtype)

    def aten_compress(self, x: torch.Tensor) -> list[torch.Tensor]:
        return _aten_compress(self.table, x)

    def aten_decompress(
        self, payload: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype
    ) -> torch.Tensor:
        return _aten_decompress(self.table, payload, shape, dtype)

    def calibration_refusal(self, stats: CodecStats) -> str | None:
        """Inputs with a standard deviation below `MIN_INPUT_STD` are
        refused (see there)."""
        std = stats.extra.get("input_std")
        if isinstance(std, float) and std < MIN_INPUT_STD:
            return f"input std {std:.3g} < {MIN_INPUT_STD}: the derivative's variation falls in its centre level"
        return None

    @property
    def replaced_op(self) -> Any:
        """``aten.gelu_backward`` (exact erf form) or ``aten.silu_backward``."""
        return getattr(torch.ops.aten, self.table.backward).default

    def workspace(self, shape: tuple[int, ...], dtype: torch.dtype, *, triton: bool) -> Workspace:
        """Torch reference, on B = 8 * ceil(numel / 8) one-byte codes: compress
        holds a float32 copy of a half-precision x, the codes and one bool
        mask, then the codes, one shifted row of them (B / 8) and the three
        planes; decompress the codes and one shifted plane, then the codes
        and one mask beside the result. The kernels need nothing."""
        if triton:
            return Workspace()
        numel = numel_of(shape)
        codes = (numel + 7) // 8 * 8
        copy = 0 if dtype == torch.float32 else float32_scratch(shape)
        planes = BITS * codes // 8
        return Workspace(
            compress=max(copy + codes + numel, codes + codes // 8 + planes) + _SMALL,
            decompress=2 * codes + _SMALL,
        )

    def applies(self, query: ApplyQuery) -> bool:
        """Only where the activation's backward is the value's sole reader.

        Any other reader needs x itself, which these bits cannot give back.
        Tensors of a few elements, whose three bit planes round up to more
        bytes than the data, are refused.
        """
        if not (
            query.dtype in _DTYPES
            and bool(query.consumer_targets)
            and all(_short_op_name(t) == self.table.backward for t in query.consumer_targets)
        ):
            return False
        original = numel_of([int(s) for s in query.shape]) * query.dtype.itemsize
        return self.compressed_nbytes(query.shape, query.dtype) < original

    def calibrate(self, samples: Sequence[torch.Tensor]) -> CodecStats:
        """Error of the decompressed derivative against the exact one (float64).

        ``extra`` has ``sqnr_db``, ``input_std`` (the levels are fitted for
        std 1; far from it the error grows) and ``nonfinite_fraction``.
        """
        signal = noise = 0.0
        abs_max = 0.0
        nonfinite = total = 0
        squares = 0.0
        for x in samples:
            exact = self.table.derivative(x.detach())
            rel, _ = error_stats(exact, self.decompress(self.compress(x)))
            finite = torch.isfinite(x)
            s = float(torch.where(torch.isfinite(exact), exact, 0).pow(2).sum())
            signal, noise = signal + s, noise + rel * rel * s
            xf = torch.where(finite, x.detach(), 0).double()
            squares += float(xf.pow(2).sum())
            if x.numel():
                abs_max = max(abs_max, float(xf.abs().max()))
            nonfinite += int((~finite).sum())
            total += x.numel()
        return CodecStats(
            codec=self.name,
            abs_max=abs_max,
            relative_error=math.sqrt(noise / signal) if signal > 0 else 0.0,
            extra={
                "sqnr_db": 10.0 * math.log10(signal / noise) if noise > 0 else math.inf,
                "input_std": math.sqrt(squares / (total - nonfinite)) if total > nonfinite else 0.0,
                "nonfinite_fraction": nonfinite / total if total else 0.0,
            },
        )


FEWBIT_GELU = REGISTRY.register(FewBitCodec(GELU, error_bound=0.12))
FEWBIT_SILU = REGISTRY.register(FewBitCodec(SILU, error_bound=0.10))
