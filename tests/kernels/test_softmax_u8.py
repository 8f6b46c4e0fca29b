"""Tests for kernels/softmax_u8.py: attention probabilities on a fixed uint8 grid.

Tier 1 (everywhere): reference and ops. Tier 2 (``test_interpreted_*``):
Triton codes equal the reference and decompressed values are identical,
under ``TRITON_INTERPRET=1`` in a fresh process (see test_bitmask.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, get_codec
from adacc_compile.kernels import softmax_u8 as su8
from adacc_compile.kernels.oplib import error_stats, is_interpreted, triton_available

CODEC = get_codec("softmax_u8")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(0,), (), (1,), (7,), (3, 33), (4, 1000), (2, 3, 5), (3, 0), (2, 3000)]
INTERPRETED = is_interpreted(su8._softmax_u8_compress_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_triton_kernels_in_interpreter"
)


def _probs(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, specials: bool = True) -> torch.Tensor:
    """Softmax rows of Gaussian logits, with NaN, +-Inf and -0.0 planted when there is room."""
    g = torch.Generator().manual_seed(seed)
    if len(shape) == 0:
        return torch.tensor(0.3, dtype=dtype)
    p = torch.softmax(torch.randn(shape, generator=g) * 3, dim=-1).to(dtype)
    if specials and p.numel() > 5:
        flat = p.view(-1)
        flat[1], flat[2], flat[3], flat[4] = float("nan"), float("inf"), float("-inf"), -0.0
    return p


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical values; any NaN equals any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    return torch.equal(a[~a.isnan()], b[~b.isnan()])


def attention_probs(keys: int, logit_std: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(4, 16, keys, generator=g) * logit_std, dim=-1)


# ---------------------------------------------------------------- reference + ops


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_shape_size_and_specials(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    p = _probs(shape, dtype)
    packed = CODEC.compress(p)
    assert packed.nbytes == CODEC.compressed_nbytes(shape, dtype) == p.numel()
    out = CODEC.decompress(packed)
    assert out.shape == p.shape and out.dtype == dtype
    assert torch.equal(out.isnan(), p.isnan())
    assert torch.equal(out[p.isinf()], p[p.isinf()])
    finite = torch.isfinite(p)
    # Half a grid step, plus the output dtype's own rounding near 1.
    tol = 0.5 / su8.LEVELS + (4e-3 if dtype == torch.bfloat16 else 1e-6)
    assert ((out.float() - p.float())[finite].abs() <= tol).all()


def test_grid_endpoints_reserved_codes_and_clamping() -> None:
    p = torch.tensor([0.0, 1.0, 0.5 / 252, 1.5 / 252, 1e-9, -0.25, 1.5, float("nan"),
                      float("inf"), float("-inf")])
    (q,) = su8.torch_softmax_u8_compress(p)
    assert q.tolist() == [0, 252, 1, 2, 0, 0, 252, 255, 254, 253]
    out = su8.torch_softmax_u8_decompress([q], [10], torch.float32)
    assert out[0] == 0.0 and out[1] == 1.0  # the ends of the range are exact


def test_error_within_declared_bound_on_realistic_attention() -> None:
    for keys in (128, 512, 1024):
        for std in (2.0, 4.0, 8.0):
            p = attention_probs(keys, std)
            rel, sqnr = error_stats(p, CODEC.decompress(CODEC.compress(p)))
            assert rel <= CODEC.error_bound, (keys, std, rel, sqnr)
    stats = CODEC.calibrate([attention_probs(256, 4.0)])
    assert 0 < stats.relative_error < CODEC.error_bound and stats.abs_max <= 1.0


def test_non_contiguous_and_deterministic() -> None:
    p = _probs((33, 10), torch.float32).t()
    a, b = CODEC.compress(p), CODEC.compress(p.contiguous())
    assert torch.equal(a.payload[0], b.payload[0])
    assert torch.equal(a.payload[0], CODEC.compress(p).payload[0])
    assert _same(CODEC.decompress(a), CODEC.decompress(b))


def test_applies_only_to_softmax_outputs() -> None:
    assert CODEC.applies(ApplyQuery(shape=(2, 4, 8, 8), dtype=torch.bfloat16, producer_class="softmax"))
    assert not CODEC.applies(ApplyQuery(shape=(2, 4, 8, 8), dtype=torch.bfloat16, producer_class="norm"))
    assert not CODEC.applies(ApplyQuery(shape=(8, 8), dtype=torch.bool, producer_class="softmax"))
    assert not CODEC.applies(ApplyQuery(shape=(0, 8), dtype=torch.float32, producer_class="softmax"))
    log_probs = ApplyQuery(shape=(8, 8), dtype=torch.float32, producer_class="softmax",
                           producer_target="aten._log_softmax.default")
    assert not CODEC.applies(log_probs)  # same op class, values in (-inf, 0]


def test_wrong_dtype_and_device_raise() -> None:
    with pytest.raises(TypeError, match="dtype"):
        CODEC.compress(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="device"):
        su8.torch_softmax_u8_compress(torch.zeros(4, device="meta"))
    payload = list(CODEC.compress(torch.full((8,), 0.125)).payload)
    with pytest.raises(ValueError, match="elements"):
        CODEC.decompress_op(payload, [9], torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        CODEC.decompress_op([payload[0].to(torch.int8)], [8], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        (q,) = torch.ops.adacc.softmax_u8_compress.default(torch.empty(2, 3, 5, dtype=torch.float16))
        assert (q.shape, q.dtype) == ((2, 3, 5), torch.uint8)
        out = torch.ops.adacc.softmax_u8_decompress.default([q], [2, 3, 5], torch.float16)
        assert out.shape == (2, 3, 5) and out.dtype == torch.float16


@pytest.mark.parametrize("backend,dynamic", [("aot_eager", True), ("inductor", False)])
def test_ops_compile_without_graph_breaks(backend: str, dynamic: bool) -> None:
    def attention_round_trip(s: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        p = torch.softmax(s, dim=-1)
        payload = torch.ops.adacc.softmax_u8_compress.default(p)
        return torch.ops.adacc.softmax_u8_decompress.default(payload, list(p.shape), p.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(attention_round_trip, backend=backend, fullgraph=True, dynamic=dynamic)
    s = torch.randn(2, 5, 33, generator=torch.Generator().manual_seed(0))
    out, payload = compiled(s)
    ref_out, ref_payload = attention_round_trip(s)
    # Inductor may compute the softmax itself slightly differently: codes within one step.
    assert (payload[0].int() - ref_payload[0].int()).abs().max() <= 1
    assert (out - ref_out).abs().max() <= 1.0 / su8.LEVELS + 1e-7


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
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interpreted_triton_matches_reference(dtype: torch.dtype) -> None:
    for shape in SHAPES:
        p = _probs(shape, dtype, seed=len(shape))
        (ref,) = su8.torch_softmax_u8_compress(p)
        assert torch.equal(su8.triton_softmax_u8_compress(p)[0], ref), shape
        out = su8.triton_softmax_u8_decompress([ref], shape, dtype)
        assert _same(out, su8.torch_softmax_u8_decompress([ref], shape, dtype)), shape


@interpreted
def test_interpreted_every_code_and_rounding_boundaries() -> None:
    q = torch.arange(256, dtype=torch.uint8)
    for dtype in DTYPES:
        assert _same(su8.triton_softmax_u8_decompress([q], [256], dtype),
                     su8.torch_softmax_u8_decompress([q], [256], dtype))
    half_steps = (torch.arange(2 * su8.LEVELS + 1, dtype=torch.float32) / (2 * su8.LEVELS))
    p = torch.cat([half_steps, half_steps.nextafter(torch.tensor(0.0)),
                   half_steps.nextafter(torch.tensor(2.0)), torch.tensor([-1.0, 2.0])])
    assert torch.equal(su8.triton_softmax_u8_compress(p)[0], su8.torch_softmax_u8_compress(p)[0])


@interpreted
def test_interpreted_non_contiguous_and_op_path(monkeypatch: pytest.MonkeyPatch) -> None:
    p = _probs((40, 9), torch.float16, seed=3).t()
    (ref,) = su8.torch_softmax_u8_compress(p)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = CODEC.compress(p)
    assert torch.equal(packed.payload[0], ref)
    assert _same(CODEC.decompress(packed), su8.torch_softmax_u8_decompress([ref], p.shape, p.dtype))
