"""Tests for kernels/fewbit.py: 3-bit codes of gelu'(x) / silu'(x).

Tier 1 (everywhere): the hard-coded levels and breakpoints are recomputed
from scratch; decompress returns the derivative (not x) within the declared
error of ``gelu_backward`` / ``silu_backward``; NaN -> NaN and ±Inf -> the
derivative's limits; exact sizes; validation, fake tensors, torch.compile.
Tier 2 (``test_interpreted_*``): the Triton bit planes equal the reference
bit for bit and the decompressed derivatives are identical, under
``TRITON_INTERPRET=1`` in a fresh process (see test_bitmask.py and the
runner in test_int_outlier.py, which takes both files in one process).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, DecompressKind, get_codec
from adacc_compile.kernels import fewbit
from adacc_compile.kernels.oplib import error_stats, is_interpreted, triton_available

TABLES = {"fewbit_gelu": fewbit.GELU, "fewbit_silu": fewbit.SILU}
BACKWARD = {
    "fewbit_gelu": lambda x: torch.ops.aten.gelu_backward(torch.ones_like(x), x),
    "fewbit_silu": lambda x: torch.ops.aten.silu_backward(torch.ones_like(x), x),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (8,), (9,), (3, 33), (4, 1000), (2, 3, 5), (3, 0)]
INTERPRETED = is_interpreted(fewbit._fewbit_compress_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_triton_kernels_in_interpreter"
)
REFERENCE = {
    "fewbit_gelu": (fewbit.torch_fewbit_gelu_compress, fewbit.torch_fewbit_gelu_decompress),
    "fewbit_silu": (fewbit.torch_fewbit_silu_compress, fewbit.torch_fewbit_silu_decompress),
}
TRITON = {
    "fewbit_gelu": (fewbit.triton_fewbit_gelu_compress, fewbit.triton_fewbit_gelu_decompress),
    "fewbit_silu": (fewbit.triton_fewbit_silu_compress, fewbit.triton_fewbit_silu_decompress),
}


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, specials: bool = True) -> torch.Tensor:
    """N(0, 1.5^2) pre-activations with NaN and ±Inf planted when there is room."""
    g = torch.Generator().manual_seed(seed)
    x = (1.5 * torch.randn(shape, generator=g)).to(dtype)
    if specials and x.numel() > 4:
        flat = x.view(-1)
        flat[1], flat[2], flat[3] = float("nan"), float("inf"), float("-inf")
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical values; any NaN equals any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    return torch.equal(a[~a.isnan()], b[~b.isnan()])


# ---------------------------------------------------------------- the constants


@pytest.mark.parametrize("name", TABLES)
def test_constants_are_recomputed_by_the_fit(name: str) -> None:
    table = TABLES[name]
    levels, breakpoints, base, relative = fewbit.fit_code_table(table.derivative)
    assert levels == pytest.approx(table.levels, abs=2e-4)
    assert [b for b, _ in breakpoints] == pytest.approx(table.breakpoints, abs=2e-3)
    assert tuple(s for _, s in breakpoints) == table.steps and base == table.base
    assert 0.0 in table.levels and 1.0 in table.levels and len(table.levels) == fewbit.NAN_CODE
    assert relative < 0.09  # 0.0825 (GELU), 0.0846 (SiLU) at x ~ N(0, 1)


@pytest.mark.parametrize("name", TABLES)
def test_codes_pick_the_nearest_level_to_the_exact_derivative(name: str) -> None:
    """Layout and levels agree: each x gets the level closest to f'(x)."""
    table, layout = TABLES[name], fewbit.LAYOUTS[name]
    x = torch.linspace(-8, 8, 200001)
    codes = fewbit._torch_codes(table, x)
    assert int(codes.max()) < fewbit.NAN_CODE
    picked = torch.tensor(layout.code_levels, dtype=torch.float64)[codes.long()]
    levels = torch.tensor(table.levels, dtype=torch.float64)
    nearest = levels[(table.derivative(x).unsqueeze(1) - levels).abs().argmin(dim=1)]
    disagree = x[picked != nearest]
    # Only within float32 rounding of a breakpoint.
    assert all(min(abs(float(v) - b) for b in table.breakpoints) < 1e-5 for v in disagree)


@pytest.mark.parametrize("name", TABLES)
def test_layout_gives_the_tables_level_everywhere_but_at_negative_breakpoints(name: str) -> None:
    """The sign-magnitude codes stand for the table's own function of x: on
    both sides of every breakpoint, at ±0 and ±Inf; at ``x = -b`` exactly the
    layout takes the outer interval (|x| >= b), the table the inner one."""
    table, layout = TABLES[name], fewbit.LAYOUTS[name]
    edges = torch.tensor(table.breakpoints)
    off = torch.cat([edges.nextafter(torch.tensor(-math.inf)), edges.nextafter(torch.tensor(math.inf))])
    x = torch.cat([edges, off, torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e30, -1e30])])
    codes = fewbit._torch_codes(table, x).tolist()
    for value, code in zip(x.tolist(), codes):
        expected = fewbit._table_level(table, value)
        if value < 0 and value in table.breakpoints:  # the outer neighbour's level
            expected = fewbit._table_level(table, math.nextafter(value, -math.inf))
        assert layout.code_levels[code] == expected, (value, code)
    assert fewbit._torch_codes(table, torch.tensor([math.nan])).tolist() == [fewbit.NAN_CODE]


@pytest.mark.parametrize("name", TABLES)
def test_class_planes_rebuild_every_code(name: str) -> None:
    """The aten compress sums each bit of the magnitude class from
    `CodeLayout.class_planes` and takes the side from one comparison; on both
    sides of every breakpoint and at ±Inf those bits give the code."""
    table, layout = TABLES[name], fewbit.LAYOUTS[name]
    edges = torch.tensor(table.breakpoints)
    x = torch.cat([edges, torch.nextafter(edges, torch.tensor(-math.inf)), torch.tensor([-math.inf, math.inf])])
    code = torch.zeros(x.shape, dtype=torch.int32)
    for b, (first, changes) in enumerate(layout.class_planes):
        bit = first + sum(change * (x.abs() >= edge).int() for change, edge in zip(changes, layout.magnitude_breakpoints))
        code |= bit << b
    code |= (~(x < layout.magnitude_breakpoints[0])).int() << 2
    assert torch.equal(code, fewbit._torch_codes(table, x).int())


def test_layout_refuses_tables_it_cannot_code() -> None:
    """Breakpoints not symmetric about 0 have no sign-magnitude layout."""
    lopsided = dataclasses.replace(fewbit.SILU, breakpoints=(-0.9, -0.5, -0.1, 0.2, 0.5, 0.9))
    with pytest.raises(ValueError, match="not symmetric"):
        fewbit.code_layout(lopsided)


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("name", TABLES)
def test_decompress_returns_the_derivative_with_limits(name: str) -> None:
    codec, table = get_codec(name), TABLES[name]
    assert codec.decompress_kind is DecompressKind.DERIVATIVE
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, 30.0, -30.0, 1e30, -1e30])
    out = codec.decompress(codec.compress(x))
    assert torch.isnan(out[0]) and out[1:].tolist() == [1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.0]
    assert set(out[1:].tolist()) <= set(table.levels)


@pytest.mark.parametrize("name", TABLES)
def test_calibration_refuses_inputs_far_below_unit_std(name: str) -> None:
    """At std 0.08 the derivative's error is within the declared bound, but
    the option is refused (the calibrate pass drops it); at std 1 it is not."""
    from adacc_compile.passes import calibrate

    codec = get_codec(name)
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0))
    small = codec.calibrate([x * 0.08])
    assert small.relative_error <= codec.error_bound
    assert "input std 0.08" in codec.calibration_refusal(small)
    assert codec.calibration_refusal(codec.calibrate([x])) is None
    refused = calibrate._measure("h", name, x * 0.08)
    assert not refused.accepted and "input std" in refused.reason
    assert calibrate._measure("h", name, x).accepted


def test_known_bytes_plane_major() -> None:
    """SiLU codes 7 (NaN), 6 (+Inf: side 1, class 2), 2 (-Inf), 3 (0.0: the
    centre class); ten of them pad to 16 codes viewed as [8, 2]: bit b of
    code 2j + i is bit j of byte i of plane b."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([nan, inf, -inf, 0.0, inf, nan, -inf, 0.0, inf, 0.0])
    (planes,) = fewbit.torch_fewbit_silu_compress(x)
    # byte 0 holds codes 7, 2, 6, 2, 6 (bits 0..4), byte 1 codes 6, 3, 7, 3, 3
    assert planes.tolist() == [[0b00001, 0b11110], [0b11111, 0b11111], [0b10101, 0b00101]]


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_shape_size_and_specials(name: str, dtype: torch.dtype) -> None:
    codec = get_codec(name)
    for shape in SHAPES:
        x = _data(shape, dtype)
        packed = codec.compress(x)
        assert packed.nbytes == codec.compressed_nbytes(shape, dtype) == 3 * ((x.numel() + 7) // 8), shape
        out = codec.decompress(packed)
        assert out.shape == x.shape and out.dtype == dtype, shape
        assert torch.equal(out.isnan(), x.isnan()), shape
        assert torch.equal(out[x == float("inf")], torch.ones_like(out[x == float("inf")]))
        assert torch.equal(out[x == float("-inf")], torch.zeros_like(out[x == float("-inf")]))


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_derivative_error_within_declared_bound(name: str, dtype: torch.dtype) -> None:
    """Against the aten backward it replaces, for pre-activation scales 0.5-3."""
    codec = get_codec(name)
    g = torch.Generator().manual_seed(0)
    for std in (0.5, 1.0, 3.0):
        x = (std * torch.randn(32, 512, generator=g)).to(dtype)
        grad_out = torch.randn(32, 512, generator=g).to(dtype)
        exact = BACKWARD[name](x.double())
        rel, _ = error_stats(exact, codec.decompress(codec.compress(x)))
        assert rel <= codec.error_bound, (std, rel)
        # As the rewrite uses it: grad_out * f'(x) instead of f_backward(grad_out, x).
        grad_in = grad_out.double() * codec.decompress(codec.compress(x)).double()
        rel_grad, _ = error_stats(grad_out.double() * exact, grad_in)
        assert rel_grad <= codec.error_bound * 1.1, (std, rel_grad)


@pytest.mark.parametrize("name", TABLES)
def test_non_contiguous_and_deterministic(name: str) -> None:
    codec = get_codec(name)
    for x in (_data((33, 10), torch.float32).t(), _data((6, 40), torch.bfloat16)[:, ::3]):
        a, b = codec.compress(x), codec.compress(x.contiguous())
        assert torch.equal(a.payload[0], b.payload[0])
        assert torch.equal(a.payload[0], codec.compress(x).payload[0])
        assert _same(codec.decompress(a), codec.decompress(b))


@pytest.mark.parametrize("name", TABLES)
def test_applies_only_where_the_activation_backward_is_the_sole_reader(name: str) -> None:
    codec, table = get_codec(name), TABLES[name]
    other = "silu_backward" if table.backward == "gelu_backward" else "gelu_backward"

    def query(*targets: str, dtype: torch.dtype = torch.bfloat16) -> ApplyQuery:
        return ApplyQuery(
            shape=(8, 64), dtype=dtype, producer_class="matmul",
            consumer_classes=("activation",), consumer_targets=targets,
        )  # fmt: skip

    assert codec.applies(query(f"aten.{table.backward}.default"))
    assert codec.applies(query(f"aten.{table.backward}.default", f"aten.{table.backward}.default"))
    assert codec.applies(query(table.backward))
    assert not codec.applies(query(f"aten.{other}.default"))
    assert not codec.applies(query(f"aten.{table.backward}.default", "aten.mm.default"))  # x itself needed
    assert not codec.applies(query())  # no backward reader known
    assert not codec.applies(query(f"aten.{table.backward}.default", dtype=torch.float64))
    tiny = ApplyQuery(shape=(1,), dtype=torch.float16, producer_class="matmul", consumer_targets=(table.backward,))
    assert not codec.applies(tiny)  # 3 bytes of planes for 2 bytes of data


@pytest.mark.parametrize("name", TABLES)
def test_calibrate_measures_the_derivative_error(name: str) -> None:
    codec = get_codec(name)
    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(64, 256, generator=g) for _ in range(2)]
    samples[1][0, 0] = float("nan")
    stats = codec.calibrate(samples)
    assert 0.05 < stats.relative_error <= codec.error_bound
    assert stats.extra["input_std"] == pytest.approx(1.0, abs=0.05)
    assert stats.extra["nonfinite_fraction"] == pytest.approx(1 / (2 * 64 * 256))
    assert math.isclose(stats.extra["sqnr_db"], -20 * math.log10(stats.relative_error), rel_tol=1e-9)
    assert stats.abs_max > 3


@pytest.mark.parametrize("name", TABLES)
def test_wrong_dtype_and_device_raise(name: str) -> None:
    codec = get_codec(name)
    torch_compress, torch_decompress = REFERENCE[name]
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match="dtype"):
            codec.compress(bad)
    with pytest.raises(ValueError, match="device"):
        torch_compress(torch.zeros(4, device="meta"))
    payload = list(codec.compress(torch.ones(2, 8)).payload)
    with pytest.raises(ValueError, match="elements"):
        codec.decompress_op(payload, [2, 9], torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        codec.decompress_op([payload[0].to(torch.int8)], [2, 8], torch.float32)
    with pytest.raises(TypeError, match="decompress to"):
        codec.decompress_op(payload, [2, 8], torch.int8)
    with pytest.raises(ValueError, match="payload has"):
        codec.decompress_op(payload * 2, [2, 8], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(3, 5, 7, dtype=torch.bfloat16)
        (planes,) = torch.ops.adacc.fewbit_gelu_compress.default(x)
        assert (planes.shape, planes.dtype) == ((3, 14), torch.uint8)
        out = torch.ops.adacc.fewbit_gelu_decompress.default([planes], [3, 5, 7], torch.bfloat16)
        assert out.shape == (3, 5, 7) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "name,backend,dynamic",
    [
        ("fewbit_gelu", "aot_eager", True),
        ("fewbit_silu", "aot_eager", False),
        pytest.param("fewbit_gelu", "inductor", False, marks=pytest.mark.slow),  # 28 s: keeps the default run under 15 minutes
    ],
)
def test_ops_compile_without_graph_breaks(name: str, backend: str, dynamic: bool) -> None:
    codec = get_codec(name)

    def backward_with_codes(a: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = codec.compress_op(a)
        return grad * codec.decompress_op(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(backward_with_codes, backend=backend, fullgraph=True, dynamic=dynamic)
    x, grad = _data((5, 33), torch.float32), torch.randn(5, 33)
    out, payload = compiled(x, grad)
    ref_out, ref_payload = backward_with_codes(x, grad)
    assert torch.equal(payload[0], ref_payload[0])
    assert _same(out, ref_out)


# ---------------------------------------------------------------- Triton tier

#: Codec test files whose interpreted tiers share one fresh process (one torch import).
SIBLINGS = ("test_int_outlier.py", "test_fewbit.py")


def _interpreter_files(request: pytest.FixtureRequest) -> list[Path]:
    """The files this file's runner must cover: none when another runner does.

    test_oplib.py's runner covers the files it lists; otherwise the first
    selected sibling runner takes every selected sibling.
    """
    shared: tuple[str, ...] = ()
    for item in request.session.items:
        if item.name == "test_codec_kernels_in_interpreter":
            shared = tuple(getattr(item.module, "CODEC_TEST_FILES", ()))
    runners = [
        item.path
        for item in request.session.items
        if item.name == "test_triton_kernels_in_interpreter"
        and item.path.name in SIBLINGS
        and item.path.name not in shared
    ]
    if Path(__file__).name in shared or (runners and runners[0] != Path(__file__)):
        return []
    return runners or [Path(__file__)]


@pytest.mark.skipif(INTERPRETED or not triton_available(), reason="already interpreted / no Triton")
def test_triton_kernels_in_interpreter(request: pytest.FixtureRequest) -> None:
    files = _interpreter_files(request)
    if not files:
        pytest.skip("another runner covers this file's interpreted tests")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *map(str, files), "-q", "-x", "-p", "no:cacheprovider",
         "-k", "interpreted"],
        env={**os.environ, "TRITON_INTERPRET": "1", "ADACC_KERNELS": "auto"},
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


@interpreted
@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interpreted_triton_matches_reference(name: str, dtype: torch.dtype) -> None:
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    for shape in [(0,), (), (1,), (7,), (9,), (3, 33), (2, 3, 5), (5, 1000)]:
        x = _data(shape, dtype, seed=len(shape))
        ref = torch_compress(x)
        assert torch.equal(triton_compress(x)[0], ref[0]), shape
        assert _same(triton_decompress(ref, shape, dtype), torch_decompress(ref, shape, dtype)), shape


@interpreted
@pytest.mark.parametrize("name", TABLES)
def test_interpreted_breakpoints_and_every_code(name: str) -> None:
    """Each breakpoint and its float32 neighbours, so every code and every edge appears."""
    table = TABLES[name]
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    b = torch.tensor(table.breakpoints)
    below, above = b.nextafter(torch.tensor(-1e9)), b.nextafter(torch.tensor(1e9))
    x = torch.cat([b, below, above, torch.tensor([float("nan")])])
    ref = torch_compress(x)
    assert torch.equal(triton_compress(x)[0], ref[0])
    out = triton_decompress(ref, x.shape, x.dtype)
    assert _same(out, torch_decompress(ref, x.shape, x.dtype))
    assert set(out[:-1].tolist()) == set(table.levels)


@interpreted
@pytest.mark.parametrize("name", TABLES)
def test_interpreted_non_contiguous_and_op_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = get_codec(name)
    torch_compress, torch_decompress = REFERENCE[name]
    x = _data((40, 9), torch.bfloat16, seed=3).t()
    ref = torch_compress(x)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = codec.compress(x)
    assert torch.equal(packed.payload[0], ref[0])
    assert _same(codec.decompress(packed), torch_decompress(ref, x.shape, x.dtype))
