"""Tests for kernels/fp8.py: per-row power-of-two-scaled fp8 (e4m3, e5m2).

Tier 1 (everywhere): reference and ops -- sizes, non-finite values, error
within the declared bound on realistic activations, validation, fake
tensors, torch.compile. Tier 2 (``test_interpreted_*``): Triton codes and
scales equal the reference bit for bit and decompressed values are
identical, under ``TRITON_INTERPRET=1`` in a fresh process (see the
docstring of test_bitmask.py for how and why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, get_codec
from adacc_compile.kernels import fp8
from adacc_compile.kernels.oplib import error_stats, is_interpreted, triton_available

FORMATS = {"fp8_e4m3": fp8.E4M3, "fp8_e5m2": fp8.E5M2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (3, 33), (4, 1000), (2, 3, 5), (3, 0), (0, 4), (300, 7), (2, 3000)]
INTERPRETED = is_interpreted(fp8._fp8_compress_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_triton_kernels_in_interpreter"
)


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, specials: bool = True) -> torch.Tensor:
    """Wide-dynamic-range values, with NaN, +-Inf and -0.0 planted when there is room."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    x = x.to(dtype)
    if specials and x.numel() > 5:
        flat = x.view(-1)
        flat[1], flat[2], flat[3], flat[4] = float("nan"), float("inf"), float("-inf"), -0.0
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical values including the sign of zero; any NaN equals any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a[keep], b[keep]) and torch.equal(a[keep].signbit(), b[keep].signbit())


def realistic_activations(rows: int = 64, cols: int = 512) -> Iterator[tuple[str, torch.Tensor]]:
    """Stand-ins for saved activations of a transformer block."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    yield "gaussian", randn(rows, cols)
    ln = F.layer_norm(randn(rows, cols) * 3 + 1, (cols,))
    yield "layernorm", ln * (1 + 0.1 * randn(cols)) + 0.05 * randn(cols)
    yield "gelu", F.gelu(randn(rows, cols) * 2)
    yield "relu", torch.relu(randn(rows, cols))
    yield "student_t3", randn(rows, cols) / torch.sqrt(randn(rows, cols, 3).pow(2).mean(-1))
    outliers = randn(rows, cols)
    outliers[:, torch.randperm(cols, generator=g)[: cols // 64]] *= 50
    yield "outlier_channels", outliers
    yield "row_scaled", randn(rows, cols) * torch.exp(randn(rows, 1))


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_shape_size_and_specials(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    codec = get_codec(name)
    x = _data(shape, dtype)
    packed = codec.compress(x)
    assert packed.nbytes == codec.compressed_nbytes(shape, dtype)
    out = codec.decompress(packed)
    assert out.shape == x.shape and out.dtype == dtype
    finite = torch.isfinite(x)
    assert torch.equal(torch.isnan(out), torch.isnan(x))
    assert torch.equal(out[torch.isinf(x)], x[torch.isinf(x)])
    assert torch.isfinite(out[finite]).all()
    if x.numel() > 5:
        assert torch.signbit(out.view(-1)[4])  # -0.0 keeps its sign
        rel, _ = error_stats(x.float(), out.float())
        assert rel < 2.0 ** -(FORMATS[name].mantissa_bits + 1)


@pytest.mark.parametrize("name", FORMATS)
def test_compressed_nbytes_is_exact(name: str) -> None:
    codec = get_codec(name)
    assert codec.compressed_nbytes((), torch.float32) == 1 + 4
    assert codec.compressed_nbytes((0,), torch.float32) == 4  # one (empty) row, one scale
    assert codec.compressed_nbytes((3, 0), torch.float16) == 12
    assert codec.compressed_nbytes((2, 3, 5), torch.bfloat16) == 30 + 6 * 4


@pytest.mark.parametrize("name", FORMATS)
def test_scale_ignores_non_finite_and_is_a_power_of_two(name: str) -> None:
    fmt = FORMATS[name]
    x = _data((4, 64), torch.float32, specials=False)
    dirty = x.clone()
    dirty[0, 3], dirty[1, 5], dirty[2, 7] = float("nan"), float("inf"), float("-inf")
    codes, scales = fp8.torch_fp8_compress(dirty, fmt)
    clean_codes, clean_scales = fp8.torch_fp8_compress(dirty.nan_to_num(0.0, 0.0, 0.0), fmt)
    assert torch.equal(scales, clean_scales)
    finite = torch.isfinite(dirty)
    assert torch.equal(codes[finite], clean_codes[finite])
    mantissa, _ = torch.frexp(scales)
    assert torch.all(mantissa == 0.5)
    scaled_max = x.abs().amax(-1) / scales
    assert torch.all((scaled_max >= 2.0**fmt.top) & (scaled_max < 2.0 ** (fmt.top + 1)))


@pytest.mark.parametrize("name", FORMATS)
def test_per_element_error_is_half_an_ulp_in_the_normal_range(name: str) -> None:
    fmt = FORMATS[name]
    x = _data((16, 256), torch.float32, specials=False)
    out = get_codec(name).decompress(get_codec(name).compress(x))
    # Elements whose scaled value is a normal fp8 number.
    normal = x.abs() >= x.abs().amax(-1, keepdim=True) * 2.0 ** (fmt.min_exponent - fmt.top)
    rel = ((out - x).abs() / x.abs())[normal]
    assert rel.max() <= 2.0 ** -(fmt.mantissa_bits + 1)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_within_declared_bound_on_realistic_activations(name: str, dtype: torch.dtype) -> None:
    codec = get_codec(name)
    for label, x in realistic_activations():
        x = x.to(dtype)
        rel, sqnr = error_stats(x.float(), codec.decompress(codec.compress(x)).float())
        assert rel <= codec.error_bound, (label, rel, sqnr)
        assert rel > codec.error_bound / 2, (label, rel)  # the bound is not vacuous
    stats = codec.calibrate([x for _, x in realistic_activations(8, 128)])
    assert 0 < stats.relative_error <= codec.error_bound and stats.extra["sqnr_db"] > 20


@pytest.mark.parametrize("name", FORMATS)
def test_non_contiguous_and_deterministic(name: str) -> None:
    codec = get_codec(name)
    x = _data((33, 10), torch.float32).t()
    a, b = codec.compress(x), codec.compress(x.contiguous())
    assert all(torch.equal(p, q) for p, q in zip(a.payload, b.payload))
    assert all(torch.equal(p, q) for p, q in zip(a.payload, codec.compress(x).payload))
    assert _same(codec.decompress(a), codec.decompress(b))


@pytest.mark.parametrize("name", FORMATS)
def test_applies_to_float_rows_that_shrink(name: str) -> None:
    codec = get_codec(name)
    assert codec.applies(ApplyQuery(shape=(8, 64), dtype=torch.bfloat16, producer_class="norm"))
    assert codec.applies(ApplyQuery(shape=(64,), dtype=torch.float32, producer_class="matmul"))
    assert not codec.applies(ApplyQuery(shape=(64, 1), dtype=torch.float16, producer_class="norm"))
    assert not codec.applies(ApplyQuery(shape=(8, 64), dtype=torch.bool, producer_class="mask"))
    assert not codec.applies(ApplyQuery(shape=(8, 64), dtype=torch.float64, producer_class="norm"))


@pytest.mark.parametrize("name", FORMATS)
def test_wrong_dtype_and_device_raise(name: str) -> None:
    codec, fmt = get_codec(name), FORMATS[name]
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match="dtype"):
            codec.compress(bad)
    with pytest.raises(ValueError, match="device"):
        fp8.torch_fp8_compress(torch.zeros(4, device="meta"), fmt)
    payload = list(codec.compress(torch.ones(2, 8)).payload)
    with pytest.raises(ValueError, match="elements"):
        codec.decompress_op(payload, [4, 4], torch.float32)  # same numel, other rows
    with pytest.raises(TypeError, match="dtype"):
        codec.decompress_op([payload[0], payload[1].half()], [2, 8], torch.float32)
    with pytest.raises(TypeError, match="decompress to"):
        codec.decompress_op(payload, [2, 8], torch.int8)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(3, 5, 7, dtype=torch.bfloat16)
        codes, scales = torch.ops.adacc.fp8_e4m3_compress.default(x)
        assert (codes.shape, codes.dtype) == ((3, 5, 7), torch.uint8)
        assert (scales.shape, scales.dtype) == ((15,), torch.float32)
        out = torch.ops.adacc.fp8_e4m3_decompress.default([codes, scales], [3, 5, 7], torch.bfloat16)
        assert out.shape == (3, 5, 7) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "name,backend,dynamic",
    [("fp8_e4m3", "aot_eager", True), ("fp8_e5m2", "aot_eager", False), ("fp8_e4m3", "inductor", False)],
)
def test_ops_compile_without_graph_breaks(name: str, backend: str, dynamic: bool) -> None:
    codec = get_codec(name)

    def round_trip(a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = codec.compress_op(a)
        return codec.decompress_op(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, backend=backend, fullgraph=True, dynamic=dynamic)
    x = _data((5, 33), torch.float32)
    out, payload = compiled(x)
    ref_out, ref_payload = round_trip(x)
    assert all(torch.equal(p, q) for p, q in zip(payload, ref_payload))
    assert _same(out, ref_out)


# ---------------------------------------------------------------- Triton tier


@pytest.mark.skipif(INTERPRETED or not triton_available(), reason="already interpreted / no Triton")
def test_triton_kernels_in_interpreter(request: pytest.FixtureRequest) -> None:
    if any(i.name == "test_codec_kernels_in_interpreter" for i in request.session.items):
        pytest.skip("test_oplib.py runs every codec's interpreted tests in one process")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:cacheprovider",
         "-k", "interpreted"],
        env={**os.environ, "TRITON_INTERPRET": "1", "ADACC_KERNELS": "auto"},
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


@interpreted
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interpreted_triton_matches_reference(name: str, dtype: torch.dtype) -> None:
    fmt = FORMATS[name]
    for shape in SHAPES:
        x = _data(shape, dtype, seed=len(shape))
        ref = fp8.torch_fp8_compress(x, fmt)
        got = fp8.triton_fp8_compress(x, fmt)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), shape
        out = fp8.triton_fp8_decompress(ref, shape, dtype, fmt)
        assert _same(out, fp8.torch_fp8_decompress(ref, shape, dtype, fmt)), shape


def _ties_and_every_code(fmt: fp8.Fp8Format) -> torch.Tensor:
    """Every representable value, every midpoint and its fp32 neighbours, in
    one row whose scale is 1, with ±Inf and NaN of both signs appended."""
    codes = torch.arange(0, 0x79, dtype=torch.uint8)  # 0 .. 2**(top+1), the largest code produced
    grid = codes.view(fmt.torch_dtype).float()
    mid = (grid[1:] + grid[:-1]) / 2
    probes = torch.cat([grid[:-1], mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(torch.tensor(1e9))])
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -float("nan")])
    return torch.cat([torch.tensor([2.0 ** (fmt.top + 1) - 1]), probes, -probes, special])


@pytest.mark.parametrize("lanes", [16, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", FORMATS)
def test_compiled_aten_form_rounds_ties_and_every_code_like_torch(name: str, lanes: int, monkeypatch) -> None:
    """What a compiled plan runs (Inductor's C++ of the aten form), with
    16-lane vectors (torch's own fp8 casts, vectorised) and 8-lane ones (the
    bit-level encode): the reference's codes and values, bit for bit."""
    from adacc_compile import compat_inductor
    from adacc_compile.kernels import aten_graphs

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    fmt, codec = FORMATS[name], get_codec(name)
    row = _ties_and_every_code(fmt).view(1, -1)
    graphs = aten_graphs.codec_graphs(codec, row)
    ref = fp8.torch_fp8_compress(row, fmt)
    got = list(compat_inductor.inductor_compile_inference(graphs.compress, [row])(row))
    assert ref[1].item() == 1.0
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    (restored,) = compat_inductor.inductor_compile_inference(graphs.decompress, ref)(*ref)
    assert _same(restored, fp8.torch_fp8_decompress(ref, row.shape, torch.float32, fmt))


@interpreted
@pytest.mark.parametrize("name", FORMATS)
def test_interpreted_rounding_ties_and_every_code(name: str) -> None:
    """Every representable value, every midpoint and its fp32 neighbours."""
    fmt = FORMATS[name]
    codes = torch.arange(0, 0x79, dtype=torch.uint8)  # 0 .. 2**(top+1), the largest code produced
    grid = codes.view(fmt.torch_dtype).float()
    mid = (grid[1:] + grid[:-1]) / 2
    probes = torch.cat([grid[:-1], mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(torch.tensor(1e9))])
    # A row max just below 2**(top+1) fixes scale = 1; probes reach 2**(top+1) by rounding.
    row = torch.cat([torch.tensor([2.0 ** (fmt.top + 1) - 1]), probes, -probes])
    ref = fp8.torch_fp8_compress(row, fmt)
    got = fp8.triton_fp8_compress(row, fmt)
    assert ref[1].item() == 1.0
    assert torch.equal(got[0], ref[0])
    assert _same(fp8.triton_fp8_decompress(ref, row.shape, torch.float32, fmt),
                 fp8.torch_fp8_decompress(ref, row.shape, torch.float32, fmt))


@interpreted
@pytest.mark.parametrize("name", FORMATS)
def test_interpreted_non_contiguous_and_op_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt, codec = FORMATS[name], get_codec(name)
    x = _data((40, 9), torch.bfloat16, seed=3).t()
    ref = fp8.torch_fp8_compress(x, fmt)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = codec.compress(x)
    assert all(torch.equal(p, q) for p, q in zip(packed.payload, ref))
    assert _same(codec.decompress(packed), fp8.torch_fp8_decompress(ref, x.shape, x.dtype, fmt))


# ---------------------------------------------------------------- calibrated scale


#: The formats whose codec takes a calibrated scale.
CALIBRATED = ["fp8_e5m2"]


def _scale(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32)


def test_only_e5m2_takes_a_calibrated_scale() -> None:
    x = torch.randn(4, 8)
    assert get_codec("fp8_e4m3").calibration_parameters(x) is None
    with pytest.raises(ValueError, match="takes no calibrated scale"):
        fp8.fp8_calibrated_scale(x, fp8.E4M3)
    assert [n for n in FORMATS if get_codec(n).calibration_parameters(x) is not None] == CALIBRATED


@pytest.mark.parametrize("name", CALIBRATED)
def test_calibrated_scale_places_the_finite_maximum_and_ignores_non_finite(name: str) -> None:
    fmt, codec = FORMATS[name], get_codec(name)
    x = _data((50, 70), torch.float32, seed=4)  # NaN and ±Inf planted
    scale = codec.calibration_parameters(x)
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (1,)
    assert int(scale.view(torch.int32)) & 0x7FFFFF == 0  # a power of two
    amax = float(x[torch.isfinite(x)].abs().max())
    assert 2.0**fmt.calibrated_top <= amax / float(scale) < 2.0 ** (fmt.calibrated_top + 1)
    assert float(codec.calibration_parameters(x.to(torch.bfloat16))) == float(
        codec.calibration_parameters(x.to(torch.bfloat16).float())
    )
    for nothing in (torch.zeros(3, 4), torch.full((2, 2), float("nan")), torch.empty(0, 5)):
        assert float(codec.calibration_parameters(nothing)) == 1.0


def _calibrated_probes(fmt: fp8.Fp8Format) -> torch.Tensor:
    """At scale 1: every code up to the saturation value, every midpoint and
    its fp32 neighbours, values beyond the saturation value (one that
    rounds to it, finite ones far above, the largest float32), ±Inf and NaN
    of both signs, subnormal fp8 values and ±0."""
    top = int(torch.tensor([fmt.saturation]).to(fmt.torch_dtype).view(torch.uint8))
    grid = torch.arange(0, top + 1, dtype=torch.uint8).view(fmt.torch_dtype).float()
    mid = (grid[1:] + grid[:-1]) / 2
    probes = torch.cat([grid, mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(torch.tensor(1e9))])
    beyond = torch.tensor([fmt.saturation * 1.01, fmt.saturation * 1000, 3.4e38, 1e30])
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -float("nan"), -0.0])
    return torch.cat([probes, -probes, beyond, -beyond, special])


@pytest.mark.parametrize("lanes", [16, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", FORMATS)
def test_calibrated_compress_is_the_references_bit_for_bit_eager_and_compiled(
    name: str, lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibrated aten form (torch's casts with 16 lanes, the bit-level
    encode with 8), run eagerly and compiled by Inductor, gives the
    reference's codes; finite values beyond the range saturate, NaN is 0x7F
    whatever its sign, ±Inf keep their codes."""
    from adacc_compile import compat_inductor
    from adacc_compile.kernels import aten_graphs

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    fmt, codec = FORMATS[name], get_codec(name)
    row = _calibrated_probes(fmt).view(1, -1)
    scale = _scale(1.0)
    ref = fp8.torch_fp8_compress_calibrated(row, scale, fmt)
    eager = codec.aten_compress(row, scale)
    graphs = aten_graphs.codec_graphs(codec, row, scale)
    compiled = list(compat_inductor.inductor_compile_inference(graphs.compress, [row, scale])(row, scale))
    for got in (eager, compiled):
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    codes, values = ref[0].view(-1), row.view(-1)
    assert torch.equal(codes[values.isnan()], torch.full((2,), fmt.nan_code, dtype=torch.uint8))
    assert codes[values == float("inf")].tolist() == [fmt.pos_inf_code]
    assert codes[values == float("-inf")].tolist() == [fmt.neg_inf_code]
    restored = fp8.torch_fp8_decompress(ref, row.shape, torch.float32, fmt).view(-1)
    over = torch.isfinite(values) & (values.abs() > fmt.saturation)
    assert torch.equal(restored[over], values[over].sign() * fmt.saturation)
    inside = torch.isfinite(values) & ~over
    assert torch.equal(restored[inside], values[inside].to(fmt.torch_dtype).float())  # the cast's own rounding


@pytest.mark.parametrize("name", CALIBRATED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_calibrated_round_trip_within_declared_bound_on_realistic_activations(name: str, dtype: torch.dtype) -> None:
    """Calibrated on the value itself, as the calibrate pass does."""
    codec = get_codec(name)
    for family, x in realistic_activations():
        x = x.to(dtype)
        payload = codec.aten_compress(x, codec.calibration_parameters(x))
        x_hat = codec.aten_decompress(payload, list(x.shape), dtype)
        err = error_stats(x.float(), x_hat.float())[0]
        assert err <= codec.error_bound, (family, err)


@pytest.mark.parametrize("name", CALIBRATED)
def test_a_value_that_outgrows_its_calibration_saturates_and_measures_over_the_bound(name: str) -> None:
    """What the monitor measures (`Codec.calibrate` with the plan's
    parameters): a batch whose values grew far past the calibrated range
    loses its largest values to saturation, and the measured error says so;
    with a scale measured on it, the error is back within the bound."""
    codec = get_codec(name)
    x = next(v for family, v in realistic_activations() if family == "layernorm")
    scale = codec.calibration_parameters(x)
    assert codec.calibrate([x], scale).relative_error <= codec.error_bound
    grown = x * 1e4
    assert codec.calibrate([grown], scale).relative_error > codec.error_bound
    assert codec.calibrate([grown], codec.calibration_parameters(grown)).relative_error <= codec.error_bound


@pytest.mark.parametrize("name", CALIBRATED)
def test_calibrated_compress_reads_the_value_once(name: str) -> None:
    """No statistic of the value in the calibrated compress (the reason for
    the calibrated scale): its traced graph reduces nothing, while the
    per-row one takes each row's maximum."""
    from adacc_compile.kernels import aten_graphs

    codec = get_codec(name)
    x = torch.randn(8, 64)
    reductions = {torch.ops.aten.amax.default, torch.ops.aten.max.default, torch.ops.aten.max.dim}

    def reduces(gm: torch.fx.GraphModule) -> bool:
        return any(n.target in reductions for n in gm.graph.nodes)

    assert reduces(aten_graphs.codec_graphs(codec, x).compress)
    assert not reduces(aten_graphs.codec_graphs(codec, x, codec.calibration_parameters(x)).compress)


@pytest.mark.parametrize("name", FORMATS)
def test_calibrated_scale_of_the_wrong_kind_raises(name: str) -> None:
    fmt, codec = FORMATS[name], get_codec(name)
    x = torch.randn(4, 8)
    for bad in (torch.ones(2), torch.ones(1, dtype=torch.float64), torch.ones(())):
        with pytest.raises(ValueError, match="calibrated scale"):
            codec.aten_compress(x, bad)
        with pytest.raises(ValueError, match="calibrated scale"):
            fp8.torch_fp8_compress_calibrated(x, bad, fmt)
    empty = fp8.torch_fp8_compress_calibrated(torch.empty(0, 8), _scale(2.0), fmt)
    assert empty[0].shape == (0, 8) and empty[1].shape == (0,)
    assert codec.aten_compress(torch.empty(3, 0), _scale(2.0))[1].tolist() == [2.0, 2.0, 2.0]
