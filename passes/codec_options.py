"""Which codecs the planner may offer for a value, and what they cost.

Reads: ``node.meta["adacc"]`` (annotate pass) of the value and its backward
readers. Used by the candidates pass through `make_compress_options`.

Accuracy modes (option ``accuracy``) cap the declared relative error of a
codec; the layer-specific choice then falls out of each codec's ``applies``
check (what it was built for) and the cap:

============  =================================  ===========================
mode          codecs allowed (declared error)     typical use
============  =================================  ===========================
lossless      bitmask (0)                        dropout / ReLU masks
balanced      + int8_outlier (0.015),            any float activation: linear
              int8_channel (0.015)               inputs, matmul outputs
aggressive    + fp8_e4m3 (0.03), fp8_e5m2        any float value in 8 bits,
              (0.06), int8_smooth (0.05),        linear inputs at ~a copy's cost,
              int4_outlier (0.16),               linear inputs at 4 bits,
              int4_channel (0.16),
              softmax_u8 (0.12),                 attention probabilities,
              fewbit_gelu/silu (0.12/0.10)       GELU/SiLU inputs
============  =================================  ===========================

The bounds are the codecs' own declarations, measured on Gaussian, LLM-like
outlier-channel and real-activation-like inputs (see bench/RESULTS.md); the
calibrate pass then measures each option on the model's real activations and
drops those over their bound. Balanced stops at 0.02: in the accuracy study
(bench/RESULTS.md, 3 seeds, 300 steps) plans using fp8_e4m3 (per-tensor
scale, ~0.027 measured) moved the final loss by up to 0.56%; with
int8_outlier (group scales plus outlier channels, ~0.006 measured) in their
place the worst seed moved 0.48%, inside the 0.5% target. int8_channel (one
scale per channel and block of 64 rows, ~0.006 measured) is the same
precision in a layout Inductor runs 2-3x faster, offered for the inputs of
linear layers (int8_outlier: any float activation); where both apply the
planner picks between them by cost, value by value. int8_smooth (one
scale per row after power-of-two channel factors from calibration) costs
about a copy inside a compiled graph, but heavy-tailed rows push its error
to 0.02-0.045, so it is declared 0.05 and offered in aggressive mode only.
softmax_u8 is offered for softmax outputs only, never log-softmax.

Cost: compress + decompress seconds (`codec_seconds`). With a calibrated
(measured) device profile, the codec's aten form compiled by Inductor is
timed on the current device the first time a plan offers it for a dtype,
and cached with the profile (`codec_timing`, `profile_cache`). With a
built-in GPU profile the cost is the bytes one fused kernel moves over
bandwidth, with no launches of its own.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.fx as fx

from adacc_compile.kernels import ApplyQuery, Codec, available_codecs, get_codec
from adacc_compile.kernels.aten_graphs import codec_graphs
from adacc_compile.kernels.oplib import triton_available

from . import profile_cache
from .annotate import annotation
from .codec_form import GraphForm, codec_key, graph_form
from .codec_timing import is_aligned, measure_seconds_per_element
from .device_profile import BUILTIN_PROFILES, DeviceProfile
from .fusion import Realization
from .lossy_uses import amplifying_use
from .memory_sim import graph_scratch_bytes
from .op_class import is_view_op
from .plan_problem import CompressOption
from .storage_order import in_storage_order, physical_order, storage_shape

ACCURACY_ERROR_CAP = {"lossless": 0.0, "balanced": 0.02, "aggressive": 0.2}
#: Lossy codecs are offered for values of at least this many elements. A
#: declared bound is a relative error measured on large tensors; a handful
#: of elements can all sit where the format is coarsest (a BatchNorm's 8
#: saved statistics near 2.6, just above a power of two: fp8_e5m2 gave
#: 6.1% against its declared 6%), and compressing them saves next to nothing.
MIN_LOSSY_ELEMENTS = 64


def allowed_codecs(accuracy: str, names: tuple[str, ...] | None) -> list[Codec]:
    """Codecs permitted by the accuracy mode (and the explicit list, if any)."""
    cap = ACCURACY_ERROR_CAP[accuracy]
    pool = available_codecs() if names is None else list(names)
    out = []
    for name in pool:
        codec = get_codec(name)
        if codec.lossless or codec.error_bound <= cap:
            out.append(codec)
    return out


def make_compress_options(
    codecs: list[Codec],
    profile: DeviceProfile,
    backward_nodes: frozenset[fx.Node],
    forward_needed: frozenset[fx.Node] | None = None,
    mode: Realization = Realization.INDUCTOR,
) -> Callable[[fx.Node], tuple[CompressOption, ...]]:
    """A callback for `find_candidates`: the legal codec options of a node.

    In eager ``mode`` each option carries its compress scratch
    (`compress_scratch_bytes`): the codec's aten form then runs op by op,
    and its temporaries raised a 3-layer GPT's simulated activation peak to
    2.1x what the memory model, which did not count them, gave its plan.

    With ``forward_needed`` (the nodes the forward outputs need), a value
    the forward computes for the backward alone (a GELU's derivative, a
    loss's probability gradient) is offered lossless codecs only. Why: the
    backward multiplies a gradient by it and sums the products, and a
    codec's error on such a factor does not bound the sum's: on a small
    MLP whose plan compressed the loss's factor with fp8 (declared 0.06),
    the head's bias gradient came out wrong by 100%. Compressing the
    activation it is computed from keeps the codec's bound. Likewise a
    value the backward reads in a cancelling term (an attention's output,
    a softmax's: `lossy_uses`)."""

    def options(node: fx.Node) -> tuple[CompressOption, ...]:
        val = node.meta.get("val")
        if not codecs or not isinstance(val, torch.Tensor) or not _static(val):
            return ()
        if physical_order(val) is None:
            return ()  # expanded / overlapping: its layout could not be restored
        # A permuted value is compressed in storage order and permuted back
        # (`storage_order`): the codec sees, and costs, that shape.
        readers = [u for u in node.users if u in backward_nodes]
        query = ApplyQuery(
            shape=storage_shape(val),
            dtype=val.dtype,
            producer_class=annotation(node).op_class.value,
            producer_target=str(node.target),
            consumer_classes=tuple(annotation(u).op_class.value for u in readers),
            consumer_targets=tuple(str(u.target) for u in readers),
        )
        derived = forward_needed is not None and node not in forward_needed and not is_view_op(node)
        small = val.numel() < MIN_LOSSY_ELEMENTS
        amplified = any(not c.lossless for c in codecs) and amplifying_use(node, backward_nodes) is not None
        out = []
        for codec in codecs:
            if (derived or small or amplified) and not codec.lossless:
                continue
            try:
                if not codec.applies(query):
                    continue
            except (TypeError, ValueError):
                continue
            nbytes = codec.compressed_nbytes(query.shape, query.dtype)
            if nbytes >= annotation(node).storage_bytes:
                continue
            seconds = codec_seconds(codec, query.shape, query.dtype, profile)
            if not math.isfinite(seconds):
                continue  # the codec failed on a sample of this dtype
            out.append(
                CompressOption(
                    codec=codec.name,
                    nbytes=nbytes,
                    seconds=seconds,
                    error=codec.error_bound,
                    feeds_recompute=codec.feeds_recompute,
                    compress_scratch=compress_scratch_bytes(codec, val) if mode is Realization.EAGER else 0,
                )
            )
        return tuple(out)

    return options


_SCRATCH: dict[tuple, int] = {}


def compress_scratch_bytes(codec: Codec, val: torch.Tensor) -> int:
    """Bytes ``codec``'s compress of a value like ``val`` allocates in eager
    mode beyond the value and its payload: the simulated peak of its traced
    aten form (`memory_sim.graph_scratch_bytes`), or the workspace the codec
    declares for its custom op where the plan inserts that form. The form
    without calibrated parameters: a calibrated compress of these codecs
    skips the statistics that the parameters replace."""
    form = graph_form(codec, val.dtype, val.device.type)
    key = (codec.name, form, tuple(val.shape), tuple(val.stride()), val.dtype, str(val.device))
    if key not in _SCRATCH:
        example = in_storage_order(val)
        shape = tuple(int(s) for s in example.shape)
        if form is GraphForm.CUSTOM_OP:
            _SCRATCH[key] = codec.compress_workspace_nbytes(shape, val.dtype, val.device.type)
        else:
            try:
                traced = codec_graphs(codec, example).compress
            except ValueError:  # not spliceable: the rewrite refuses it too
                traced = None
            _SCRATCH[key] = graph_scratch_bytes(traced, mode=Realization.EAGER) if traced is not None else 0
    return _SCRATCH[key]


def _static(val: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in val.shape)


def codec_seconds(codec: Codec, shape: tuple[int, ...], dtype: torch.dtype, profile: DeviceProfile) -> float:
    """Compress + decompress time of ``codec`` on ``shape``/``dtype``.

    Measured profiles: ``numel`` times the seconds per element measured for
    the codec's aten form compiled by Inductor on rows as aligned as
    ``shape``'s (`codec_timing.is_aligned`; on CUDA the
    faster of that and the custom ops, the form `codec_form.graph_form`
    then inserts), charged as its copies of the value at the profile's
    bandwidth (`codec_timing`), measured on first need and cached per
    machine (`profile_cache.codec_timing`). Built-in GPU profiles: the bytes one
    fused kernel moves, over bandwidth, with no launch of its own
    (`Codec.cost_seconds`), or, where the profile holds measured times for
    the codec in copies of the value (`DeviceProfile.codec_copy_times` and
    ``triton_codec_copy_times``: the H200's), at least the faster form's
    copies' worth (`codec_form.graph_form` inserts that form)."""
    numel = 1
    for s in shape:
        numel *= s
    if profile in BUILTIN_PROFILES.values() or not profile.name.startswith("calibrated"):
        fused = codec.cost_seconds(shape, dtype, profile.memory_bytes_per_s)
        measured = profile.measured_codec_form(codec.name)
        if measured is None:
            return fused
        copy = 2 * numel * dtype.itemsize / profile.memory_bytes_per_s
        return max(fused, measured[1] * copy)
    device = profile.name.removeprefix("calibrated ").strip() or "cpu"
    forms = [GraphForm.ATEN]
    if device.startswith("cuda") and triton_available():
        forms.append(GraphForm.CUSTOM_OP)
    aligned = is_aligned(shape)
    per_element = min(
        profile_cache.codec_timing(
            device,
            codec_key(codec.name, dtype, form, aligned=aligned),
            functools.partial(
                measure_seconds_per_element, codec.name, dtype, device, form, aligned=aligned,
                bandwidth=profile.memory_bytes_per_s,
            ),
        )
        for form in forms
    )
    return numel * per_element
