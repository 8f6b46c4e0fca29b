"""The aten form of every codec (what compiled graphs run) against its torch reference.

Tier 1: eager aten form == reference, payload and decompressed value, for
every codec, dtype and a spread of shapes (NaN/Inf planted, odd sizes,
0-d, empty, non-contiguous); the traced graphs hold only aten/prims ops and
no tensor constants, so they splice into any graph.
Tier 2: the same graphs compiled by Inductor (C++ on this CPU) give the
same bits, one representative shape per codec and dtype (each compile
takes seconds: one dtype per codec by default, all of them under
``-m slow``).

"Same" is bit for bit, except that any NaN equals any NaN (the references
make NaN through different casts; the aten forms make the canonical one).
"""

from __future__ import annotations

import math
from typing import Sequence

import pytest
import torch

from adacc_compile import compat_inductor
from adacc_compile.kernels import available_codecs, get_codec
from adacc_compile.kernels.aten_graphs import codec_graphs

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(4, 64), (3, 130), (2, 3, 65), (7,), (), (1, 1), (0, 5), (5, 0), (33, 7)]
#: One dtype per codec for the default run's Inductor compiles.
DEFAULT_COMPILED = {"bitmask": torch.bool}


def _dtypes(name: str) -> list[torch.dtype]:
    return [torch.bool] if name == "bitmask" else FLOAT_DTYPES


def _sample(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if dtype == torch.bool:
        return x > 0.3
    if name == "softmax_u8" and x.dim() >= 1 and x.numel():
        x = (3 * x).softmax(-1)
    elif x.dim() >= 1 and x.shape[-1] > 4:
        x[..., 2] *= 30  # an outlier channel
    x = x.to(dtype)
    flat = x.view(-1)
    for i, v in zip((1, 3, 4, 5, 9), (float("nan"), float("inf"), float("-inf"), -0.0, float("nan"))):
        if i < flat.numel():
            flat[i] = v
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    keep = ~nan
    return torch.equal(a[keep], b[keep]) and torch.equal(a[keep].signbit(), b[keep].signbit())


def _same_payload(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b))


def _cases():
    for name in available_codecs():
        for dtype in _dtypes(name):
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")


@pytest.mark.parametrize("name,dtype", list(_cases()))
def test_eager_aten_form_equals_reference(name: str, dtype: torch.dtype, monkeypatch) -> None:
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(name)
    for shape in SHAPES:
        x = _sample(name, shape, dtype)
        if name == "softmax_u8" and x.numel() == 0:
            continue
        reference = list(codec.compress_op(x))
        assert _same_payload(codec.aten_compress(x), reference), shape
        expected = codec.decompress_op(reference, list(shape), dtype)
        assert _same(codec.aten_decompress(reference, list(shape), dtype), expected), shape


@pytest.mark.parametrize("name", available_codecs())
def test_aten_form_of_a_non_contiguous_value(name: str, monkeypatch) -> None:
    """A saved value may be a permuted layout (attention outputs): the aten
    form must read it through its strides, as the reference does."""
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(name)
    dtype = _dtypes(name)[0]
    x = _sample(name, (70, 6), dtype)
    if name == "softmax_u8":
        x = x.float().softmax(0).to(dtype)
    x = x.t()
    assert not x.is_contiguous()
    reference = list(codec.compress_op(x))
    assert _same_payload(codec.aten_compress(x), reference)


@pytest.mark.parametrize("name", available_codecs())
def test_traced_graphs_are_plain_aten_ops(name: str) -> None:
    codec = get_codec(name)
    x = _sample(name, (8, 96), _dtypes(name)[0])
    graphs = codec_graphs(codec, x)
    for gm in (graphs.compress, graphs.decompress):
        ops = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
        assert ops and all(n.op == "call_function" for n in ops), "no get_attr constants, no modules"
        namespaces = {getattr(n.target, "namespace", "builtin") for n in ops}
        assert namespaces <= {"aten", "prims", "builtin"}, namespaces
        assert not any(n.target is codec.compress_op or n.target is codec.decompress_op for n in ops)


def _compiled_cases():
    for name in available_codecs():
        for dtype in _dtypes(name):
            default = DEFAULT_COMPILED.get(name, torch.float32) == dtype
            marks = () if default else (pytest.mark.slow,)
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}", marks=marks)


def _compiled_equals_reference(name: str, dtype: torch.dtype, shape: tuple[int, int], seed: int) -> None:
    codec = get_codec(name)
    x = _sample(name, shape, dtype, seed=seed)
    graphs = codec_graphs(codec, x)
    compress = compat_inductor.inductor_compile_inference(graphs.compress, [x])
    reference = list(codec.compress_op(x))
    assert _same_payload(list(compress(x)), reference)
    decompress = compat_inductor.inductor_compile_inference(graphs.decompress, reference)
    (restored,) = decompress(*reference)
    assert _same(restored, codec.decompress_op(reference, list(shape), dtype))


@pytest.mark.parametrize("name,dtype", list(_compiled_cases()))
def test_inductor_compiled_aten_form_equals_reference(name: str, dtype: torch.dtype, monkeypatch) -> None:
    """What a compiled plan runs gives the reference's payload and values,
    on odd rows and channels not a multiple of any group."""
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    _compiled_equals_reference(name, dtype, (37, 130), seed=3)


@pytest.mark.parametrize("name", available_codecs())
def test_inductor_compiled_aten_form_on_whole_words(name: str, monkeypatch) -> None:
    """The same on a shape whose payloads are whole int64 words, the fast
    paths of `aten_graphs` (packed_fields, unpack_planes, bfloat16_values)
    and of int4's unpacking (whole groups in each half of a row),
    which the odd shape above steers around."""
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    _compiled_equals_reference(name, _dtypes(name)[0], (16, 256), seed=4)


def _other_lanes() -> int:
    from adacc_compile.kernels import aten_graphs

    return 8 if aten_graphs.vector_lanes(torch.device("cpu")) > 8 else 16


@pytest.mark.parametrize(
    "name", ["int8_outlier", "int4_outlier", "fp8_e4m3", "fp8_e5m2", "softmax_u8", "bitmask", "fewbit_silu"]
)
def test_inductor_compiled_aten_form_for_the_other_vector_width(name: str, monkeypatch) -> None:
    """The forms that read or write bytes differently for 8- and 16-lane
    vectors (`aten_graphs.vector_lanes`): the path this CPU does not pick,
    compiled, gives the same bits too."""
    from adacc_compile.kernels import aten_graphs

    lanes = _other_lanes()
    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    _compiled_equals_reference(name, _dtypes(name)[0], (16, 256), seed=5)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("numel", [8, 64, 200, 13])
def test_packed_fields_and_byte_values_unpack_lsb_first(numel: int, lanes: int, monkeypatch) -> None:
    from adacc_compile.kernels import aten_graphs
    from adacc_compile.kernels.aten_graphs import byte_values, packed_fields

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)

    data = torch.randint(0, 256, (numel,), generator=torch.Generator().manual_seed(numel)).to(torch.uint8)
    wide = data.long()
    assert torch.equal(byte_values(data), data.float())
    assert torch.equal(byte_values(data.view(torch.int8)), data.float())
    for bits in (1, 4, 8):
        shifts = torch.arange(0, 8, bits)
        expected = ((wide.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(-1).int()
        assert torch.equal(packed_fields(data, bits), expected)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("shape", [(4, 64), (3, 5), (16,), (2, 3, 8)], ids=str)
def test_pack_planes_is_plane_major_and_unpack_planes_inverts_it(shape, lanes: int, monkeypatch) -> None:
    """Element e of the padded [8, M] view is bit e // M of byte e % M,
    whether the planes are built through the last dim or flat."""
    from adacc_compile.kernels import aten_graphs
    from adacc_compile.kernels.aten_graphs import pack_planes, unpack_planes

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    numel = math.prod(shape)
    nbytes = (numel + 7) // 8
    bits = (torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.5).float()
    padded = torch.nn.functional.pad(bits, (0, 8 * nbytes - numel))
    packed = pack_planes(padded)
    expected = torch.zeros(nbytes, dtype=torch.int64)
    for e in range(numel):
        expected[e % nbytes] |= int(bits[e]) << (e // nbytes)
    assert torch.equal(packed, expected.to(torch.uint8))
    assert torch.equal(unpack_planes(packed, shape), bits.int().view(shape))


@pytest.mark.parametrize("lanes", [8, 16])
def test_nibble_bytes_pack_every_pair_of_int4_codes(lanes: int, monkeypatch) -> None:
    """Every (low, high) pair of codes -8..7, eager and compiled by
    Inductor: the low code's two's-complement nibble in bits 0-3, the
    high one's in bits 4-7."""
    from adacc_compile.kernels import aten_graphs
    from adacc_compile.kernels.aten_graphs import nibble_bytes

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    codes = torch.arange(-8, 8)
    low, high = (c.reshape(-1) for c in torch.meshgrid(codes, codes, indexing="ij"))
    expected = ((low & 15) | ((high & 15) << 4)).to(torch.uint8)
    assert torch.equal(nibble_bytes(low.float(), high.float()), expected)
    graph = compat_inductor.trace_aten(lambda a, b: (nibble_bytes(a, b),), [low.float(), high.float()])
    compiled = compat_inductor.inductor_compile_inference(graph, [low.float(), high.float()])
    (packed,) = compiled(low.float(), high.float())
    assert torch.equal(packed, expected)


def test_bfloat16_values_are_exact() -> None:
    from adacc_compile.kernels.aten_graphs import bfloat16_values

    x = torch.randn(6, 4).to(torch.bfloat16)
    x[0, 1], x[2, 2] = float("-inf"), -0.0
    assert torch.equal(bfloat16_values(x).view(torch.int32), x.float().view(torch.int32))
    assert torch.equal(bfloat16_values(x[:, :3]), x[:, :3].float())  # odd, strided: the plain cast


@pytest.mark.parametrize("name", ["int8_channel", "fp8_e5m2", "softmax_u8"])
def test_one_byte_rows_that_are_not_whole_words_compile_without_per_byte_division(name: str, monkeypatch) -> None:
    """A decompress whose one-byte payload rows are not whole int64 words
    (682 channels: a Llama-style FFN width) reads its bytes with a plain
    load on every vector width: read as words, Inductor's C++ indexes each
    byte with a division and a modulo and runs the kernel scalar (24-27x a
    copy, measured). The values stay the reference's."""
    from torch._inductor.utils import run_and_get_code

    from adacc_compile import compat_inductor
    from adacc_compile.kernels import aten_graphs, get_codec

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: 8)
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    codec = get_codec(name)
    x = torch.rand(16, 682, generator=torch.Generator().manual_seed(6)) if name == "softmax_u8" else torch.randn(
        16, 682, generator=torch.Generator().manual_seed(6)
    )
    if name == "softmax_u8":
        x = torch.softmax(x, dim=-1)
    payload = codec.aten_compress(x)
    graph = compat_inductor.trace_aten(lambda *p: (codec.aten_decompress(list(p), [16, 682], torch.float32),), list(payload))
    (restored,), codes = run_and_get_code(lambda: compat_inductor.inductor_compile_inference(graph, list(payload))(*payload))
    assert torch.equal(restored, codec.decompress(codec.compress(x)))
    assert codes and not any("div_floor_integer" in code for code in codes)


#: Codecs whose compiled decompress writes the value twice: the dequantised
#: value (padded to whole groups), then the output with the exact outlier
#: channels copied in (``index_copy``). A select with a gather instead ran
#: the decompress 7x (int8) and 38x (int4) slower, measured.
DECOMPRESS_WRITES_TWICE = frozenset({"int8_outlier", "int4_outlier"})


def _value_sized_temporaries(fn, args: list[torch.Tensor], numel: int, lanes: int, monkeypatch) -> dict[str, int]:
    """``fn`` traced and compiled by Inductor with ``lanes``-wide vector
    forms (`aten_graphs.vector_lanes`): the buffers its code allocates that
    it does not return (directly or through a reused buffer) and that hold
    at least ``numel`` elements."""
    import re

    from torch._inductor.utils import run_and_get_code

    from adacc_compile.kernels import aten_graphs

    monkeypatch.setattr(aten_graphs, "vector_lanes", lambda device: lanes)
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    graph = compat_inductor.trace_aten(fn, args)
    _, codes = run_and_get_code(lambda: compat_inductor.inductor_compile_inference(graph, args)(*args))
    code = "\n".join(codes)
    call = code[code.index("def call("):]
    alias = dict(re.findall(r"(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)\b", call))

    def root(buf: str) -> str:
        while buf in alias:
            buf = alias[buf]
        return buf

    returned = {root(b) for b in re.findall(r"\bbuf\d+\b", call[call.index("return ("):].split("\n", 1)[0])}
    allocated = re.findall(r"(buf\d+) = empty_strided_cpu\(\(([\d, ]*)\)", call)
    sizes = {buf: math.prod(int(d) for d in dims.split(",") if d.strip()) for buf, dims in allocated}
    return {buf: n for buf, n in sizes.items() if buf not in returned and n >= numel}


def _made_in_graph(name: str, v: torch.Tensor) -> torch.Tensor:
    """The value a compressed plan's producer kernel would hand the codec."""
    if name == "bitmask":
        return v.clone()
    return (v + 0).softmax(-1) if name == "softmax_u8" else v * 2


def _finite_sample(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    x = _sample(name, shape, _dtypes(name)[0], seed=7)
    return torch.where(x.isfinite(), x, 0.0) if x.is_floating_point() else x


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("name", available_codecs())
def test_compiled_compress_allocates_no_value_sized_temporary(name: str, lanes: int, monkeypatch) -> None:
    """The compiled compress of a value made in the same graph writes its
    payload and nothing as large as the value: a value-sized temporary is
    memory the step holds that no plan counts (the native fp8 cast viewed as
    bytes and then reshaped made Inductor write the fp8 codes twice: 0.67
    MiB more per compressed Llama MLP value than simulated). Both vector
    widths' forms (fp8 casts natively with 16 lanes only), whatever this
    CPU's."""
    codec = get_codec(name)
    x = _finite_sample(name, (4, 16, 130))
    compress = lambda v: tuple(codec.aten_compress(_made_in_graph(name, v)))  # noqa: E731
    assert not _value_sized_temporaries(compress, [x], x.numel(), lanes, monkeypatch)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("name", available_codecs())
def test_compiled_decompress_writes_the_value_once(name: str, lanes: int, monkeypatch) -> None:
    """The compiled decompress, read by a pointwise op as in a backward
    kernel, allocates nothing as large as the value but its output; the
    outlier codecs' known second write (`DECOMPRESS_WRITES_TWICE`) is
    asserted too, so that removing it shows here."""
    codec = get_codec(name)
    x = _finite_sample(name, (4, 16, 130))
    payload = list(codec.aten_compress(x))
    restore = lambda *p: (codec.aten_decompress(list(p), list(x.shape), x.dtype) * 2,)  # noqa: E731
    temporaries = _value_sized_temporaries(restore, payload, x.numel(), lanes, monkeypatch)
    assert bool(temporaries) == (name in DECOMPRESS_WRITES_TWICE), temporaries


_DIVISIONS = {
    torch.ops.aten.div.Tensor,
    torch.ops.aten.div.Scalar,
    torch.ops.aten.div.Tensor_mode,
    torch.ops.aten.reciprocal.default,
    torch.ops.prims.div.default,
}


@pytest.mark.parametrize("name,dtype", list(_cases()))
def test_the_gpu_route_leaves_no_float32_division_and_gives_the_same_bits(name: str, dtype: torch.dtype, monkeypatch) -> None:
    """On a GPU Inductor divides float32 approximately, so every division in
    an aten form goes through `aten_graphs.divide`, which takes it in
    float64 there. With that route forced on this CPU: no float32 division
    is left in the traced graphs, and the forms still equal the reference
    bit for bit (a float64 quotient rounds to the float32 one)."""
    from adacc_compile.kernels import aten_graphs

    monkeypatch.setenv("ADACC_KERNELS", "torch")
    monkeypatch.setattr(aten_graphs, "plain_division_is_exact", lambda device: False)
    codec = get_codec(name)
    x = _sample(name, (33, 130), dtype)
    graphs = codec_graphs(codec, x)
    for gm in (graphs.compress, graphs.decompress):
        left = [
            str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and n.target in _DIVISIONS
            and n.meta["val"].dtype.is_floating_point and n.meta["val"].dtype != torch.float64
        ]
        assert not left, f"float32 divisions outside aten_graphs.divide: {left}"
    reference = list(codec.compress_op(x))
    assert _same_payload(codec.aten_compress(x), reference)
    expected = codec.decompress_op(reference, list(x.shape), dtype)
    assert _same(codec.aten_decompress(reference, list(x.shape), dtype), expected)
