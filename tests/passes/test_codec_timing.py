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


def test_a_derivative_codec_is_credited_the_backward_it_replaces():
    """Only what the product with the gradient adds over the activation
    backward counts; a product cheaper than that backward leaves the compress."""
    slower = codec_timing.CodecTiming(
        compress_s=3e-3, decompress_s=2e-3, replaced_s=1.5e-3, copy_s=1e-3, numel=1000, itemsize=4
    )
    assert slower.added_s == pytest.approx(3.5e-3) and slower.copies == pytest.approx(3.5)
    faster = codec_timing.CodecTiming(
        compress_s=3e-3, decompress_s=1e-3, replaced_s=4e-3, copy_s=1e-3, numel=1000, itemsize=4
    )
    assert faster.added_s == pytest.approx(3e-3) and faster.seconds_per_element == pytest.approx(3e-6)


@pytest.mark.parametrize("name", ["fewbit_gelu", "fewbit_silu"])
def test_the_derivative_round_trip_times_what_the_rewrite_puts_in_the_backward(name):
    """Decompress is timed as gradient times derivative, and the replaced
    activation backward computes what eager's does; a value codec replaces none."""
    codec = get_codec(name)
    sample = codec_timing.sample_input(codec, torch.float32, "cpu", (16, 64)) * 6 - 3
    grad = codec_timing.sample_gradient(sample)
    compress, decompress = codec_timing.compiled_round_trip(codec, sample)
    restored = decompress(compress(sample))
    assert torch.equal(restored, grad * codec.decompress(codec.compress(sample)))
    replaced = codec_timing.replaced_backward(codec, sample)
    (exact,) = replaced()
    x = sample.clone().requires_grad_()
    act = torch.nn.functional.gelu if name == "fewbit_gelu" else torch.nn.functional.silu
    act(x).backward(grad)
    torch.testing.assert_close(exact, x.grad)
    assert codec_timing.replaced_backward(get_codec("int8_channel"), sample) is None


def test_a_codec_is_retimed_when_how_it_is_timed_changes(monkeypatch):
    """The timing's source is part of every codec's digest: an edit of it
    gives every codec a new key, so cached timings are measured afresh."""
    from pathlib import Path

    from adacc_compile.passes import codec_form

    before = codec_form.implementation_digest("int8_channel")
    read = Path.read_bytes

    def edited(path):
        data = read(path)
        return data + b"# edited" if path.name == Path(codec_timing.__file__).name else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    codec_form.implementation_digest.cache_clear()
    try:
        assert codec_form.implementation_digest("int8_channel") != before
    finally:
        codec_form.implementation_digest.cache_clear()
