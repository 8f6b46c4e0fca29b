"""Which form a codec takes in a compiled graph: aten ops or its custom ops.

Why two forms: the aten form (the codec's torch reference traced into plain
aten ops, `adacc_compile.kernels.aten_graphs`) is what Inductor can fuse:
compress into the kernel that produces the value, decompress into the one
that reads it, so neither re-reads nor re-writes the full-precision value
and neither costs a launch of its own. The custom ops
(``torch.ops.adacc.<codec>_compress``) are opaque to Inductor and run the
hand-written Triton kernels on CUDA; they can only win where Inductor's code
for a codec is slow, which only a measurement can tell.

The rule, per codec and value:

* ``ADACC_KERNELS=triton``: the custom ops (forced, e.g. to test or time
  the Triton kernels inside graphs);
* on CUDA, with a measured device profile (``device_profile="calibrate"``)
  that timed both forms of the codec for this dtype: the faster one;
* on CUDA, with a built-in profile that holds both forms' measured times
  (`DeviceProfile.codec_copy_times` / ``triton_codec_copy_times``, the
  H200's): the faster one;
* otherwise the aten form. The byte model of a built-in GPU profile always
  prefers it: fused, it moves strictly fewer bytes than a separate kernel
  that must read the value again.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import pathlib

import torch

from adacc_compile.kernels import Codec, KernelChoice, get_codec, kernel_choice_from_env
from adacc_compile.kernels import aten_graphs
from adacc_compile.kernels.oplib import triton_available

from .device_profile import DeviceProfile


class GraphForm(enum.Enum):
    ATEN = "aten"
    """The torch reference as aten ops, fused by Inductor."""
    CUSTOM_OP = "custom_op"
    """``torch.ops.adacc.<codec>_compress`` / ``_decompress`` (Triton on CUDA)."""


def codec_key(name: str, dtype: torch.dtype, form: GraphForm = GraphForm.ATEN, *, aligned: bool = True) -> str:
    """Key of a measured codec timing in `DeviceProfile.codec_seconds_per_element`:
    ``"<codec>/<dtype>@<source digest>"`` for the aten form (compiled by
    Inductor), ``"<codec>/<dtype>/custom_op@<digest>"`` for the custom ops,
    with ``/unaligned`` before the ``@`` for values whose last dimension is
    not a whole number of ``codec_timing.ALIGNED_COLUMNS``.
    The digest (`implementation_digest`) makes a changed codec re-timed: the
    cache file's own key names adacc's release, not its source."""
    base = f"{name}/{str(dtype).removeprefix('torch.')}"
    if form is not GraphForm.ATEN:
        base = f"{base}/{form.value}"
    if not aligned:
        base = f"{base}/unaligned"
    return f"{base}@{implementation_digest(name)}"


#: Files of this package whose source is part of every codec's digest: how
#: a codec is timed (a derivative codec is credited the backward it replaces).
TIMED_BY = ("codec_timing.py",)


@functools.lru_cache(maxsize=None)
def implementation_digest(name: str) -> str:
    """A short digest of the code a codec's timing depends on: its module
    (torch reference, aten form, Triton kernels), the shared aten-form
    helpers and the timing itself (`TIMED_BY`)."""
    files = {inspect.getsourcefile(type(get_codec(name))), inspect.getsourcefile(aten_graphs)}
    files |= {str(pathlib.Path(__file__).with_name(f)) for f in TIMED_BY}
    digest = hashlib.sha256()
    for path in sorted(f for f in files if f):
        digest.update(pathlib.Path(path).read_bytes())
    return digest.hexdigest()[:12]


def graph_form(
    codec: Codec, dtype: torch.dtype, device_type: str, profile: DeviceProfile | None = None
) -> GraphForm:
    """The form ``codec`` takes for a value of ``dtype`` on ``device_type``
    under the plan's cost model ``profile`` (see the module docstring)."""
    choice = kernel_choice_from_env()
    if choice is KernelChoice.TRITON:
        return GraphForm.CUSTOM_OP
    if choice is KernelChoice.AUTO and device_type == "cuda" and triton_available():
        timings = _measured_timings("cuda")
        aten = timings.get(codec_key(codec.name, dtype))
        custom = timings.get(codec_key(codec.name, dtype, GraphForm.CUSTOM_OP))
        if aten is not None and custom is not None and custom < aten:
            return GraphForm.CUSTOM_OP
        measured = profile.measured_codec_form(codec.name) if profile is not None and aten is None else None
        if measured is not None and measured[0]:
            return GraphForm.CUSTOM_OP
    return GraphForm.ATEN


def _measured_timings(device: str) -> dict[str, float]:
    """Codec timings of the measured profile of ``device`` if this process
    loaded one (never measures)."""
    from .profile_cache import loaded_profile

    profile = loaded_profile(device)
    return dict(profile.codec_seconds_per_element) if profile is not None else {}
