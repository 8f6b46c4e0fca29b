"""Tests for kernels/oplib.py: kernel choice, validation, op registration.

Also hosts ``test_codec_kernels_in_interpreter``, which runs the Triton tier
of the bitmask / fp8 / softmax_u8 / int8_channel / int8_smooth tests (``-k interpreted``) in one fresh
process with ``TRITON_INTERPRET=1`` -- see the docstring of test_bitmask.py
for why that needs a fresh process.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from adacc_compile.kernels import ApplyQuery, KernelChoice, bitmask
from adacc_compile.kernels import oplib
from adacc_compile.kernels.oplib import (
    OpCodec,
    PayloadSpec,
    check_input,
    check_output_dtype,
    check_payload,
    check_shape,
    error_stats,
    numel_of,
    register_codec_ops,
    spec_nbytes,
    use_triton,
)

HERE = Path(__file__).parent
CODEC_TEST_FILES = [
    "test_bitmask.py", "test_fp8.py", "test_softmax_u8.py", "test_int_channel.py", "test_int8_smooth.py",
    "test_kernel_traffic.py",
]
INTERPRETED = oplib.is_interpreted(bitmask._bitmask_pack_kernel)


@pytest.mark.skipif(INTERPRETED or not oplib.triton_available(), reason="already interpreted / no Triton")
def test_codec_kernels_in_interpreter() -> None:
    files = [str(HERE / f) for f in CODEC_TEST_FILES]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-q", "-x", "-p", "no:cacheprovider",
         "-k", "interpreted"],
        env={**os.environ, "TRITON_INTERPRET": "1", "ADACC_KERNELS": "auto"},
        cwd=HERE.parents[1], capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout


# ---------------------------------------------------------------- kernel choice


def test_triton_available_is_a_bool() -> None:
    assert isinstance(oplib.triton_available(), bool)


def test_use_triton_by_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(3)
    assert use_triton(x, KernelChoice.TORCH) is False
    assert use_triton(x, KernelChoice.AUTO) is False  # AUTO: Triton only for CUDA tensors
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    assert use_triton(x) is False
    monkeypatch.setenv("ADACC_KERNELS", "bogus")
    with pytest.raises(ValueError, match="ADACC_KERNELS"):
        use_triton(x)


def test_forced_triton_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not oplib.triton_available():
        pytest.skip("no Triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        use_triton(torch.zeros(3), KernelChoice.TRITON)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(torch.zeros(3), KernelChoice.TRITON) is True
    with FakeTensorMode(), pytest.raises(RuntimeError, match="trace"):
        use_triton(torch.zeros(3), KernelChoice.TRITON)


def test_forced_triton_when_triton_missing_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oplib, "triton_available", lambda: False)
    with pytest.raises(RuntimeError, match="not importable"):
        use_triton(torch.zeros(3), KernelChoice.TRITON)
    assert use_triton(torch.zeros(3), KernelChoice.AUTO) is False
    with pytest.raises(RuntimeError, match="not importable"):
        oplib.require_triton(torch.zeros(3))


def test_missing_triton_stub_raises_on_launch() -> None:
    def kernel() -> None: ...

    stub = oplib._MissingTritonKernel(kernel)
    with pytest.raises(RuntimeError, match="cannot launch kernel"):
        stub[(1,)]()


@pytest.mark.skipif(INTERPRETED or not oplib.triton_available(), reason="kernels are interpreted")
def test_compiled_kernels_refuse_cpu_tensors() -> None:
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        bitmask.triton_bitmask_compress(torch.zeros(4, dtype=torch.bool))


def test_launch_skips_empty_grid() -> None:
    oplib.launch(object(), (0,))  # would fail if it tried to index the kernel


# ---------------------------------------------------------------- validation


def test_check_input() -> None:
    x = torch.zeros(2)
    assert check_input(x, codec="c", dtypes=(torch.float32,)) is x
    with pytest.raises(TypeError, match="torch.Tensor"):
        check_input([0.0], codec="c", dtypes=(torch.float32,))
    with pytest.raises(TypeError, match="dtype torch.float64"):
        check_input(x.double(), codec="c", dtypes=(torch.float32,))
    with pytest.raises(ValueError, match="device meta"):
        check_input(torch.zeros(2, device="meta"), codec="c", dtypes=(torch.float32,))


def test_check_output_dtype_and_shape() -> None:
    check_output_dtype(torch.bool, codec="c", dtypes=(torch.bool,))
    with pytest.raises(TypeError):
        check_output_dtype(torch.int8, codec="c", dtypes=(torch.bool,))
    assert check_shape([2, 3], codec="c") == (2, 3)
    with pytest.raises(ValueError, match="negative"):
        check_shape([2, -1], codec="c")
    with pytest.raises(TypeError):
        check_shape([2.0], codec="c")


def test_check_payload() -> None:
    spec: PayloadSpec = [((2, 3), torch.uint8), ((2,), torch.float32)]
    good = [torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(2)]
    check_payload(good, spec, codec="c")
    with pytest.raises(ValueError, match="1 tensors, expected 2"):
        check_payload(good[:1], spec, codec="c")
    with pytest.raises(TypeError, match="dtype"):
        check_payload([good[0], torch.zeros(2, dtype=torch.float16)], spec, codec="c")
    with pytest.raises(ValueError, match="elements"):
        check_payload([good[0], torch.zeros(3)], spec, codec="c")
    with pytest.raises(TypeError, match="not a Tensor"):
        check_payload([good[0], None], spec, codec="c")


def test_sizes() -> None:
    assert numel_of(()) == 1 and numel_of((2, 0, 3)) == 0 and numel_of((4, 5)) == 20
    assert spec_nbytes([((3, 5), torch.uint8), ((3,), torch.float32), ((0,), torch.float16)]) == 27


def test_error_stats() -> None:
    x = torch.tensor([3.0, 4.0, float("nan"), float("inf")])
    rel, sqnr = error_stats(x, torch.tensor([3.0, 4.0 + 0.5, 0.0, 0.0]))
    assert math.isclose(rel, 0.1) and math.isclose(sqnr, 20.0)
    assert error_stats(x, x) == (0.0, math.inf)
    assert error_stats(torch.zeros(2), torch.zeros(2)) == (0.0, math.inf)


# ---------------------------------------------------------------- registration


def _toy_spec(shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
    return [(tuple(shape), torch.float16)]


def _toy_compress(x: torch.Tensor) -> list[torch.Tensor]:
    check_input(x, codec="oplib_selftest", dtypes=(torch.float32,))
    return [x.to(torch.float16)]


def _toy_decompress(payload: list[torch.Tensor], shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    return payload[0].to(dtype).reshape(shape)


_TOY_OPS = register_codec_ops(
    "oplib_selftest", compress=_toy_compress, decompress=_toy_decompress, payload_spec=_toy_spec
)


class _ToyCodec(OpCodec):
    name = "oplib_selftest"

    def payload_spec(self, shape: Sequence[Any], dtype: torch.dtype) -> PayloadSpec:
        return _toy_spec(shape, dtype)

    def applies(self, query: ApplyQuery) -> bool:
        return query.dtype == torch.float32


def test_registered_ops_have_the_contract_schema() -> None:
    compress = torch.ops.adacc.oplib_selftest_compress.default
    decompress = torch.ops.adacc.oplib_selftest_decompress.default
    assert str(compress._schema).endswith("(Tensor x) -> Tensor[]")
    assert str(decompress._schema).endswith(
        "(Tensor[] payload, SymInt[] shape, ScalarType dtype) -> Tensor"
    )


def test_op_codec_round_trip_size_and_calibrate() -> None:
    codec = _ToyCodec()
    x = torch.tensor([[1.0, 2.0, float("nan")], [0.125, -4.0, 65504.0]], requires_grad=True)
    packed = codec.compress(x)
    assert packed.nbytes == codec.compressed_nbytes(x.shape, x.dtype) == 12
    assert torch.equal(codec.decompress(packed).nan_to_num(7.0), x.detach().nan_to_num(7.0))
    stats = codec.calibrate([x.detach()])
    assert stats.codec == "oplib_selftest" and stats.abs_max == 65504.0
    assert stats.relative_error == 0.0 and stats.extra["nonfinite_fraction"] == 1 / 6
    with pytest.raises(ValueError, match="cannot decompress"):
        codec.decompress(type(packed)(codec="other", payload=packed.payload, shape=(2, 3), dtype=x.dtype))


def test_fake_kernels_follow_the_spec() -> None:
    with FakeTensorMode():
        payload = torch.ops.adacc.oplib_selftest_compress.default(torch.empty(4, 5))
        assert [(tuple(p.shape), p.dtype) for p in payload] == [((4, 5), torch.float16)]
        out = torch.ops.adacc.oplib_selftest_decompress.default(payload, [4, 5], torch.float32)
        assert out.shape == (4, 5) and out.dtype == torch.float32
