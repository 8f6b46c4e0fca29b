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


def test_above_floor_is_paired_per_round_and_only_for_the_floors_graphs(monkeypatch):
    """Fake timings (copy and kept graphs 1 s): the floor's compress adds
    1 copy in round 0 and 3 in round 1, int8_channel's 2 and 4, so its
    ratio moves by 2 while it stays 1 above the floor; softmax_u8 runs in
    other graphs: no figure."""
    import torch

    added = {bench_fused_codecs.FLOOR.name: [1.0, 3.0], "int8_channel": [2.0, 4.0]}
    names = [bench_fused_codecs.FLOOR.name, "int8_channel", "softmax_u8"]
    fields = ("keep_forward", "compress_forward", "keep_backward", "restore_backward",
              "standalone_compress", "standalone_decompress", "copy")
    compress_calls = {n: 0 for n in names}

    def graphs_for(codec, *args, **kwargs):
        def make(field):
            return lambda: (codec.name, field)
        return bench_fused_codecs.Graphs(**{f: make(f) for f in fields})

    def timed(fn, inner):
        name, field = fn()
        if field != "compress_forward" or name not in added:
            return 1.0
        compress_calls[name] += 1
        # The first timed call sizes the repeats; the next two are rounds 0 and 1.
        return 1.0 + (added[name][compress_calls[name] - 2] if compress_calls[name] > 1 else 0.0)

    monkeypatch.setattr(bench_fused_codecs, "build_graphs", graphs_for)
    monkeypatch.setattr(bench_fused_codecs, "_timed", timed)
    results = {r.codec: r for r in bench_fused_codecs.run(names, 4, 64, torch.float32, repeats=2, min_time=0.0)}
    floor, channel, softmax = (results[n] for n in names)
    assert floor.in_graph_vs_copy == 2.0 and channel.in_graph_vs_copy == 3.0  # medians of 1, 3 and 2, 4
    assert channel.above_floor == 1.0
    assert floor.above_floor is None and softmax.above_floor is None


def test_the_benchmark_re_executes_under_the_steady_allocator_once():
    import platform

    if platform.libc_ver()[0] != "glibc":
        assert bench_fused_codecs.steady_allocator_env({}) is None
        return
    env = bench_fused_codecs.steady_allocator_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": bench_fused_codecs.STEADY_ALLOCATOR}
    assert bench_fused_codecs.steady_allocator_env(env) is None  # already under it: no second exec
    other = bench_fused_codecs.steady_allocator_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"})
    assert other["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=1:" + bench_fused_codecs.STEADY_ALLOCATOR


def test_each_row_counts_the_page_faults_of_its_timed_calls(monkeypatch):
    """A fake fault counter that moves by 5 while int8_channel's graphs run
    (two rounds: 10) and not for the floor's."""
    import torch

    names = [bench_fused_codecs.FLOOR.name, "int8_channel"]
    fields = ("keep_forward", "compress_forward", "keep_backward", "restore_backward",
              "standalone_compress", "standalone_decompress", "copy")
    counter = [0]

    def graphs_for(codec, *args, **kwargs):
        def make(field):
            def call():
                if codec.name == "int8_channel" and field == "keep_forward":
                    counter[0] += 5
            return call
        return bench_fused_codecs.Graphs(**{f: make(f) for f in fields})

    monkeypatch.setattr(bench_fused_codecs, "build_graphs", graphs_for)
    monkeypatch.setattr(bench_fused_codecs, "_timed", lambda fn, inner: (fn(), 1.0)[1])
    monkeypatch.setattr(bench_fused_codecs, "_minor_faults", lambda: counter[0])
    results = {r.codec: r for r in bench_fused_codecs.run(names, 4, 64, torch.float32, repeats=2, min_time=0.0)}
    assert results[bench_fused_codecs.FLOOR.name].page_faults == 0
    assert results["int8_channel"].page_faults == 10
    assert bench_fused_codecs.markdown(list(results.values())).splitlines()[-1].endswith("| 10 |")
