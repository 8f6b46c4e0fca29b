"""Tests for kernels/bitmask.py: lossless 1-bit packing of bool tensors.

Two tiers (STYLE.md point 9): the torch reference and the ops are checked
everywhere; the Triton kernels are checked against the reference byte for
byte under the Triton interpreter.

How the Triton tier runs on a CPU-only machine: ``triton.jit`` decides
whether a kernel is interpreted when the kernel is *defined*, i.e. when the
codec module is imported, so ``TRITON_INTERPRET=1`` must be set before
``adacc_compile.kernels`` is imported -- too late inside a pytest process that
may already have imported it. The ``test_interpreted_*`` tests therefore run
only where the kernels are interpreted. In a normal run
``test_oplib.py::test_codec_kernels_in_interpreter`` starts one fresh pytest
process with ``TRITON_INTERPRET=1 -k interpreted`` for all codec files (one
torch import instead of one per file); when this file runs without it,
``test_triton_kernels_in_interpreter`` does the same for this file alone.
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
from adacc_compile.kernels import bitmask
from adacc_compile.kernels.oplib import is_interpreted, triton_available

CODEC = get_codec("bitmask")
INTERPRETED = is_interpreted(bitmask._bitmask_pack_kernel)
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 at import; run by test_triton_kernels_in_interpreter"
)

SHAPES = [(0,), (), (1,), (7,), (8,), (9,), (3, 33), (5, 1000), (2, 0, 3), (4, 3, 5)]


def _mask(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) > 0.5


# ---------------------------------------------------------------- reference + ops


def test_known_bytes_plane_major() -> None:
    """Nine elements pad to 16, viewed as 8 planes of 2: element 2j + i is
    bit j of byte i."""
    x = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    (packed,) = bitmask.torch_bitmask_compress(x)
    assert packed.tolist() == [0b10011, 0b10]


def test_each_element_lands_in_its_plane() -> None:
    """A single True at element e sets bit e // M of byte e % M, for every e."""
    numel = 21
    nbytes = (numel + 7) // 8
    for e in range(numel):
        x = torch.zeros(numel, dtype=torch.bool)
        x[e] = True
        (packed,) = bitmask.torch_bitmask_compress(x)
        expected = torch.zeros(nbytes, dtype=torch.uint8)
        expected[e % nbytes] = 1 << (e // nbytes)
        assert torch.equal(packed, expected), e


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_is_lossless_and_size_exact(shape: tuple[int, ...]) -> None:
    x = _mask(shape)
    packed = CODEC.compress(x)
    assert packed.nbytes == CODEC.compressed_nbytes(shape, torch.bool) == (x.numel() + 7) // 8
    out = CODEC.decompress(packed)
    assert out.dtype == torch.bool and out.shape == x.shape
    assert torch.equal(out, x)


def test_non_contiguous_input() -> None:
    x = _mask((9, 6)).t()
    assert not x.is_contiguous()
    assert torch.equal(CODEC.decompress(CODEC.compress(x)), x)
    assert torch.equal(CODEC.compress(x).payload[0], CODEC.compress(x.contiguous()).payload[0])


def test_deterministic() -> None:
    x = _mask((37, 11))
    assert torch.equal(CODEC.compress(x).payload[0], CODEC.compress(x).payload[0])


def test_applies_to_bool_only() -> None:
    assert CODEC.applies(ApplyQuery(shape=(4, 4), dtype=torch.bool, producer_class="dropout"))
    assert not CODEC.applies(ApplyQuery(shape=(4, 4), dtype=torch.uint8, producer_class="mask"))
    assert CODEC.lossless and CODEC.error_bound == 0.0


def test_calibrate_reports_density() -> None:
    stats = CODEC.calibrate([torch.tensor([True, False, False, True])])
    assert stats.relative_error == 0.0 and stats.extra["true_fraction"] == 0.5


def test_wrong_dtype_and_device_raise() -> None:
    with pytest.raises(TypeError, match="dtype"):
        CODEC.compress(torch.zeros(4))
    with pytest.raises(TypeError):
        bitmask.torch_bitmask_compress([True, False])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        bitmask.torch_bitmask_compress(torch.zeros(4, dtype=torch.bool, device="meta"))
    payload = CODEC.compress(_mask((16,))).payload
    with pytest.raises(ValueError, match="elements"):
        torch.ops.adacc.bitmask_decompress.default(list(payload), [17], torch.bool)
    with pytest.raises(ValueError, match="tensors"):
        torch.ops.adacc.bitmask_decompress.default([], [16], torch.bool)
    with pytest.raises(TypeError, match="decompress to"):
        torch.ops.adacc.bitmask_decompress.default(list(payload), [16], torch.float32)


def test_fake_tensor_shapes_match_spec() -> None:
    with FakeTensorMode():
        x = torch.empty(5, 13, dtype=torch.bool)
        payload = torch.ops.adacc.bitmask_compress.default(x)
        assert [tuple(p.shape) for p in payload] == [(9,)]
        out = torch.ops.adacc.bitmask_decompress.default(payload, [5, 13], torch.bool)
        assert out.shape == (5, 13) and out.dtype == torch.bool


@pytest.mark.parametrize("backend,dynamic", [("aot_eager", True), ("inductor", False)])
def test_ops_compile_without_graph_breaks(backend: str, dynamic: bool) -> None:
    def round_trip(a: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        payload = torch.ops.adacc.bitmask_compress.default(a)
        return torch.ops.adacc.bitmask_decompress.default(payload, list(a.shape), a.dtype), payload

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, backend=backend, fullgraph=True, dynamic=dynamic)
    x = _mask((6, 13)).t()
    out, payload = compiled(x)
    assert torch.equal(out, x)
    assert torch.equal(payload[0], bitmask.torch_bitmask_compress(x)[0])


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
@pytest.mark.parametrize("shape", SHAPES + [(70000,)], ids=str)
def test_interpreted_triton_matches_reference(shape: tuple[int, ...]) -> None:
    x = _mask(shape, seed=1)
    ref = bitmask.torch_bitmask_compress(x)[0]
    got = bitmask.triton_bitmask_compress(x)[0]
    assert torch.equal(got, ref)
    assert torch.equal(bitmask.triton_bitmask_decompress([ref], shape), x)


@interpreted
def test_interpreted_non_contiguous_and_op_path(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _mask((40, 9), seed=2).t()
    ref = bitmask.torch_bitmask_compress(x)[0]
    assert torch.equal(bitmask.triton_bitmask_compress(x)[0], ref)
    monkeypatch.setenv("ADACC_KERNELS", "triton")
    packed = CODEC.compress(x)
    assert torch.equal(packed.payload[0], ref)
    assert torch.equal(CODEC.decompress(packed), x)
