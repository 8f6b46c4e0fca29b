"""Tests for kernels/int8_smooth.py: int8 codes, one scale per row, channels
smoothed by power-of-two factors.

Tier 1 (everywhere): reference and ops -- exact sizes, NaN/Inf at any
position and in any number, known codes, the factors (powers of two, exact
ceil(log2)), the worst-case error bound, the error on realistic
activations within the declared bound, validation, fake tensors; the aten
form with and without calibrated factors equal to the reference bit for bit,
eager and compiled by Inductor, and with factors free of any reduction over
rows. (test_aten_forms.py checks the aten form generically too.)
Tier 2 (``test_interpreted_*``): the Triton payload and decompressed values
equal the reference bit for bit under ``TRITON_INTERPRET=1`` in a fresh
process (run by test_oplib.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile import compat_inductor
from adacc_compile.kernels import ApplyQuery, get_codec, int8_smooth
from adacc_compile.kernels.oplib import error_stats, is_interpreted

from .test_int_channel import INTERPRETER_CASES
from .test_int_outlier import _data, _same, _same_payload, llm_like, realistic_activations

NAME = "int8_smooth"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (3, 33), (4, 1000), (2, 3, 65), (3, 0), (0, 7), (130, 9), (64, 64), (65, 3)]
#: The guaranteed worst case (module docstring): half a step of m_r / 126 per
#: element of a row of C channels, relative to the row's norm in smoothed units.
def _worst(channels: int) -> float:
    return math.sqrt(max(channels, 1)) / (2 * int8_smooth.QMAX)


ref_compress, ref_decompress = int8_smooth.torch_int8_smooth_compress, int8_smooth.torch_int8_smooth_decompress
interpreted = pytest.mark.skipif(
    not is_interpreted(int8_smooth._compress_kernel),
    reason="needs TRITON_INTERPRET=1 at import; run by test_oplib.py::test_codec_kernels_in_interpreter",
)


def _smoothed_error(x: torch.Tensor, out: torch.Tensor, factors: torch.Tensor) -> float:
    """Relative error measured in the smoothed units x / f (what the worst case bounds)."""
    return error_stats(x.float() / factors, out.float() / factors)[0]


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_shape_size_and_specials(dtype: torch.dtype) -> None:
    codec = get_codec(NAME)
    for shape in SHAPES:
        x = _data(shape, dtype)
        packed = codec.compress(x)
        assert packed.nbytes == codec.compressed_nbytes(shape, dtype), shape
        out = codec.decompress(packed)
        assert out.shape == x.shape and out.dtype == dtype, shape
        assert torch.equal(out.isnan(), x.isnan()), shape
        assert torch.equal(out[x.isinf()], x[x.isinf()]), shape
        assert torch.isfinite(out[torch.isfinite(x)]).all(), shape
        if x.numel() > 6:
            assert out.view(-1)[5] == 0 and not torch.isnan(out.view(-1)[5])
            factors = packed.payload[2]
            assert _smoothed_error(x, out, factors) <= _worst(x.shape[-1]), shape


def test_compressed_nbytes_is_exact_and_static() -> None:
    codec = get_codec(NAME)
    assert codec.compressed_nbytes((130, 1000), torch.bfloat16) == 130 * 1000 + 4 * 130 + 4 * 1000
    assert codec.compressed_nbytes((2, 64, 8), torch.float32) == 128 * 8 + 4 * 128 + 4 * 8
    assert codec.compressed_nbytes((), torch.float16) == 1 + 4 + 4
    assert codec.compressed_nbytes((0, 7), torch.float32) == 4 * 7
    assert codec.compressed_nbytes((3, 0), torch.float32) == 4 * 3
    payload = codec.compress(torch.ones(3, 5, 130)).payload
    assert [tuple(p.shape) for p in payload] == [(15, 130), (15,), (130,)]
    assert [p.dtype for p in payload] == [torch.int8, torch.float32, torch.float32]


def test_known_codes_and_reserved_values() -> None:
    # Four channels with largest finite |x| 2.52, 1.0, 1.0 and 63: lower median
    # 1.0, so channel 3 (ratio 63 / 4 = 15.75) gets factor 2^4, the others 1.
    # Row 0: y = [2.52, 0.578125, inf, 63 / 16 = 3.9375]: scale 3.9375 / 126 = 1/32
    # exactly, so 2.52 -> 80.64 -> 81, 0.578125 -> 18.5 -> 18 (ties to even),
    # inf -> 127, 3.9375 -> 126. Row 1: y = [-0.01, -inf, nan, -2]: scale 2 / 126,
    # -0.01 -> -0.63 -> -1. Row 2: y = [0, 1, 1, 0]: scale 1 / 126.
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[2.52, 0.578125, inf, 63.0], [-0.01, -inf, nan, -32.0], [0.0, 1.0, 1.0, 0.0]])
    codes, scale, factors = ref_compress(x)
    assert factors.tolist() == [1.0, 1.0, 1.0, 16.0]
    assert scale.tolist() == [1 / 32, pytest.approx(2 / 126, rel=1e-7), pytest.approx(1 / 126, rel=1e-7)]
    assert codes.tolist() == [[81, 18, 127, 126], [-1, -127, -128, -126], [0, 126, 126, 0]]
    out = ref_decompress([codes, scale, factors], [3, 4], torch.float32)
    assert out[0, 2] == inf and out[1, 1] == -inf and out[1, 2].isnan()
    assert out[0, 3] == 63.0 and out[0, 1] == 0.5625  # code * scale * 16, the factor exact
    assert out[1, 3] == pytest.approx(-32.0, rel=1e-6)


def test_all_zero_and_non_finite_rows_survive() -> None:
    x = torch.zeros(5, 3)
    x[1] = float("inf")  # a row with nothing finite
    x[2, 0] = 3.0
    codes, scale, factors = ref_compress(x)
    assert (scale[[0, 1, 3, 4]] == int8_smooth.MIN_SCALE).all()  # the floor: codes 0
    assert factors.tolist() == [1.0, 1.0, 1.0]  # median 0: no smoothing
    out = get_codec(NAME).decompress(get_codec(NAME).compress(x))
    assert torch.equal(out, x)


def test_any_number_of_non_finite_values_survives() -> None:
    codec = get_codec(NAME)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(150, 70, generator=g)
    pick = torch.rand(150, 70, generator=g)
    x[pick < 0.1] = float("nan")
    x[(pick >= 0.1) & (pick < 0.2)] = float("inf")
    x[(pick >= 0.2) & (pick < 0.3)] = float("-inf")
    x[:, 0] = float("nan")  # a whole channel
    x[7, :] = float("inf")  # a whole row
    packed = codec.compress(x)
    out = codec.decompress(packed)
    assert torch.equal(out.isnan(), x.isnan())
    assert torch.equal(out[x.isinf()], x[x.isinf()])
    finite = torch.isfinite(x)
    assert torch.isfinite(out[finite]).all()
    assert _smoothed_error(x, out, packed.payload[2]) <= _worst(70)


# ---------------------------------------------------------------- factors


def _unit_channels(rows: int, channels: int, seed: int) -> torch.Tensor:
    """Uniform values in (-1, 1) with every channel's largest |x| exactly 1 (row 0)."""
    x = torch.rand(rows, channels, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    x[0] = 1.0
    return x


def test_factors_are_powers_of_two_one_for_normal_channels() -> None:
    x = _unit_channels(256, 512, seed=2)
    x[:, 100] *= 64.0  # 64x the median: ratio 64 / 4 = 16 -> k = 4
    x[:, 101] *= 65.0  # ratio 16.25 -> k = 5
    x[:, 200] *= 1000.0  # ratio 250 -> k = 8
    x[:, 300] *= 3.0  # below RATIO x the median: 1
    factors = get_codec(NAME).calibration_parameters(x)
    assert factors.dtype == torch.float32 and factors.shape == (512,)
    k = torch.log2(factors)
    assert torch.equal(k, k.round()) and (k >= 0).all() and (k <= int8_smooth.KMAX).all()
    assert factors[[100, 101, 200]].tolist() == [2.0**4, 2.0**5, 2.0**8]
    others = torch.ones(512, dtype=torch.bool)
    others[[100, 101, 200]] = False
    assert (factors[others] == 1.0).all()


def test_channel_factors_known_ratios_and_edge_cases() -> None:
    f = int8_smooth.channel_factors
    # Median (lower, element (C - 1) // 2 of the sorted maxima) 1.0; RATIO 4.
    m = torch.tensor([1.0] * 8 + [4.0, 4.0001, 8.0, 64.0, 256.0, 1e30, 0.0])
    assert f(m).tolist() == [1.0] * 8 + [1.0, 2.0, 2.0, 16.0, 64.0, 2.0**64, 1.0]
    assert f(torch.zeros(5)).tolist() == [1.0] * 5  # median 0: no smoothing
    assert f(torch.tensor([0.0, 0.0, 5.0])).tolist() == [1.0] * 3
    assert f(torch.tensor([3.0])).tolist() == [1.0]
    assert f(torch.zeros(0)).shape == (0,)
    assert f(torch.tensor([1e38, 3e38, 2e38])).tolist() == [1.0] * 3  # RATIO * ref overflows: ratio 0


def test_channel_factors_match_a_float64_log2() -> None:
    """ceil(log2) from the float32 bits against float64 math on random
    ratios over many octaves, powers of two among them."""
    g = torch.Generator().manual_seed(3)
    maxima = torch.exp2(torch.rand(4000, generator=g) * 80 - 10).float()
    maxima[::7] = torch.exp2(torch.randint(-10, 70, (572,), generator=g).float())  # exact powers of two
    maxima[0] = 1.0  # keep the median well defined
    factors = int8_smooth.channel_factors(maxima)
    ref = float(maxima.sort().values[(4000 - 1) // 2])
    ratio = maxima.double() / (ref * int8_smooth.RATIO)
    k = torch.ceil(torch.log2(ratio)).clamp(0, int8_smooth.KMAX)
    assert torch.equal(factors.double(), torch.exp2(k))


def test_channel_maxima_ignore_non_finite_values() -> None:
    x = torch.tensor([[1.0, float("nan"), -3.0], [-2.0, float("inf"), float("-inf")], [0.5, 0.25, 1.0]])
    assert int8_smooth.channel_maxima(x).tolist() == [2.0, 0.25, 3.0]
    assert int8_smooth.channel_maxima(torch.zeros(0, 4)).tolist() == [0.0] * 4
    assert int8_smooth.channel_maxima(torch.full((2, 1), float("nan"))).tolist() == [0.0]


def test_outlier_channels_do_not_set_the_row_scales() -> None:
    """An outlier channel 64x the median is divided by 16: the payload is
    that of the value with that channel 4x the median and no smoothing."""
    x = _unit_channels(128, 256, seed=4)
    x[:, 9] *= 64.0
    codes, scale, factors = ref_compress(x)
    assert factors[9] == 16.0 and (factors[torch.arange(256) != 9] == 1.0).all()
    tamed = x.clone()
    tamed[:, 9] /= 16
    codes_tamed, scale_tamed, _ = ref_compress(tamed, torch.ones(256))
    assert torch.equal(scale, scale_tamed) and torch.equal(codes, codes_tamed)


# ---------------------------------------------------------------- error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_within_declared_bound_on_realistic_activations(dtype: torch.dtype) -> None:
    codec = get_codec(NAME)
    measured = {}
    for label, x in realistic_activations(rows=256):
        x = x.to(dtype)
        measured[label] = error_stats(x, codec.decompress(codec.compress(x)))[0]
    assert max(measured.values()) <= 0.6 * codec.error_bound, measured
    # Light-tailed rows and channel outliers are close to int8_channel's figures.
    for label in ("gaussian", "layernorm", "gelu", "silu", "llm_outliers"):
        assert measured[label] <= 0.013, measured


def test_error_with_outlier_channels_10_to_100x() -> None:
    codec = get_codec(NAME)
    for channels in (512, 1024):
        heavy = llm_like(256, channels, outliers=8)
        rel, _ = error_stats(heavy, codec.decompress(codec.compress(heavy)))
        assert rel <= 0.01, (channels, rel)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 1024, generator=g)
    x[:, ::97] *= torch.linspace(10, 100, 11)
    packed = codec.compress(x)
    rel, _ = error_stats(x, codec.decompress(packed))
    assert rel <= 0.01, rel
    assert (packed.payload[2][::97] > 1).all()


def test_heavy_tailed_rows_stay_within_the_declared_bound() -> None:
    """Student-t rows (nu = 2: no variance) are the worst case of a row
    scale: one element sets it. Still below the declared bound at 512 channels."""
    codec = get_codec(NAME)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 512, generator=g) / torch.sqrt(torch.randn(256, 512, 2, generator=g).pow(2).mean(-1))
    rel, _ = error_stats(x, codec.decompress(codec.compress(x)))
    assert rel <= codec.error_bound, rel


def test_worst_case_is_a_row_of_one_large_value() -> None:
    """The bound sqrt(C) / 252: one value at m_r, the rest half a step."""
    channels = 1000
    step = 1.0 / 126
    x = torch.full((1, channels), 0.5 * step * (1 - 1e-3))
    x[0, 0] = 1.0
    payload = ref_compress(x, torch.ones(channels))  # unsmoothed (the factors would shrink x[0, 0])
    assert (payload[0][0, 1:] == 0).all()
    out = ref_decompress(payload, [1, channels], torch.float32)
    rel, _ = error_stats(x, out)
    assert 0.9 * _worst(channels) * (1 / math.sqrt(1 + channels / (4 * 126**2))) <= rel <= _worst(channels)


# ---------------------------------------------------------------- aten form


def test_aten_form_with_and_without_factors_equals_reference(monkeypatch) -> None:
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(NAME)
    for dtype in DTYPES:
        for shape in ((37, 130), (2, 3, 65), (7,), (), (0, 5), (5, 0)):
            x = _data(shape, dtype, seed=6)
            ref = ref_compress(x)
            assert _same_payload(codec.aten_compress(x), ref), (dtype, shape)
            other = codec.calibration_parameters(_data(shape, dtype, seed=7) * 40)
            with_factors = codec.aten_compress(x, other)
            assert _same_payload(with_factors, ref_compress(x, other)), (dtype, shape)
            assert with_factors[2] is other  # passed through
            restored = codec.aten_decompress(with_factors, list(shape), dtype)
            assert _same(restored, ref_decompress(with_factors, list(shape), dtype)), (dtype, shape)


def test_inductor_compiled_aten_form_with_factors_equals_reference(monkeypatch) -> None:
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(NAME)
    x = _data((37, 130), torch.bfloat16, seed=8)
    factors = codec.calibration_parameters(_data((37, 130), torch.bfloat16, seed=9))
    assert (factors > 1).any()
    graph = compat_inductor.trace_aten(lambda v, f: tuple(codec.aten_compress(v, f)), [x, factors])
    payload = compat_inductor.inductor_compile_inference(graph, [x, factors])(x, factors)
    ref = ref_compress(x, factors)
    assert _same_payload(list(payload), ref)
    graph = compat_inductor.trace_aten(lambda *p: (codec.aten_decompress(list(p), [37, 130], x.dtype),), ref)
    (restored,) = compat_inductor.inductor_compile_inference(graph, ref)(*ref)
    assert _same(restored, ref_decompress(ref, [37, 130], x.dtype))


def test_inductor_compiled_factors_equal_eager() -> None:
    """channel_maxima / channel_factors compiled by Inductor give the eager bits."""
    g = torch.Generator().manual_seed(10)
    maxima = torch.exp2(torch.rand(3000, generator=g) * 40 - 5)
    x = torch.randn(64, 3000, generator=g) * maxima
    x[3, 5], x[4, 6] = float("nan"), float("-inf")
    fn = lambda v: (int8_smooth.channel_factors(int8_smooth.channel_maxima(v)),)  # noqa: E731
    graph = compat_inductor.trace_aten(fn, [x])
    (compiled,) = compat_inductor.inductor_compile_inference(graph, [x])(x)
    assert torch.equal(compiled, fn(x)[0])
    assert (compiled > 1).any()


def test_aten_form_with_factors_reads_rows_only() -> None:
    """With calibrated factors, the compress has no reduction over the rows
    (channel maxima) and no sort: one pass of row maxima and codes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    codec = get_codec(NAME)
    x = torch.randn(16, 96)
    factors = codec.calibration_parameters(x)

    def reductions(gm) -> list[tuple[str, object]]:
        out = []
        for n in gm.graph.nodes:
            name = str(n.target)
            if "sort" in name or "topk" in name or "kthvalue" in name:
                out.append((name, None))
            if any(r in name for r in ("amax", "max.dim", "aminmax", "sum", "mean")):
                out.append((name, n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")))
        return out

    with_factors = reductions(make_fx(lambda v, f: tuple(codec.aten_compress(v, f)))(x, factors))
    assert with_factors == [("aten.amax.default", [1])], with_factors
    without = reductions(make_fx(lambda v: tuple(codec.aten_compress(v)))(x))
    assert ("aten.amax.default", [0]) in without and any("sort" in n for n, _ in without), without


def test_aten_form_rejects_wrong_factors() -> None:
    codec = get_codec(NAME)
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="factors have shape"):
        codec.aten_compress(x, torch.ones(7))
    with pytest.raises(TypeError, match="float32"):
        codec.aten_compress(x, torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="factors have shape"):
        ref_compress(x, torch.ones(4))


# ---------------------------------------------------------------- codec plumbing


def test_non_contiguous_and_deterministic() -> None:
    codec = get_codec(NAME)
    for x in (_data((70, 10), torch.float32).t(), _data((130, 200), torch.float16)[:, ::2]):
        a, b = codec.compress(x), codec.compress(x.contiguous())
        assert _same_payload(a.payload, b.payload)
        assert _same_payload(a.payload, codec.compress(x).payload)
        assert _same(codec.decompress(a), codec.decompress(b))


def test_applies_like_int8_channel() -> None:
    codec = get_codec(NAME)

    def query(shape=(256, 64), dtype=torch.bfloat16, producer="norm", consumers=("matmul",)) -> ApplyQuery:
        return ApplyQuery(shape=shape, dtype=dtype, producer_class=producer, consumer_classes=consumers)

    assert codec.applies(query()) and codec.applies(query(shape=(8, 4096), dtype=torch.float32))
    assert not codec.applies(query(consumers=("activation",)))
    assert not codec.applies(query(producer="softmax"))
    assert not codec.applies(query(dtype=torch.float64))
    for shape in ((), (1, 4), (0, 64)):
        assert not codec.applies(query(shape=shape, dtype=torch.float16)), shape


def test_wrong_dtype_device_and_payload_raise() -> None:
    codec = get_codec(NAME)
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match="dtype"):
            codec.compress(bad)
        with pytest.raises(TypeError, match="dtype"):
            codec.calibration_parameters(bad)
    with pytest.raises(ValueError, match="device"):
        ref_compress(torch.zeros(4, device="meta"))
    payload = list(codec.compress(torch.ones(2, 64)).payload)
    with pytest.raises(ValueError, match="elements"):
        codec.decompress_op(payload, [4, 32], torch.float32)  # same numel, other layout
    with pytest.raises(TypeError, match="decompress to"):
        codec.decompress_op(payload, [2, 64], torch.int8)
    with pytest.raises(ValueError, match="payload has"):
        codec.decompress_op(payload[:2], [2, 64], torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        codec.decompress_op([payload[0], payload[1], payload[2].double()], [2, 64], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(3, 50, 130, dtype=torch.bfloat16)
        codes, scales, factors = torch.ops.adacc.int8_smooth_compress.default(x)
        assert (codes.shape, codes.dtype) == ((150, 130), torch.int8)
        assert (scales.shape, scales.dtype) == ((150,), torch.float32)
        assert (factors.shape, factors.dtype) == ((130,), torch.float32)
        out = torch.ops.adacc.int8_smooth_decompress.default([codes, scales, factors], [3, 50, 130], x.dtype)
        assert out.shape == (3, 50, 130) and out.dtype == torch.bfloat16
        params = get_codec(NAME).calibration_parameters(x)
        assert (params.shape, params.dtype) == ((130,), torch.float32)
        payload = get_codec(NAME).aten_compress(x, params)
        assert [tuple(p.shape) for p in payload] == [(150, 130), (150,), (130,)]


def test_ops_compile_without_graph_breaks() -> None:
    codec = get_codec(NAME)

    def round_trip(a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = codec.compress_op(a)
        return codec.decompress_op(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, backend="aot_eager", fullgraph=True, dynamic=True)
    x = _data((70, 100), torch.float32)
    out, payload = compiled(x)
    ref_out, ref_payload = round_trip(x)
    assert _same_payload(payload, ref_payload)
    assert _same(out, ref_out)


# ---------------------------------------------------------------- Triton tier




@interpreted
@pytest.mark.parametrize("dtype,shapes", INTERPRETER_CASES, ids=[str(d) for d, _ in INTERPRETER_CASES])
def test_interpreted_triton_matches_reference(dtype: torch.dtype, shapes: list[tuple[int, ...]]) -> None:
    for shape in shapes:
        x = _data(shape, dtype, seed=len(shape))
        ref = ref_compress(x)
        assert torch.equal(int8_smooth.triton_channel_maxima(x), int8_smooth.channel_maxima(x)), shape
        assert _same_payload(int8_smooth.triton_int8_smooth_compress(x), ref), shape
        out = int8_smooth.triton_int8_smooth_decompress(ref, shape, dtype)
        assert _same(out, ref_decompress(ref, shape, dtype)), shape


@interpreted
def test_interpreted_non_finite_ties_tiny_values_and_factors() -> None:
    x = torch.zeros(70, 300)
    x[:, 0] = (torch.arange(70, dtype=torch.float32) - 35) / 2  # halves: ties
    x[3, 0] = float("nan")
    x[:, 1] = float("-inf")  # a channel with nothing finite
    x[5, :] = float("inf")  # a row with nothing finite
    x[:, 2] = torch.randn(70) * 1e-38  # subnormal scales: the floor
    x[:, 3:] = torch.randn(70, 297)
    x[:, 200] *= 300.0  # factor 2^7
    ref = ref_compress(x)
    assert ref[2][200] > 1
    assert _same_payload(int8_smooth.triton_int8_smooth_compress(x), ref)
    other = get_codec(NAME).calibration_parameters(torch.randn(70, 300) * torch.linspace(1, 100, 300))
    assert _same_payload(int8_smooth.triton_int8_smooth_compress(x, other), ref_compress(x, other))
    assert _same(int8_smooth.triton_int8_smooth_decompress(ref, x.shape, x.dtype), ref_decompress(ref, x.shape, x.dtype))


@interpreted
def test_interpreted_non_contiguous_and_op_path(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = get_codec(NAME)
    x = _data((70, 9), torch.bfloat16, seed=3).t()
    ref = ref_compress(x)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = codec.compress(x)
    assert _same_payload(packed.payload, ref)
    assert _same(codec.decompress(packed), ref_decompress(ref, x.shape, x.dtype))
