"""Measured device profiles: measured once per machine, cached on disk.

Why: timings differ from process to process on a shared machine, and a plan
follows its costs. With a profile measured at every compile, the same model
and options gave plans that differed in 166 of 325 decisions between two
processes, and a tensor-parallel run hid 2.98 ms of recompute in
communication windows in one run and none in the next. Nobody can debug a
plan that changes every time, and distributed ranks must agree on it.

So a measured profile is measured the first time it is needed on a
machine and written to ``<cache dir>/device_profile-<key>.json``; every
later process reads it back. The roofline figures are measured at once;
codec timings (compress + decompress of a codec's aten form, compiled by
Inductor: `codec_options`) lazily, one (codec, dtype) at a time when a plan
first offers that codec for that dtype (a ``lossless`` plan never pays for
compiling and timing the lossy codecs), and merged into the file: each
write re-reads the file under a lock and keeps timings already there, so
processes that time different codecs never drop each other's figures, and
a timing another process wrote first wins over this one's. The key hashes the device (CPU model and core count, or the GPU's
name), torch's version, adacc's version and `CACHE_FORMAT`, so a new torch,
a new adacc or another machine measures afresh. The profile's digest is part
of `AdaccPartitioner.uuid()`, so Inductor's graph cache never serves a plan
made under other costs.

Cache dir: env ``ADACC_CACHE_DIR``, else ``$XDG_CACHE_HOME/adacc``, else
``~/.cache/adacc``. Re-measure with env ``ADACC_REMEASURE=1`` or
``device_profile="calibrate"`` (both replace the cached file). Where the
directory cannot be written, the profile is still measured once per process
and a warning says that plans may then differ between processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import tempfile
import warnings
from typing import Any, Callable, Iterator

import torch

from .device_profile import DeviceProfile, measure_roofline

CACHE_FORMAT = 4
"""Bump when what is measured, or how, changes. 2: codec timings are of the
aten form compiled by Inductor, measured lazily per (codec, dtype). 4:
codec timings are their copies of the value at the profile's bandwidth
(`codec_timing`)."""

_IN_PROCESS: dict[str, DeviceProfile] = {}
_REMEASURED: set[str] = set()
"""Devices re-measured by this process (a re-measure happens once per process:
the partitioner asks for its profile more than once per graph)."""


def cache_dir() -> pathlib.Path:
    explicit = os.environ.get("ADACC_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "adacc"


def machine_key(device: str) -> dict[str, Any]:
    """What a measured profile depends on, besides the measurement itself."""
    from importlib import metadata

    try:
        adacc_version = metadata.version("adacc-compile")
    except metadata.PackageNotFoundError:  # run from a source tree
        adacc_version = "source"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
    else:
        name = _cpu_model()
    return {
        "format": CACHE_FORMAT,
        "device": device,
        "name": name,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "adacc": adacc_version,
    }


def cache_path(device: str) -> pathlib.Path:
    key = json.dumps(machine_key(device), sort_keys=True)
    return cache_dir() / f"device_profile-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_profile(device: str, *, refresh: bool = False) -> DeviceProfile:
    """The measured profile of ``device`` (see the module docstring)."""
    refresh = refresh or os.environ.get("ADACC_REMEASURE", "") not in ("", "0")
    if device in _IN_PROCESS and (not refresh or device in _REMEASURED):
        return _IN_PROCESS[device]
    path = cache_path(device)
    profile = None if refresh else _read(path)
    if profile is None:
        profile = _store(path, device, _measure(device), replace=refresh)
    if refresh:
        _REMEASURED.add(device)
    _IN_PROCESS[device] = profile
    return profile


def loaded_profile(device: str) -> DeviceProfile | None:
    """The measured profile of ``device`` if this process has loaded (or
    measured) it; never measures."""
    return _IN_PROCESS.get(device)


def codec_timing(device: str, key: str, measure: Callable[[], float]) -> float:
    """The cached codec timing ``key`` (`codec_form.codec_key`) of
    ``device``'s measured profile; ``measure()`` runs only where neither
    this process nor the cache file has it, and its result is merged into
    both (see the module docstring)."""
    profile = cached_profile(device)
    if key in profile.codec_seconds_per_element:
        return profile.codec_seconds_per_element[key]
    path = cache_path(device)
    on_disk = _read(path)
    if on_disk is not None and on_disk.codec_seconds_per_element.get(key) is not None:
        seconds = on_disk.codec_seconds_per_element[key]
    else:
        seconds = measure()
        seconds = _merge_timing(path, device, profile, key, seconds)
    _IN_PROCESS[device] = dataclasses.replace(
        _IN_PROCESS[device],
        codec_seconds_per_element={**_IN_PROCESS[device].codec_seconds_per_element, key: seconds},
    )
    return seconds


def _store(path: pathlib.Path, device: str, measured: DeviceProfile, *, replace: bool) -> DeviceProfile:
    """Writes a freshly measured profile; unless ``replace``, a profile
    another process wrote meanwhile wins (and is returned), so that
    processes started together still plan from the same figures."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            existing = None if replace else _read(path)
            if existing is not None:
                return existing
            _write(path, device, measured)
    except OSError:
        _write(path, device, measured)  # warns that plans may differ between processes
    return measured


def _merge_timing(path: pathlib.Path, device: str, profile: DeviceProfile, key: str, seconds: float) -> float:
    """Writes ``key`` into the cache file, keeping every timing already
    there; returns the timing that ends up in the file (another process's,
    if it wrote ``key`` first)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            on_disk = _read(path) or profile
            merged = dict(on_disk.codec_seconds_per_element)
            seconds = merged.setdefault(key, seconds)
            _write(path, device, dataclasses.replace(on_disk, codec_seconds_per_element=merged))
    except OSError:
        _write(path, device, profile)  # warns that plans may differ between processes
    return seconds


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock`` (POSIX; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _measure(device: str) -> DeviceProfile:
    """The roofline; codec timings come later, one at a time (`codec_timing`)."""
    return measure_roofline(device)


def _read(path: pathlib.Path) -> DeviceProfile | None:
    try:
        data = json.loads(path.read_text())
        return DeviceProfile.from_json(data["profile"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: pathlib.Path, device: str, profile: DeviceProfile) -> None:
    payload = json.dumps({"key": machine_key(device), "profile": profile.to_json()}, indent=1, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: a concurrent reader sees the old file or the new
        # one, never half of one.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(payload)
        os.replace(f.name, path)
    except OSError as error:
        warnings.warn(
            f"adacc: cannot cache the measured device profile in {path.parent} ({error}); it is "
            f"measured once per process, so plans may differ between processes (set ADACC_CACHE_DIR "
            f"to a writable directory, or use a built-in device_profile such as 'h100')",
            stacklevel=3,
        )


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
