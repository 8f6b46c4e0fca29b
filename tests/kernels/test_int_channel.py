"""Tests for kernels/int_channel.py and kernels/int4_channel.py: int8 / int4
codes, one scale per channel and block of rows.

Tier 1 (everywhere): reference and ops -- exact sizes, NaN/Inf at any
position and in any number, known codes, the worst-case error bound, error
within the declared bound on realistic activations, outlier channels costing
their neighbours nothing, validation, fake tensors, torch.compile. The aten
form's bit-exactness under Inductor is tested for every codec in
test_aten_forms.py. Tier 2 (``test_interpreted_*``): the Triton payload and
decompressed values equal the reference bit for bit under
``TRITON_INTERPRET=1`` in a fresh process (run by test_oplib.py).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, get_codec, int4_channel, int_channel
from adacc_compile.kernels.oplib import error_stats, is_interpreted

from .test_int_outlier import _same, _same_payload, llm_like, realistic_activations

NAME = "int8_channel"
NAMES = ["int8_channel", "int4_channel"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (3, 33), (4, 1000), (2, 3, 65), (3, 0), (0, 7), (130, 9), (64, 64), (65, 3)]
#: The guaranteed worst cases (module docstrings): half a step of m / 126 in
#: a block of 64 rows; of m / 6 (a flagged block) in a block of 32.
WORST = {"int8_channel": 64**0.5 / (2 * int_channel.QMAX), "int4_channel": 32**0.5 / (2 * (int4_channel.QMAX - 1))}
REFERENCE = {
    "int8_channel": (int_channel.torch_int8_channel_compress, int_channel.torch_int8_channel_decompress),
    "int4_channel": (int4_channel.torch_int4_channel_compress, int4_channel.torch_int4_channel_decompress),
}
TRITON = {
    "int8_channel": (int_channel.triton_int8_channel_compress, int_channel.triton_int8_channel_decompress),
    "int4_channel": (int4_channel.triton_int4_channel_compress, int4_channel.triton_int4_channel_decompress),
}
interpreted = pytest.mark.skipif(
    not is_interpreted(int_channel._compress_kernel),
    reason="needs TRITON_INTERPRET=1 at import; run by test_oplib.py::test_codec_kernels_in_interpreter",
)


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


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_shape_size_and_specials(name: str, dtype: torch.dtype) -> None:
    codec = get_codec(name)
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
            assert error_stats(x, out)[0] <= WORST[name], shape


def test_compressed_nbytes_is_exact_and_static() -> None:
    codec = get_codec(NAME)
    # 130 x 1000 bf16: int8 codes, three blocks of 64 rows x 1000 float32 scales.
    assert codec.compressed_nbytes((130, 1000), torch.bfloat16) == 130 * 1000 + 3 * 1000 * 4
    assert codec.compressed_nbytes((2, 64, 8), torch.float32) == 128 * 8 + 2 * 8 * 4
    assert codec.compressed_nbytes((), torch.float16) == 1 + 4
    assert codec.compressed_nbytes((0, 7), torch.float32) == 0
    payload = codec.compress(torch.ones(3, 5, 130)).payload
    assert [tuple(p.shape) for p in payload] == [(15, 130), (1, 130)]
    assert [p.dtype for p in payload] == [torch.int8, torch.float32]
    int4 = get_codec("int4_channel")
    # 130 rows: 5 blocks of 32, each 16 bytes of two codes per channel.
    assert int4.compressed_nbytes((130, 1000), torch.bfloat16) == 5 * 16 * 1000 + 5 * 1000 * 4
    assert int4.compressed_nbytes((), torch.float16) == 16 + 4
    assert [tuple(p.shape) for p in int4.compress(torch.ones(3, 5, 130)).payload] == [(16, 130), (1, 130)]


def test_int4_bytes_pair_row_i_with_row_i_plus_half_a_block() -> None:
    # Channel 0 of 40 rows: row 1 holds 7.0 (code 7), row 17 -7.0 (code -7,
    # nibble 9), row 33 (second block) 1.0 (its block's code 7).
    x = torch.zeros(40, 1)
    x[1, 0], x[17, 0], x[33, 0] = 7.0, -7.0, 1.0
    codes, scale = int4_channel.torch_int4_channel_compress(x)
    assert scale.flatten().tolist() == [1.0, pytest.approx(1 / 7)]
    assert codes.flatten().tolist() == [0x00, 0x97] + [0x00] * 15 + [0x07] + [0x00] * 14


def test_known_codes_and_reserved_values() -> None:
    # One block, two channels. Channel 0: largest |x| 2.52, scale 0.02 (2.52 / 126),
    # so 1.0 -> 50 and -0.01 -> -0.5 -> -0 (ties to even). Channel 1: ±Inf and NaN
    # take the codes 127, -127 and -128; its finite values set its scale (126 -> 1.0).
    x = torch.tensor([[2.52, float("inf")], [1.0, float("-inf")], [-0.01, float("nan")], [0.0, -126.0]])
    codes, scale = int_channel.torch_int8_channel_compress(x)
    assert scale.tolist() == [[pytest.approx(0.02, rel=1e-6), 1.0]]
    assert codes.tolist() == [[126, 127], [50, -127], [0, -128], [0, -126]]
    out = int_channel.torch_int8_channel_decompress([codes, scale], [4, 2], torch.float32)
    assert out[:, 1].tolist()[:2] == [float("inf"), float("-inf")] and out[2, 1].isnan()
    assert out[3, 1] == -126.0


def test_blocks_are_64_rows_and_all_zero_blocks_survive() -> None:
    x = torch.zeros(130, 3)
    x[:64, 0] = 126.0
    x[64:128, 0] = 12600.0  # a second block 100x larger: its own scale
    x[128:, 2] = float("inf")  # the last (partial) block: nothing finite in channel 2
    codes, scale = int_channel.torch_int8_channel_compress(x)
    assert scale.shape == (3, 3)
    assert scale[0, 0] == 1.0 and scale[1, 0] == 100.0
    assert (scale[:, 1] == int_channel.MIN_SCALE).all()  # all-zero channel: smallest scale, codes 0
    out = get_codec(NAME).decompress(get_codec(NAME).compress(x))
    assert torch.equal(out, x)


@pytest.mark.parametrize("name", NAMES)
def test_any_number_of_non_finite_values_survives(name: str) -> None:
    codec = get_codec(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(150, 70, generator=g)
    pick = torch.rand(150, 70, generator=g)
    x[pick < 0.1] = float("nan")
    x[(pick >= 0.1) & (pick < 0.2)] = float("inf")
    x[(pick >= 0.2) & (pick < 0.3)] = float("-inf")
    x[:, 0] = float("nan")  # a whole channel
    x[:64, 1] = float("inf")  # a whole block of a channel
    out = codec.decompress(codec.compress(x))
    assert torch.equal(out.isnan(), x.isnan())
    assert torch.equal(out[x.isinf()], x[x.isinf()])
    finite = torch.isfinite(x)
    assert torch.isfinite(out[finite]).all()
    # Finite neighbours of non-finite values keep the full accuracy.
    clean = torch.where(finite, x, 0.0)
    assert torch.where(finite, out - x, 0.0).norm() <= clean.norm() * WORST[name]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_within_declared_bound_on_realistic_activations(name: str, dtype: torch.dtype) -> None:
    codec = get_codec(name)
    for label, x in realistic_activations(rows=256):
        x = x.to(dtype)
        rel, _ = error_stats(x, codec.decompress(codec.compress(x)))
        assert rel <= codec.error_bound, (label, rel)


@pytest.mark.parametrize("name", NAMES)
def test_outlier_channels_cost_their_neighbours_nothing(name: str) -> None:
    """Strong channels get their own scales: the other channels' error is
    what it would be without them (the outlier codecs need exact slots for that)."""
    codec = get_codec(name)
    heavy = llm_like(256, 512, outliers=8)
    planted = torch.arange(8) * 64 + 5
    others = torch.ones(512, dtype=torch.bool)
    others[planted] = False
    out = codec.decompress(codec.compress(heavy))
    alone = codec.decompress(codec.compress(heavy[:, others].contiguous()))
    assert torch.equal(out[:, others], alone)
    rel, _ = error_stats(heavy, out)
    assert rel <= codec.error_bound


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_and_deterministic(name: str) -> None:
    codec = get_codec(name)
    for x in (_data((70, 10), torch.float32).t(), _data((130, 200), torch.float16)[:, ::2]):
        a, b = codec.compress(x), codec.compress(x.contiguous())
        assert _same_payload(a.payload, b.payload)
        assert _same_payload(a.payload, codec.compress(x).payload)
        assert _same(codec.decompress(a), codec.decompress(b))


def test_applies_to_float_activations_where_it_saves_bytes() -> None:
    codec = get_codec(NAME)

    def query(shape=(256, 64), dtype=torch.bfloat16, producer="norm", consumers=("matmul",)) -> ApplyQuery:
        return ApplyQuery(shape=shape, dtype=dtype, producer_class=producer, consumer_classes=consumers)

    for producer in ("norm", "attention", "activation", "matmul", "elementwise"):
        assert codec.applies(query(producer=producer))
    # Inputs of linear layers only: a ReLU output read by its backward alone is not one.
    assert not codec.applies(query(consumers=("activation",)))
    # Nor values of convolutional layers (channels first: the last dim is space).
    conv = ApplyQuery(shape=(4, 8, 64, 64), dtype=torch.float32, producer_class="norm",
                      producer_target="aten._native_batch_norm_legit_functional.default",
                      consumer_classes=("matmul",), consumer_targets=("aten.convolution_backward.default",))
    assert not codec.applies(conv)
    assert not get_codec("int4_channel").applies(conv)
    assert not codec.applies(query(producer="softmax"))  # softmax_u8's job
    assert not codec.applies(query(dtype=torch.bool, producer="mask"))
    assert not codec.applies(query(dtype=torch.float64))
    # Scales of 4 bytes per channel and block outweigh 2-byte values in short blocks.
    for shape in ((), (1, 4096), (0, 64)):
        assert not codec.applies(query(shape=shape, dtype=torch.float16)), shape
    assert codec.applies(query(shape=(8, 4096), dtype=torch.float32))
    int4 = get_codec("int4_channel")
    assert int4.applies(query()) and not int4.applies(query(consumers=("activation",)))


@pytest.mark.parametrize("name", NAMES)
def test_wrong_dtype_device_and_payload_raise(name: str) -> None:
    codec = get_codec(name)
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)):
        with pytest.raises(TypeError, match="dtype"):
            codec.compress(bad)
    with pytest.raises(ValueError, match="device"):
        REFERENCE[name][0](torch.zeros(4, device="meta"))
    payload = list(codec.compress(torch.ones(2, 64)).payload)
    with pytest.raises(ValueError, match="elements"):
        codec.decompress_op(payload, [4, 32], torch.float32)  # same numel, other layout
    with pytest.raises(TypeError, match="decompress to"):
        codec.decompress_op(payload, [2, 64], torch.int8)
    with pytest.raises(ValueError, match="payload has"):
        codec.decompress_op(payload[:1], [2, 64], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(3, 50, 130, dtype=torch.bfloat16)
        codes, scales = torch.ops.adacc.int8_channel_compress.default(x)
        assert (codes.shape, codes.dtype) == ((150, 130), torch.int8)
        assert (scales.shape, scales.dtype) == ((3, 130), torch.float32)
        out = torch.ops.adacc.int8_channel_decompress.default([codes, scales], [3, 50, 130], x.dtype)
        assert out.shape == (3, 50, 130) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "name,backend,dynamic",
    [("int8_channel", "aot_eager", True), ("int8_channel", "inductor", False), ("int4_channel", "inductor", False)],
)
def test_ops_compile_without_graph_breaks(name: str, backend: str, dynamic: bool) -> None:
    codec = get_codec(name)

    def round_trip(a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = codec.compress_op(a)
        return codec.decompress_op(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, backend=backend, fullgraph=True, dynamic=dynamic)
    x = _data((70, 100), torch.float32)
    out, payload = compiled(x)
    ref_out, ref_payload = round_trip(x)
    assert _same_payload(payload, ref_payload)
    assert _same(out, ref_out)


# ---------------------------------------------------------------- Triton tier


#: Every layout for float32; the conversions for the half types on two shapes.
INTERPRETER_CASES = [
    (torch.float32, [(0, 7), (3, 0), (), (1,), (7,), (3, 33), (2, 333), (2, 3, 65), (130, 70)]),
    (torch.float16, [(3, 33), (70, 65)]),
    (torch.bfloat16, [(3, 33), (70, 65)]),
]


@interpreted
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype,shapes", INTERPRETER_CASES, ids=[str(d) for d, _ in INTERPRETER_CASES])
def test_interpreted_triton_matches_reference(name: str, dtype: torch.dtype, shapes: list[tuple[int, ...]]) -> None:
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    for shape in shapes:
        x = _data(shape, dtype, seed=len(shape))
        ref = torch_compress(x)
        assert _same_payload(triton_compress(x), ref), shape
        out = triton_decompress(ref, shape, dtype)
        assert _same(out, torch_decompress(ref, shape, dtype)), shape


@interpreted
@pytest.mark.parametrize("name", NAMES)
def test_interpreted_non_finite_blocks_ties_and_tiny_values(name: str) -> None:
    (torch_compress, torch_decompress), (triton_compress, triton_decompress) = REFERENCE[name], TRITON[name]
    x = torch.zeros(70, 3)
    x[:, 0] = (torch.arange(70, dtype=torch.float32) - 35) / 2  # halves: ties
    x[3, 0] = float("nan")
    x[:64, 1] = float("-inf")  # a block with nothing finite
    x[:, 2] = torch.randn(70) * 1e-38  # subnormal scales: the floor
    x[66, 2] = float("inf")
    ref = torch_compress(x)
    assert _same_payload(triton_compress(x), ref)
    assert _same(triton_decompress(ref, x.shape, x.dtype), torch_decompress(ref, x.shape, x.dtype))


@interpreted
@pytest.mark.parametrize("name", NAMES)
def test_interpreted_non_contiguous_and_op_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = get_codec(name)
    torch_compress, torch_decompress = REFERENCE[name]
    x = _data((70, 9), torch.bfloat16, seed=3).t()
    ref = torch_compress(x)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = codec.compress(x)
    assert _same_payload(packed.payload, ref)
    assert _same(codec.decompress(packed), torch_decompress(ref, x.shape, x.dtype))


@pytest.mark.parametrize("name", ["int8_channel", "int4_channel"])
def test_compiled_codes_loop_multiplies_by_reciprocals(name: str, monkeypatch) -> None:
    """Inductor's compress has one division, the scale's (per block and
    channel): the codes loop multiplies by the scales' reciprocals instead
    of dividing each element (the division form had two or three). That
    the reciprocals are written once (`aten_graphs.written`) rather than
    recomputed in the loop is not visible in this count."""
    from torch._inductor.utils import run_and_get_code

    from adacc_compile import compat_inductor

    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(name)
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(8))
    graph = compat_inductor.trace_aten(lambda v: tuple(codec.aten_compress(v)), [x])
    payload, codes = run_and_get_code(lambda: compat_inductor.inductor_compile_inference(graph, [x])(x))
    assert _same_payload(list(payload), codec.compress(x).payload)
    divisions = sum(code.count(" / ") for code in codes)
    assert divisions == 1, divisions  # the scale's; the reciprocal is a `reciprocal()`
