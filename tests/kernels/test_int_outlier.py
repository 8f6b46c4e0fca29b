"""Tests for kernels/int_outlier.py: group-wise int8/int4 with exact outlier channels.

Tier 1 (everywhere): reference and ops -- exact sizes, NaN/Inf at any
position and in any number, outlier channels bit-exact, error within the
declared bound on realistic activations, int4_outlier far ahead of plain
int4 on outlier-heavy input, validation, fake tensors, torch.compile.
Tier 2 (``test_interpreted_*``): Triton codes, scales, index and outlier
values equal the reference bit for bit, and decompressed values are
identical, under ``TRITON_INTERPRET=1`` in a fresh process (see the
docstring of test_bitmask.py for how and why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, get_codec
from adacc_compile.kernels import int_outlier
from adacc_compile.kernels.oplib import error_stats, is_interpreted, triton_available

FORMATS = {"int8_outlier": int_outlier.INT8, "int4_outlier": int_outlier.INT4}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (3, 33), (4, 1000), (2, 3, 65), (3, 0), (0, 7), (5, 64), (9, 200)]
INTERPRETED = is_interpreted(int_outlier._quantize_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_triton_kernels_in_interpreter"
)
REFERENCE = {
    "int8_outlier": (int_outlier.torch_int8_outlier_compress, int_outlier.torch_int8_outlier_decompress),
    "int4_outlier": (int_outlier.torch_int4_outlier_compress, int_outlier.torch_int4_outlier_decompress),
}
TRITON = {
    "int8_outlier": (int_outlier.triton_int8_outlier_compress, int_outlier.triton_int8_outlier_decompress),
    "int4_outlier": (int_outlier.triton_int4_outlier_compress, int_outlier.triton_int4_outlier_decompress),
}


def _data(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, specials: bool = True) -> torch.Tensor:
    """Gaussian with two strong channels, and NaN, ±Inf, -0.0 planted when there is room."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if x.dim() >= 1 and x.shape[-1] > 4:
        x[..., 2] *= 25
        x[..., -1] *= -12
    x = x.to(dtype)
    if specials and x.numel() > 6:
        flat = x.view(-1)
        flat[1], flat[3], flat[4], flat[5] = float("nan"), float("inf"), float("-inf"), -0.0
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical values including the sign of zero; any NaN equals any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a[keep], b[keep]) and torch.equal(a[keep].signbit(), b[keep].signbit())


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Payload tensors compared as raw bits (float payloads may hold NaN)."""
    t = t.reshape(-1)
    return t.view(torch.uint8) if t.dtype.is_floating_point else t


def _same_payload(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        p.dtype == q.dtype and p.shape == q.shape and torch.equal(_bits(p), _bits(q)) for p, q in zip(a, b)
    )


def llm_like(rows: int, channels: int, outliers: int, seed: int = 0) -> torch.Tensor:
    """N(0, 1) rows with ``outliers`` channels (one per group of 32) at 20-30x, mostly one sign.

    Like the "massive activation" channels of LLM residual streams: large in
    almost every token, so a plain group scale is dominated by them.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, channels, generator=g) * torch.exp(0.3 * torch.randn(rows, 1, generator=g))
    index = torch.arange(outliers) * (channels // outliers) + 5
    magnitude = 20.0 + 10.0 * torch.rand(outliers, generator=g)
    sign = torch.where(torch.arange(outliers) % 2 == 0, 1.0, -1.0)
    x[:, index] = magnitude * (sign + 0.25 * torch.randn(rows, outliers, generator=g))
    return x


def realistic_activations(rows: int = 64, cols: int = 512) -> Iterator[tuple[str, torch.Tensor]]:
    """Stand-ins for inputs of linear layers in a transformer block."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    yield "gaussian", randn(rows, cols)
    ln = F.layer_norm(randn(rows, cols) * 3 + 1, (cols,))
    yield "layernorm", ln * (1 + 0.1 * randn(cols)) + 0.05 * randn(cols)
    yield "gelu", F.gelu(randn(rows, cols))
    yield "silu", F.silu(randn(rows, cols))
    yield "student_t3", randn(rows, cols) / torch.sqrt(randn(rows, cols, 3).pow(2).mean(-1))
    yield "llm_outliers", llm_like(rows, cols, outliers=4)


# ---------------------------------------------------------------- calibrated outlier channels


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_calibrated_channels_are_the_ones_a_call_chooses(name: str, dtype: torch.dtype) -> None:
    """On the value it was measured on, the calibrated compress gives the
    per-call payload bit for bit, and passes the index through."""
    codec = get_codec(name)
    for shape in ((37, 300), (2, 3, 65), (7,), (), (0, 5), (5, 0)):
        x = _data(shape, dtype, seed=3)
        index = codec.calibration_parameters(x)
        channels = x.shape[-1] if x.dim() else 1
        assert index.dtype == torch.int32 and tuple(index.shape) == (int(int_outlier.outlier_slots(channels)),)
        per_call = codec.aten_compress(x)
        calibrated = codec.aten_compress(x, index)
        assert _same_payload(per_call, calibrated), (shape, dtype)
        assert calibrated[2] is index
        assert _same_payload(calibrated, REFERENCE[name][0](x)), (shape, dtype)


@pytest.mark.parametrize("name", FORMATS)
def test_other_calibrated_channels_match_the_reference_and_stay_exact(name: str) -> None:
    """A batch whose outliers moved: the calibrated channels are still the
    exact ones, a new strong channel only widens its group's scale, and the
    error stays within the codec's worst case."""
    codec, fmt = get_codec(name), FORMATS[name]
    calibration = llm_like(64, 512, outliers=8, seed=1)
    index = codec.calibration_parameters(calibration)
    x = llm_like(64, 512, outliers=8, seed=2)
    x[:, 100] *= 40  # an outlier the calibration did not see
    x[3, 7], x[4, index[0]] = float("nan"), float("-inf")
    payload = codec.aten_compress(x, index)
    assert _same_payload(payload, int_outlier._torch_compress(fmt, x, index))
    out = codec.aten_decompress(payload, list(x.shape), x.dtype)
    assert _same(out[:, index.long()], x[:, index.long()])
    assert out[3, 7].isnan() and out[4, index[0]] == float("-inf")
    finite = torch.isfinite(x)
    err = torch.where(finite, out - x, 0.0).norm() / torch.where(finite, x, 0.0).norm()
    assert err <= (fmt.group**0.5) / (2 * (fmt.qmax - 1)) + 2.0**-7


@pytest.mark.parametrize("name", FORMATS)
def test_inductor_compiled_calibrated_compress_equals_reference(name: str) -> None:
    from adacc_compile import compat_inductor

    codec, fmt = get_codec(name), FORMATS[name]
    x = _data((37, 200), torch.bfloat16, seed=4)
    other = _data((37, 200), torch.bfloat16, seed=5) * torch.linspace(1, 9, 200).to(torch.bfloat16)
    index = codec.calibration_parameters(other)
    graph = compat_inductor.trace_aten(lambda v, i: tuple(codec.aten_compress(v, i)), [x, index])
    payload = compat_inductor.inductor_compile_inference(graph, [x, index])(x, index)
    assert _same_payload(list(payload), int_outlier._torch_compress(fmt, x, index))


@pytest.mark.parametrize("name", FORMATS)
def test_calibrated_compress_reads_rows_only(name: str) -> None:
    """With calibrated channels: no channel maxima over the rows and no sort."""
    from torch.fx.experimental.proxy_tensor import make_fx

    codec = get_codec(name)
    x = torch.randn(16, 256)
    index = codec.calibration_parameters(x)

    def reductions(gm) -> list[str]:
        names = [str(n.target) for n in gm.graph.nodes]
        return [n for n in names if any(r in n for r in ("sort", "topk", "amax", "max.dim", "aminmax"))]

    with_index = reductions(make_fx(lambda v, i: tuple(codec.aten_compress(v, i)))(x, index))
    assert with_index == ["aten.amax.default"], with_index
    without = reductions(make_fx(lambda v: tuple(codec.aten_compress(v)))(x))
    assert any("sort" in n for n in without) and len(without) > 1, without


@pytest.mark.parametrize("name", FORMATS)
def test_wrong_calibrated_channels_raise(name: str) -> None:
    codec, fmt = get_codec(name), FORMATS[name]
    x = torch.randn(4, 256)
    with pytest.raises(ValueError, match="expected \\(4,\\)"):
        codec.aten_compress(x, torch.arange(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="int32"):
        codec.aten_compress(x, torch.arange(4))
    with pytest.raises(ValueError, match="expected"):
        int_outlier._torch_compress(fmt, x, torch.arange(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="meta"):
        codec.aten_compress(x, torch.arange(4, dtype=torch.int32, device="meta"))


@pytest.mark.parametrize("name", FORMATS)
def test_calibrate_with_parameters_runs_the_calibrated_form(name: str) -> None:
    codec = get_codec(name)
    x = llm_like(64, 256, outliers=4)
    index = codec.calibration_parameters(x)
    with_index = codec.calibrate([x], index)
    assert with_index.relative_error == pytest.approx(codec.calibrate([x]).relative_error, rel=1e-12)
    # Channels that miss the outliers cost accuracy, and calibrate shows it.
    wrong = torch.arange(int(index.shape[0]), dtype=torch.int32) * 2 + 1
    assert codec.calibrate([x], wrong).relative_error > 2 * with_index.relative_error


@pytest.mark.parametrize("name", FORMATS)
def test_tiny_values_keep_a_finite_reciprocal(name: str) -> None:
    """Scales have a floor (the smallest normal float32), so the reciprocal
    that the codes are multiplied by is finite: subnormal inputs give small
    codes, not saturated ones, and an all-zero group gets the floor."""
    codec, fmt = get_codec(name), FORMATS[name]
    x = torch.zeros(2, 128)
    x[0] = torch.linspace(-1, 1, 128) * 1e-40  # subnormal float32
    for compress in (codec.aten_compress, REFERENCE[name][0]):
        payload = compress(x)
        scales = payload[1].float()
        assert (scales == int_outlier.MIN_SCALE).all()
        out = codec.aten_decompress(payload, [2, 128], torch.float32)
        assert torch.isfinite(out).all() and (out[1] == 0).all()
        assert (out[0].abs() <= 1e-40).all()


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_shape_size_and_specials(name: str, dtype: torch.dtype) -> None:
    codec, fmt = get_codec(name), FORMATS[name]
    for shape in SHAPES:
        x = _data(shape, dtype)
        packed = codec.compress(x)
        assert packed.nbytes == codec.compressed_nbytes(shape, dtype), shape
        out = codec.decompress(packed)
        assert out.shape == x.shape and out.dtype == dtype, shape
        assert torch.equal(out.isnan(), x.isnan()), shape
        assert torch.equal(out[x.isinf()], x[x.isinf()]), shape
        finite = torch.isfinite(x)
        assert torch.isfinite(out[finite]).all(), shape
        if x.numel() > 6:
            assert out.view(-1)[5] == 0 and not torch.isnan(out.view(-1)[5])
            # The guaranteed worst case (module docstring), with bfloat16 scale rounding.
            worst = (fmt.group**0.5) / (2 * (fmt.qmax - 1)) + 2.0**-7
            assert error_stats(x, out)[0] <= worst, shape


def test_compressed_nbytes_is_exact_and_static() -> None:
    int8, int4 = get_codec("int8_outlier"), get_codec("int4_outlier")
    # 4 x 1024 bf16: codes, scales (16 / 32 groups), 16 slots of int32, 4 x 16 values.
    assert int8.compressed_nbytes((4, 1024), torch.bfloat16) == 4096 + 4 * 16 * 2 + 16 * 4 + 4 * 16 * 2
    assert int4.compressed_nbytes((4, 1024), torch.bfloat16) == 2048 + 4 * 32 * 2 + 16 * 4 + 4 * 16 * 2
    # Codes are padded to whole groups (1000 -> 1024 channels), 15 slots.
    assert int8.compressed_nbytes((4, 1000), torch.bfloat16) == 4096 + 4 * 16 * 2 + 15 * 4 + 4 * 15 * 2
    assert int4.compressed_nbytes((3, 7), torch.float32) == 3 * 16 + 3 * 2 + 4 + 3 * 4  # odd C, one slot
    assert int8.compressed_nbytes((), torch.float16) == 64 + 2 + 4 + 2
    assert int8.compressed_nbytes((0, 7), torch.float32) == 4  # the slot index only
    assert int4.compressed_nbytes((5, 0), torch.float32) == 0
    assert int4_outlier_payload_shapes((2, 3, 65)) == [(6, 48), (6, 3), (1,), (6, 1)]


def int4_outlier_payload_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [tuple(p.shape) for p in get_codec("int4_outlier").compress(torch.ones(shape)).payload]


def test_known_int4_codes_and_packing() -> None:
    # C = 5 -> one outlier slot, taken by channel 4 (3.0); the group's scale
    # is 1 / 7 cut to bfloat16 (0.142578125), and 0.5 / scale = 3.507 rounds to 4.
    x = torch.tensor([[0.0, 1.0, -1.0, 0.5, 3.0]])
    codes, scale, index, values = int_outlier.torch_int4_outlier_compress(x)
    assert index.tolist() == [4] and values.tolist() == [[3.0]]
    assert scale.float().item() == 0.142578125
    # codes 0, 7, -7 (nibble 9), 4, outlier 0, then padding to 32 channels:
    # byte j holds channel j low and channel j + 16 (padding, 0) high.
    assert codes.tolist() == [[0x00, 0x07, 0x09, 0x04] + [0x00] * 12]


def test_int4_bytes_pair_channel_j_with_channel_j_plus_half() -> None:
    # C = 40 pads to P = 64 (two groups): byte j holds channel j in its low
    # nibble and channel j + 32 in its high one. Channel 39 (3.0) is the one
    # outlier slot; each group's scale is 1 / 7 cut to bfloat16.
    x = torch.zeros(1, 40)
    x[0, 1], x[0, 33], x[0, 39] = 1.0, -1.0, 3.0
    codes, _, index, _ = int_outlier.torch_int4_outlier_compress(x)
    assert index.tolist() == [39]
    # channel 1 -> 7 (low nibble of byte 1), channel 33 -> -7, nibble 9 (high nibble of byte 1)
    assert codes.tolist() == [[0x00, 0x97] + [0x00] * 30]


def test_outlier_channels_are_exact_and_chosen_deterministically() -> None:
    x = llm_like(16, 256, outliers=4).to(torch.bfloat16)
    codec = get_codec("int4_outlier")
    packed = codec.compress(x)
    index = packed.payload[2]
    planted = torch.arange(4) * 64 + 5
    assert set(planted.tolist()) <= set(index.tolist()) and index.tolist() == sorted(index.tolist())
    out = codec.decompress(packed)
    assert torch.equal(out[:, planted], x[:, planted])
    # Ties go to the lower channel, so equal channels give a fixed choice.
    ones = torch.ones(3, 256)
    assert int_outlier.torch_int8_outlier_compress(ones)[2].tolist() == [0, 1, 2, 3]
    assert _same_payload(codec.compress(x).payload, packed.payload)


@pytest.mark.parametrize("name", FORMATS)
def test_a_flagged_groups_largest_value_is_not_read_as_inf(name: str) -> None:
    """The codes clamp at ±QMAX in every group, so a flagged group's scale
    must keep its finite values below QMAX - 0.5 however much the bfloat16
    truncation shrinks it: the worst case is a quotient just under
    (1 + 2^-7) * 2^e, truncated to 2^e. With QMAX - 1 as the divisor int8's
    largest value would round to 127, +Inf's code."""
    codec, fmt = get_codec(name), FORMATS[name]
    channels = 64  # one outlier slot, taken by the last channel
    x = torch.zeros(2, channels)
    worst = fmt.special_limit * (1 + 2.0**-7 - 2.0**-22)
    x[:, 1] = worst
    x[:, 2] = -worst
    x[0, 5], x[1, 5] = float("nan"), float("inf")
    x[:, -1] = 1e6  # the outlier slot goes elsewhere
    ref = int_outlier._torch_compress(fmt, x)
    assert _same_payload(codec.aten_compress(x), ref)
    from adacc_compile import compat_inductor

    graph = compat_inductor.trace_aten(lambda v: tuple(codec.aten_compress(v)), [x])
    assert _same_payload(list(compat_inductor.inductor_compile_inference(graph, [x])(x)), ref)
    out = codec.decompress(codec.compress(x))
    assert out[:, 1].tolist() == pytest.approx([worst, worst], rel=2.0**-6)
    assert out[:, 2].tolist() == pytest.approx([-worst, -worst], rel=2.0**-6)
    assert out[0, 5].isnan() and out[1, 5] == float("inf")


@pytest.mark.parametrize("name", FORMATS)
def test_any_number_of_non_finite_values_survives(name: str) -> None:
    """More non-finite channels than outlier slots, whole groups of them, every kind."""
    codec, fmt = get_codec(name), FORMATS[name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 130, generator=g)
    pick = torch.rand(8, 130, generator=g)
    x[pick < 0.1] = float("nan")
    x[(pick >= 0.1) & (pick < 0.2)] = float("inf")
    x[(pick >= 0.2) & (pick < 0.3)] = float("-inf")
    x[0, :] = float("nan")  # a whole row
    x[1, : fmt.group] = float("inf")  # a whole group
    x[2, :] = torch.tensor([float("inf"), float("-inf")]).repeat(65)
    out = codec.decompress(codec.compress(x))
    assert torch.equal(out.isnan(), x.isnan())
    assert torch.equal(out[x.isinf()], x[x.isinf()])
    finite = torch.isfinite(x)
    assert torch.isfinite(out[finite]).all()
    # Finite neighbours of non-finite values keep their accuracy (one level of resolution less).
    rows = finite.sum(1) > 0
    clean = torch.where(finite, x, 0.0)[rows]
    err = torch.where(finite, out - x, 0.0)[rows]
    assert err.norm() <= clean.norm() * ((fmt.group**0.5) / (2 * (fmt.qmax - 1)) + 2.0**-7)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_within_declared_bound_on_realistic_activations(name: str, dtype: torch.dtype) -> None:
    codec = get_codec(name)
    for label, x in realistic_activations():
        x = x.to(dtype)
        rel, _ = error_stats(x, codec.decompress(codec.compress(x)))
        assert rel <= codec.error_bound, (label, rel)


def test_int4_outlier_beats_plain_int4_on_outlier_channels() -> None:
    codec = get_codec("int4_outlier")
    heavy = llm_like(128, 256, outliers=4).to(torch.bfloat16)  # 4 of 8 groups hold one
    _, outlier_db = error_stats(heavy, codec.decompress(codec.compress(heavy)))
    _, plain_db = error_stats(heavy, int_outlier.torch_int4_plain_roundtrip(heavy)[0])
    assert outlier_db >= plain_db + 10.0, (outlier_db, plain_db)
    light = llm_like(128, 1024, outliers=4).to(torch.bfloat16)  # 4 of 32 groups
    _, outlier_db = error_stats(light, codec.decompress(codec.compress(light)))
    _, plain_db = error_stats(light, int_outlier.torch_int4_plain_roundtrip(light)[0])
    assert outlier_db >= plain_db + 4.0, (outlier_db, plain_db)
    # Without outliers the two are the same format up to the extra slots.
    plain = torch.randn(64, 256)
    _, outlier_db = error_stats(plain, codec.decompress(codec.compress(plain)))
    _, plain_db = error_stats(plain, int_outlier.torch_int4_plain_roundtrip(plain)[0])
    assert abs(outlier_db - plain_db) < 0.5


@pytest.mark.parametrize("name", FORMATS)
def test_non_contiguous_and_deterministic(name: str) -> None:
    codec = get_codec(name)
    for x in (_data((70, 10), torch.float32).t(), _data((6, 200), torch.float16)[:, ::2]):
        a, b = codec.compress(x), codec.compress(x.contiguous())
        assert _same_payload(a.payload, b.payload)
        assert _same_payload(a.payload, codec.compress(x).payload)
        assert _same(codec.decompress(a), codec.decompress(b))


@pytest.mark.parametrize("name", FORMATS)
def test_applies_to_linear_layer_inputs(name: str) -> None:
    codec = get_codec(name)

    def query(
        dtype: torch.dtype = torch.bfloat16, producer: str = "norm", consumers: tuple[str, ...] = ("matmul",)
    ) -> ApplyQuery:
        return ApplyQuery(shape=(8, 64), dtype=dtype, producer_class=producer, consumer_classes=consumers)

    for producer in ("norm", "attention", "activation", "matmul", "elementwise"):
        assert codec.applies(query(producer=producer))
    assert codec.applies(query(dtype=torch.float32, consumers=("elementwise", "matmul")))
    # int8 is offered for any float value (its error stays far below its bound
    # on every input family measured); int4 only for linear-layer inputs.
    assert codec.applies(query(consumers=("activation",))) is (name == "int8_outlier")
    assert not codec.applies(query(producer="softmax"))  # softmax_u8's job
    assert not codec.applies(query(dtype=torch.bool, producer="mask"))
    assert not codec.applies(query(dtype=torch.float64))
    for shape in ((), (16, 1), (0, 64)):  # nothing to gain
        small = ApplyQuery(
            shape=shape, dtype=torch.float16, producer_class="norm", consumer_classes=("matmul",)
        )
        assert not codec.applies(small), shape


def test_calibrate_reports_outlier_channels() -> None:
    codec = get_codec("int8_outlier")
    samples = [llm_like(32, 512, outliers=4, seed=s) for s in range(2)]
    stats = codec.calibrate(samples)
    assert stats.outlier_channels == tuple((torch.arange(4) * 128 + 5).tolist())
    assert stats.outlier_fraction == 4 / 512
    assert stats.extra["outlier_slots"] == 8 and stats.extra["outlier_slot_coverage"] == 1.0
    assert 0 < stats.relative_error <= codec.error_bound and stats.abs_max > 15
    assert codec.calibrate([torch.randn(32, 512)]).outlier_channels == ()
    with pytest.raises(ValueError, match="channel counts"):
        codec.calibrate([torch.randn(2, 8), torch.randn(2, 9)])


@pytest.mark.parametrize("name", FORMATS)
def test_wrong_dtype_and_device_raise(name: str) -> None:
    codec = get_codec(name)
    torch_compress = REFERENCE[name][0]
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match="dtype"):
            codec.compress(bad)
    with pytest.raises(ValueError, match="device"):
        torch_compress(torch.zeros(4, device="meta"))
    payload = list(codec.compress(torch.ones(2, 64)).payload)
    with pytest.raises(ValueError, match="elements"):
        codec.decompress_op(payload, [4, 32], torch.float32)  # same numel, other layout
    with pytest.raises(TypeError, match="dtype"):
        codec.decompress_op(payload, [2, 64], torch.float16)  # values were float32
    with pytest.raises(TypeError, match="decompress to"):
        codec.decompress_op(payload, [2, 64], torch.int8)
    with pytest.raises(ValueError, match="payload has"):
        codec.decompress_op(payload[:3], [2, 64], torch.float32)
    with pytest.raises(ValueError, match="devices"):
        REFERENCE[name][1]([*payload[:3], payload[3].to("meta")], [2, 64], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(3, 5, 130, dtype=torch.bfloat16)
        codes, scales, index, values = torch.ops.adacc.int4_outlier_compress.default(x)
        assert (codes.shape, codes.dtype) == ((15, 80), torch.uint8)
        assert (scales.shape, scales.dtype) == ((15, 5), torch.bfloat16)
        assert (index.shape, index.dtype) == ((2,), torch.int32)
        assert (values.shape, values.dtype) == ((15, 2), torch.bfloat16)
        payload = [codes, scales, index, values]
        out = torch.ops.adacc.int4_outlier_decompress.default(payload, [3, 5, 130], x.dtype)
        assert out.shape == (3, 5, 130) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "name,backend,dynamic",
    [
        ("int8_outlier", "aot_eager", True),
        ("int4_outlier", "aot_eager", False),
        ("int4_outlier", "inductor", False),
    ],
)
def test_ops_compile_without_graph_breaks(name: str, backend: str, dynamic: bool) -> None:
    codec = get_codec(name)

    def round_trip(a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = codec.compress_op(a)
        return codec.decompress_op(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, backend=backend, fullgraph=True, dynamic=dynamic)
    x = _data((5, 100), torch.float32)
    out, payload = compiled(x)
    ref_out, ref_payload = round_trip(x)
    assert _same_payload(payload, ref_payload)
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


#: Every layout for float32; the conversions for the half types on two shapes.
INTERPRETER_CASES = [
    (torch.float32, [(0, 7), (3, 0), (), (1,), (7,), (3, 33), (2, 333), (2, 3, 65), (40, 70)]),
    (torch.float16, [(3, 33), (2, 3, 65)]),
    (torch.bfloat16, [(3, 33), (2, 3, 65)]),
]


@interpreted
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype,shapes", INTERPRETER_CASES, ids=[str(d) for d, _ in INTERPRETER_CASES])
def test_interpreted_triton_matches_reference(
    name: str, dtype: torch.dtype, shapes: list[tuple[int, ...]]
) -> None:
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    for shape in shapes:
        x = _data(shape, dtype, seed=len(shape))
        ref = torch_compress(x)
        assert _same_payload(triton_compress(x), ref), shape
        out = triton_decompress(ref, shape, dtype)
        assert _same(out, torch_decompress(ref, shape, dtype)), shape


@interpreted
@pytest.mark.parametrize("name", FORMATS)
def test_interpreted_non_finite_groups_and_ties(name: str) -> None:
    """Flagged groups, all-zero groups, exact .5 ties and values at the clamp limit."""
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    fmt = FORMATS[name]
    x = torch.zeros(4, 3 * fmt.group)
    ramp = torch.arange(fmt.group, dtype=torch.float32)
    x[0, : fmt.group] = (ramp - fmt.group / 2) / 2  # halves: exact ties at scale 1 / 2
    x[1, : fmt.group] = ramp
    x[1, 3] = float("nan")  # flagged group: limit QMAX - 1
    x[2, fmt.group : 2 * fmt.group] = float("-inf")  # a group with nothing finite
    x[3] = torch.randn(3 * fmt.group)
    x[3, 7], x[3, fmt.group + 1] = float("inf"), 1e30
    ref = torch_compress(x)
    assert _same_payload(triton_compress(x), ref)
    assert _same(triton_decompress(ref, x.shape, x.dtype), torch_decompress(ref, x.shape, x.dtype))


@interpreted
@pytest.mark.parametrize("name", FORMATS)
def test_interpreted_non_contiguous_and_op_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = get_codec(name)
    torch_compress, torch_decompress = REFERENCE[name]
    x = _data((70, 9), torch.bfloat16, seed=3).t()
    ref = torch_compress(x)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = codec.compress(x)
    assert _same_payload(packed.payload, ref)
    assert _same(codec.decompress(packed), torch_decompress(ref, x.shape, x.dtype))
