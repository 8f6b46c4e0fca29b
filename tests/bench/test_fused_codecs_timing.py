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
