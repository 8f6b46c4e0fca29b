"""Measured device profiles are measured once per machine and cached on
disk: a new process reads the same figures (and so makes the same plan)."""

from __future__ import annotations

import json

import pytest

from adacc_compile.passes import device_profile, profile_cache


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """A cache dir of its own and an empty in-process cache, as in a new process."""
    monkeypatch.setenv("ADACC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ADACC_REMEASURE", raising=False)
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})
    monkeypatch.setattr(profile_cache, "_REMEASURED", set())
    return tmp_path


def _forbid_measuring(monkeypatch):
    def fail(device):
        raise AssertionError("measured again")

    monkeypatch.setattr(profile_cache, "measure_roofline", fail)


def test_measured_once_then_read_back(fresh_process, monkeypatch):
    first = device_profile.calibrate("cpu")
    files = list(fresh_process.glob("device_profile-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["key"]["torch"] and data["key"]["device"] == "cpu"
    assert not first.codec_seconds_per_element, "codec timings are measured lazily, not with the roofline"
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})  # "a new process"
    _forbid_measuring(monkeypatch)
    second = device_profile.calibrate("cpu")
    assert second == first and second.digest() == first.digest()


def _timer(calls: list[str], seconds: float):
    def measure() -> float:
        calls.append("measured")
        return seconds

    return measure


def test_codec_timing_measured_once_per_machine(fresh_process, monkeypatch):
    calls: list[str] = []
    assert profile_cache.codec_timing("cpu", "bitmask/bool", _timer(calls, 2e-9)) == 2e-9
    assert profile_cache.codec_timing("cpu", "bitmask/bool", _timer(calls, 9.0)) == 2e-9
    assert calls == ["measured"]
    assert device_profile.calibrate("cpu").codec_seconds_per_element == {"bitmask/bool": 2e-9}
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})  # "a new process" reads it back
    _forbid_measuring(monkeypatch)
    assert profile_cache.codec_timing("cpu", "bitmask/bool", _timer(calls, 9.0)) == 2e-9
    assert calls == ["measured"]


def test_codec_timings_merge_and_the_first_writer_wins(fresh_process, monkeypatch):
    """Two processes sharing a cache, each timing what its plans need: the
    file ends up with both timings, and where both timed the same codec the
    one written first is what both plan with."""
    calls: list[str] = []
    profile_cache.codec_timing("cpu", "fp8_e4m3/float32", _timer(calls, 1e-9))
    mine = dict(profile_cache._IN_PROCESS)
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})  # the other process
    profile_cache.codec_timing("cpu", "int8_outlier/float32", _timer(calls, 3e-9))
    other = profile_cache._IN_PROCESS["cpu"]
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", mine)  # back in the first one
    # It times int8_outlier too (it did not see the other's write in memory)
    # but the file already has it: that timing wins.
    assert profile_cache.codec_timing("cpu", "int8_outlier/float32", _timer(calls, 7e-9)) == 3e-9
    on_disk = json.loads(next(fresh_process.glob("device_profile-*.json")).read_text())
    assert on_disk["profile"]["codec_seconds_per_element"] == {"fp8_e4m3/float32": 1e-9, "int8_outlier/float32": 3e-9}
    assert other.codec_seconds_per_element == {"fp8_e4m3/float32": 1e-9, "int8_outlier/float32": 3e-9}
    assert calls == ["measured", "measured"]


def test_remeasure_by_env_or_option(fresh_process, monkeypatch):
    first = device_profile.calibrate("cpu")
    calls = []
    real = profile_cache.measure_roofline
    monkeypatch.setattr(profile_cache, "measure_roofline", lambda d: calls.append(d) or real(d))
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})
    monkeypatch.setenv("ADACC_REMEASURE", "1")
    device_profile.calibrate("cpu")
    device_profile.calibrate("cpu")  # once per process, not per call
    assert calls == ["cpu"]
    monkeypatch.delenv("ADACC_REMEASURE")
    monkeypatch.setattr(profile_cache, "_REMEASURED", set())
    device_profile.profile_by_name("calibrate")
    assert calls == ["cpu", "cpu"]
    assert first.name == device_profile.calibrate("cpu").name


def test_unwritable_cache_warns_and_still_measures(fresh_process, monkeypatch):
    blocker = fresh_process / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ADACC_CACHE_DIR", str(blocker / "adacc"))
    with pytest.warns(UserWarning, match="cannot cache the measured device profile"):
        profile = device_profile.calibrate("cpu")
    assert profile.memory_bytes_per_s > 0


def test_profile_digest_reaches_the_partitioner_uuid(fresh_process, monkeypatch):
    from adacc_compile.config import AdaccConfig
    from adacc_compile.partitioner import AdaccPartitioner

    partitioner = AdaccPartitioner(AdaccConfig.from_options({"device_profile": "cpu"}))
    before = partitioner.uuid()
    assert before == partitioner.uuid()
    cached = profile_cache._IN_PROCESS["cpu"]
    import dataclasses

    monkeypatch.setitem(
        profile_cache._IN_PROCESS, "cpu", dataclasses.replace(cached, memory_bytes_per_s=cached.memory_bytes_per_s * 2)
    )
    assert partitioner.uuid() != before


def test_codec_timing_key_names_the_codec_source(tmp_path, monkeypatch):
    """A measured codec timing is keyed by a digest of the codec's code, so
    a changed codec is timed again (the cache file's key names adacc's
    release, not its source)."""
    import torch

    from adacc_compile.passes import codec_form

    key = codec_form.codec_key("int8_outlier", torch.float32)
    name, _, digest = key.partition("@")
    assert name == "int8_outlier/float32" and len(digest) == 12
    assert codec_form.codec_key("int8_outlier", torch.float32, codec_form.GraphForm.CUSTOM_OP).startswith(
        "int8_outlier/float32/custom_op@"
    )
    copy = tmp_path / "codec.py"
    monkeypatch.setattr(codec_form.inspect, "getsourcefile", lambda obj: str(copy))
    keys = []
    for text in ("def compress(): pass\n", "def compress(): return 1\n"):
        copy.write_text(text)
        codec_form.implementation_digest.cache_clear()
        keys.append(codec_form.codec_key("int8_outlier", torch.float32))
    codec_form.implementation_digest.cache_clear()
    assert keys[0] != keys[1] and keys[0] != key


def test_a_codec_is_costed_from_rows_as_aligned_as_the_values(monkeypatch):
    """Rows that are not a whole number of `codec_timing.ALIGNED_COLUMNS`
    (a Llama FFN's 682 channels) cost some codecs more per element (padded
    groups, one-byte rows read byte by byte): their cost comes from a
    timing of such rows, cached under its own key."""
    import dataclasses

    import torch

    from adacc_compile.kernels import get_codec
    from adacc_compile.passes import codec_options, codec_timing

    keys: list[str] = []

    def timing(device, key, measure):
        keys.append(key)
        return 2e-9 if "/unaligned@" in key else 1e-9

    monkeypatch.setattr(profile_cache, "codec_timing", timing)
    measured = dataclasses.replace(device_profile.BUILTIN_PROFILES["h100"], name="calibrated cpu")
    codec = get_codec("int8_channel")
    assert codec_options.codec_seconds(codec, (256, 1024), torch.float32, measured) == pytest.approx(256 * 1024 * 1e-9)
    assert codec_options.codec_seconds(codec, (256, 682), torch.float32, measured) == pytest.approx(256 * 682 * 2e-9)
    assert [k.partition("@")[0] for k in keys] == ["int8_channel/float32", "int8_channel/float32/unaligned"]
    assert codec_timing.is_aligned((4, 256, 64)) and not codec_timing.is_aligned((4, 256, 682))
    assert codec_timing.UNALIGNED_SAMPLE_SHAPE[-1] % codec_timing.ALIGNED_COLUMNS != 0


def test_a_builtin_profile_with_measured_copy_times_charges_at_least_those():
    """The H200 profile carries each codec's measured compress + decompress
    time in copies of the value (gpu_check, 2026-12-04): a codec costs at
    least that there, while a profile without them keeps the fused byte model."""
    import torch

    from adacc_compile.kernels import get_codec
    from adacc_compile.passes import codec_options

    h200, h100 = device_profile.BUILTIN_PROFILES["h200"], device_profile.BUILTIN_PROFILES["h100"]
    assert set(h200.codec_copy_times) >= {"int8_channel", "fp8_e4m3", "bitmask"} and not h100.codec_copy_times
    shape, dtype = (4096, 1024), torch.bfloat16
    copy = 2 * 4096 * 1024 * 2 / h200.memory_bytes_per_s
    for name in ("int8_channel", "fp8_e4m3"):
        codec = get_codec(name)
        fused = codec.cost_seconds(shape, dtype, h200.memory_bytes_per_s)
        assert codec_options.codec_seconds(codec, shape, dtype, h200) == pytest.approx(h200.codec_copy_times[name] * copy)
        assert codec_options.codec_seconds(codec, shape, dtype, h200) > fused
        assert codec_options.codec_seconds(codec, shape, dtype, h100) == pytest.approx(
            codec.cost_seconds(shape, dtype, h100.memory_bytes_per_s))
    assert device_profile.DeviceProfile.from_json(h200.to_json()) == h200
    import dataclasses

    assert h200.digest() != dataclasses.replace(h200, codec_copy_times={}).digest()  # plans follow the costs


def test_a_builtin_profile_picks_the_faster_measured_form_on_a_gpu(monkeypatch):
    """On the H200 the hand-written Triton kernels were faster for
    fewbit_gelu only: a plan on that profile inserts its custom ops on
    CUDA and charges that form's time; every other codec keeps the aten
    form, and so does every codec without the profile, or on the CPU."""
    import torch

    from adacc_compile.kernels import get_codec
    from adacc_compile.kernels.oplib import triton_available
    from adacc_compile.passes import codec_form, codec_options

    if not triton_available():
        pytest.skip("the custom-op form needs Triton")
    monkeypatch.delenv("ADACC_KERNELS", raising=False)
    h200 = device_profile.BUILTIN_PROFILES["h200"]
    gelu, int8 = get_codec("fewbit_gelu"), get_codec("int8_channel")
    assert h200.triton_codec_copy_times["fewbit_gelu"] < h200.codec_copy_times["fewbit_gelu"]
    assert codec_form.graph_form(gelu, torch.bfloat16, "cuda", h200) is codec_form.GraphForm.CUSTOM_OP
    assert codec_form.graph_form(int8, torch.bfloat16, "cuda", h200) is codec_form.GraphForm.ATEN
    assert codec_form.graph_form(gelu, torch.bfloat16, "cuda") is codec_form.GraphForm.ATEN
    assert codec_form.graph_form(gelu, torch.bfloat16, "cpu", h200) is codec_form.GraphForm.ATEN
    shape = (4096, 1024)
    copy = 2 * 4096 * 1024 * 2 / h200.memory_bytes_per_s
    charged = codec_options.codec_seconds(gelu, shape, torch.bfloat16, h200)
    assert charged == pytest.approx(h200.triton_codec_copy_times["fewbit_gelu"] * copy)
