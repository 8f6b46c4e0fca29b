"""`codec_timing`: a codec's measured cost is its time in copies of the
value, charged at the profile's bandwidth. Timed on a small sample, warm in
cache, the codecs cost 0.6-0.7x what they cost next to the profile's other
figures; a copy kernel timed in the same rounds cancels that."""

from __future__ import annotations

import functools

import pytest
import torch

from adacc_compile.kernels import get_codec
from adacc_compile.passes import codec_options, codec_timing, device_profile, profile_cache


def test_a_timing_is_charged_its_copies_at_the_bandwidth():
    timing = codec_timing.CodecTiming(compress_s=3e-3, decompress_s=1e-3, copy_s=2e-3, numel=1000, itemsize=4)
    assert timing.copies == pytest.approx(2.0)
    assert timing.seconds_per_element == pytest.approx(4e-6)
    # two copies of 4-byte elements, each a read and a write, at 8 bytes/s
    assert timing.seconds_per_element_at(8.0) == pytest.approx(2 * 2 * 4 / 8.0)


def test_the_round_trip_and_its_copy_are_timed_in_the_same_rounds(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(codec_timing, "copy_kernel", lambda nbytes, device: lambda: calls.append(f"copy {nbytes}"))
    sample = torch.zeros(4, 8, dtype=torch.bfloat16)
    round_trip = (lambda x: calls.append("compress") or "payload", lambda p: calls.append("decompress"))
    timing = codec_timing.time_round_trip(round_trip, sample, repeats=3)
    rounds = calls[-9:]
    assert rounds == ["compress", "decompress", "copy 64"] * 3  # the sample's bytes: 32 bfloat16
    assert timing.itemsize == 2 and timing.numel == 32
    assert min(timing.compress_s, timing.decompress_s, timing.copy_s) > 0


def test_the_copy_kernel_reads_and_writes_the_bytes_it_is_given():
    copy = codec_timing.copy_kernel(4096, torch.device("cpu"))
    (out,) = copy()
    assert out.dtype == torch.float32 and out.numel() == 1024


def test_a_measured_profile_passes_its_bandwidth_to_the_codec_timing(monkeypatch):
    measured = []

    def timing(device, key, measure):
        assert isinstance(measure, functools.partial)
        measured.append(measure.keywords["bandwidth"])
        return 1e-9

    monkeypatch.setattr(profile_cache, "codec_timing", timing)
    profile = device_profile.DeviceProfile(name="calibrated cpu", memory_bytes_per_s=12.5e9)
    codec_options.codec_seconds(get_codec("int8_channel"), (64, 1024), torch.float32, profile)
    assert measured == [12.5e9]
