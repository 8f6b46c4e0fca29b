"""`bench/bench_fused_codecs.py`'s timer: one untimed call, then the timed ones."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))

import bench_fused_codecs  # noqa: E402


def test_each_measurement_makes_one_untimed_call_first(monkeypatch):
    clock = iter([10.0, 16.0])  # start, end of the timed calls
    monkeypatch.setattr(bench_fused_codecs.time, "perf_counter", lambda: next(clock))
    calls = []
    seconds = bench_fused_codecs._timed(lambda: calls.append(1), 3)
    assert len(calls) == 4  # the untimed one and three timed
    assert seconds == 2.0  # 6 s over the three timed calls only


def test_the_floor_row_is_an_int8_cast_and_named_apart_from_the_codecs():
    import torch

    floor = bench_fused_codecs.codec_of(bench_fused_codecs.FLOOR.name)
    assert floor is bench_fused_codecs.FLOOR
    assert bench_fused_codecs.codec_of("int8_outlier").name == "int8_outlier"
    x = torch.tensor([[1.7, -2.2], [0.4, 126.9]])
    (payload,) = floor.aten_compress(x)
    assert payload.dtype == torch.int8 and payload.tolist() == [[1, -2], [0, 126]]
    assert floor.aten_decompress([payload], [2, 2], torch.float32).tolist() == [[1.0, -2.0], [0.0, 126.0]]


def test_the_yardstick_copies_into_one_buffer_allocated_once():
    import torch

    graphs = bench_fused_codecs.build_graphs(bench_fused_codecs.FLOOR, 8, 64, torch.float32)
    first, second = graphs.copy(), graphs.copy()
    assert first.data_ptr() == second.data_ptr()
