"""`bench/bench_codec_bound.py`: the hand-written yardstick is the codec's
payload bit for bit, and a machine that cannot build it says why."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

import bench_codec_bound  # noqa: E402


def test_same_bits_tells_nan_payloads_and_dtypes_apart():
    a = torch.tensor([1.0, float("nan")])
    b = a.clone()
    assert bench_codec_bound.same_bits(a, b)
    assert not torch.equal(a, b)  # why the comparison goes through the bits
    b.view(torch.int32)[1] ^= 1  # another NaN
    assert not bench_codec_bound.same_bits(a, b)
    assert not bench_codec_bound.same_bits(a, a.double())


def test_a_machine_without_the_yardstick_gets_a_reason_and_exit_code_2(monkeypatch, capsys):
    def cannot():
        raise bench_codec_bound.NoYardstick("this CPU lacks AVX-512 (F, BW, DQ)")

    monkeypatch.setattr(bench_codec_bound, "build_extension", cannot)
    assert bench_codec_bound.main(["--repeats", "1"]) == 2
    assert "lacks AVX-512" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [(["--cols", "100"], "multiple of 64"), (["--cols", "0"], "multiple of 64"),
                                         (["--rows", "0"], "at least 1")])
def test_shapes_the_kernels_do_not_take_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit):
        bench_codec_bound.main(argv)
    assert says in capsys.readouterr().err


@pytest.mark.slow
def test_the_hand_written_kernels_reproduce_the_codec_and_are_timed():
    try:
        ext = bench_codec_bound.build_extension()
    except bench_codec_bound.NoYardstick as why:
        pytest.skip(str(why))
    # `measure` asserts the payload and the restored values bit for bit
    # (NaN, ±Inf and an outlier channel's NaN included) before timing.
    rows, copy_ms = bench_codec_bound.measure(ext, rows=64, cols=256, repeats=3, min_time=0.001)
    assert [r.code for r in rows] == ["inductor", "hand-written", "one-byte cast"]
    assert copy_ms > 0 and all(r.total_vs_copy > 0 for r in rows)
    # In graph, the hand-written kernels run as custom ops Inductor calls.
    assert all(math.isfinite(r.in_graph_vs_copy) for r in rows)
