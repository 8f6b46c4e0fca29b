"""Calibrate pass: codec statistics from real activations.

Reads: the joint graph, its forward nodes, the candidates with their compress
options, and real values for the primal inputs (the batch and parameters the
backend is compiling for: Dynamo hands real tensors to the backend, while the
partitioner itself only ever sees fake ones). Writes nothing on the graph;
returns a `Calibration` and, through `calibrated_candidates`, a problem whose
compress options carry the error *measured* on this model's activations.

Why: a codec's declared ``error_bound`` comes from synthetic and
activation-like test inputs. A real model can hold values the codec handles
worse (heavier outliers, a skew that wastes half of a symmetric range, a
softmax that is not peaked). The forward is run once on the real inputs;
every lossy option of every candidate is round-tripped on its real value
(`Codec.calibrate`, on up to `SAMPLE_ELEMENTS` elements of whole rows; in a
class of identical blocks, in three of them, the others taking their
verdicts: `calibration_sample`); an
option whose measured error exceeds the codec's declared bound, or whose
statistics the codec refuses (`Codec.calibration_refusal`: few-bit codes of
inputs far below unit std), is dropped before the MILP sees it, and the
statistics (error, SQNR, abs max, outlier channels) go into the plan and
``plan.json``.
A codec that takes parameters (`Codec.calibration_parameters`: int8_smooth's
channel factors) has them measured here on the whole value, and its error
measured with them; the compress rewrite puts them into the compiled graph
as constants (`Calibration.codec_parameters`).

When there are no real inputs (planning under fake tensors, e.g. the
LLM-scale benchmark), or the inputs do not line up with the graph's primals,
or the forward mutates something or communicates, the declared bounds are
used unchanged and the summary says why. With more than one rank, rank 0
alone calibrates and every rank plans with its measurements
(`adacc_compile.rank_zero`), so plans agree.

The run does not change training: it is under ``no_grad``, on the real
inputs without mutating them, with the RNG state saved and restored, and
each intermediate is freed after its last forward use. Its random ops
(dropout) draw from a fixed seed (`SEED`), not from the training's RNG
state at compile time, so the measured errors, and the plan, are the same
in every process: a GPT compiled after other models in one process once
measured a different dropout mask, kept another codec option near its
bound, and planned differently (bench/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.kernels import CodecStats, get_codec

from .annotate import META_KEY
from .calibration_sample import calibration_sample, uniform_verdicts
from .candidates import CandidateSet
from .gradient_sensitivity import GradientError, gradient_errors
from .graph_walk import ancestors, get_attr, seeded_real_run
from .op_class import OpClass
from .storage_order import in_storage_order

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class OptionCalibration:
    """One codec measured on one candidate's real value."""

    value: str
    codec: str
    stats: CodecStats | None
    """None when the codec failed on the value."""
    declared_bound: float
    accepted: bool
    reason: str = ""
    parameters: torch.Tensor | None = None
    """What `Codec.calibration_parameters` measured on the whole value (on
    the CPU: it travels between ranks pickled), for codecs that take
    parameters; the compiled graph holds it as a constant."""
    gradient: GradientError | None = None
    """The worst error the round trip caused in a backward op reading the
    value (`gradient_sensitivity`); None where none was measured."""
    inherited_from: str = ""
    """For a value of a block calibration did not measure (`calibration_sample`):
    the measured value at its position whose verdict, statistics and
    gradient error it takes (its parameters are its own)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"codec": self.codec, "accepted": self.accepted, "declared_bound": self.declared_bound}
        if self.reason:
            out["reason"] = self.reason
        if self.parameters is not None:
            out["parameters_shape"] = list(self.parameters.shape)
        if self.inherited_from:
            out["inherited_from"] = self.inherited_from
        if self.gradient is not None:
            out["gradient_error"] = _finite_or_str(self.gradient.error)
            out["gradient_reader"] = f"{self.gradient.reader} ({self.gradient.op})"
        if self.stats is not None:
            out["relative_error"] = _finite_or_str(self.stats.relative_error)
            out["abs_max"] = _finite_or_str(self.stats.abs_max)
            out["outlier_channels"] = list(self.stats.outlier_channels)
            out["outlier_fraction"] = self.stats.outlier_fraction
            out.update({k: _finite_or_str(v) for k, v in self.stats.extra.items()})
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    used: bool
    reason: str
    """Why calibration did not run (empty when it did)."""
    options: dict[str, dict[str, OptionCalibration]] = field(default_factory=dict)
    """Candidate name -> codec -> measurement."""
    seconds: float = 0.0
    stand_ins: int = 0
    """Values whose verdicts were taken from identical blocks' (`calibration_sample`)."""

    @property
    def rejected(self) -> list[OptionCalibration]:
        return [o for per in self.options.values() for o in per.values() if not o.accepted]

    def codec_parameters(self) -> dict[tuple[str, str], torch.Tensor]:
        """(value, codec) -> the parameters measured for that option, for
        every accepted option of a codec that takes parameters."""
        return {
            (value, codec): o.parameters
            for value, per in self.options.items()
            for codec, o in per.items()
            if o.accepted and o.parameters is not None
        }

    def summary(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "reason": self.reason,
            "values": len(self.options),
            "stand_ins": self.stand_ins,
            "options_measured": sum(len(v) for v in self.options.values()),
            "rejected": [f"{o.value}:{o.codec}" for o in self.rejected],
            "seconds": self.seconds,
        }


def not_calibrated(reason: str) -> Calibration:
    return Calibration(used=False, reason=reason)


def calibrate_candidates(
    gm: fx.GraphModule,
    info: compat.JointGraphInfo,
    candidates: CandidateSet,
    real_inputs: Sequence[Any] | None,
) -> Calibration:
    """Measures every lossy compress option on the real forward values."""
    lossy = lossy_options(candidates)
    if not lossy:
        return not_calibrated("no lossy codec options")
    if real_inputs is None:
        return not_calibrated("no real inputs (planned under fake tensors)")
    primals = [n for n in gm.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
    mismatch = _input_mismatch(primals, real_inputs)
    if mismatch:
        return not_calibrated(mismatch)
    forward = [n for n in gm.graph.nodes if n in info.forward_nodes and n.op != "placeholder"]
    mutating = next((n for n in forward if compat.is_mutating(n)), None)
    if mutating is not None:
        return not_calibrated(f"the forward mutates state ({mutating.target})")
    collective = next(
        (n for n in forward if getattr(n.meta.get(META_KEY), "op_class", None) is OpClass.COLLECTIVE), None
    )
    if collective is not None:
        return not_calibrated(f"the forward holds a collective ({collective.target})")
    start = time.perf_counter()
    sample = calibration_sample(candidates.problem, candidates.nodes)
    wanted = {candidates.nodes[name]: codecs for name, codecs in lossy.items()}
    results: dict[str, dict[str, OptionCalibration]] = {}

    def visit(node: fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            measure = _parameters_only if node.name in sample.stand_ins else _measure
            results[node.name] = {codec: measure(node.name, codec, value) for codec in wanted[node]}

    try:
        run_forward(gm, primals, real_inputs, forward, wanted, visit)
    except Exception as exc:  # noqa: BLE001 - any failure falls back to the declared bounds
        log.warning("adacc: codec calibration failed (%s: %s); using declared codec bounds", type(exc).__name__, exc)
        return not_calibrated(f"forward failed: {type(exc).__name__}: {exc}")
    calibration = Calibration(used=True, reason="", options=results, seconds=time.perf_counter() - start)
    checked = with_gradient_errors(gm, info, candidates, calibration, real_inputs, skip=frozenset(sample.stand_ins))
    return dataclasses.replace(
        checked, options=uniform_verdicts(checked.options, sample),
        stand_ins=len(sample.stand_ins.keys() & results.keys()),
        seconds=time.perf_counter() - start,
    )


def with_gradient_errors(
    gm: fx.GraphModule,
    info: compat.JointGraphInfo,
    candidates: CandidateSet,
    calibration: Calibration,
    real_inputs: Sequence[Any],
    skip: frozenset[str] = frozenset(),
) -> Calibration:
    """``calibration`` with each accepted option's gradient error measured
    (`gradient_sensitivity`) and the options whose gradient error exceeds
    the codec's declared bound dropped: the bound a mode promises is on
    the training, not only on the stored value. Options no backward op
    reads measurably keep their value's verdict, as do the values in
    ``skip`` (stand-ins, `calibration_sample`). A failure of the run keeps
    the value verdicts, with a warning."""
    accepted = {
        candidates.nodes[value]: [codec for codec, o in per.items() if o.accepted]
        for value, per in calibration.options.items() if value not in skip
    }
    accepted = {node: codecs for node, codecs in accepted.items() if codecs}
    if not accepted:
        return calibration
    try:
        errors = gradient_errors(gm, info, accepted, real_inputs, calibration.codec_parameters())
    except Exception as exc:  # noqa: BLE001 - the value verdicts stand
        log.warning("adacc: gradient check of the codec options failed (%s: %s); value errors alone decide",
                    type(exc).__name__, exc)
        return calibration
    options = {}
    for value, per in calibration.options.items():
        options[value] = {}
        for codec, o in per.items():
            measured = errors.get((value, codec))
            if measured is not None:
                over = not measured.error <= o.declared_bound
                o = dataclasses.replace(
                    o, gradient=measured, accepted=o.accepted and not over,
                    reason=o.reason if not over or not o.accepted else (
                        f"gradient error {measured.error:.4g} in {measured.reader} ({measured.op}) "
                        f"> declared bound {o.declared_bound}"
                    ),
                )
            options[value][codec] = o
    return dataclasses.replace(calibration, options=options)


def lossy_options(candidates: CandidateSet) -> dict[str, list[str]]:
    """Candidate -> its lossy codec options (what calibration measures)."""
    lossy = {
        c.name: [o.codec for o in c.compress if not get_codec(o.codec).lossless]
        for c in candidates.problem.candidates
    }
    return {name: codecs for name, codecs in lossy.items() if codecs}


def calibrated_candidates(candidates: CandidateSet, calibration: Calibration) -> CandidateSet:
    """The candidates with rejected options removed and measured errors set."""
    if not calibration.used:
        return candidates
    new = []
    for cand in candidates.problem.candidates:
        measured = calibration.options.get(cand.name, {})
        options = []
        for option in cand.compress:
            m = measured.get(option.codec)
            if m is None:
                options.append(option)
            elif m.accepted and m.stats is not None:
                options.append(dataclasses.replace(option, error=m.stats.relative_error))
        new.append(dataclasses.replace(cand, compress=tuple(options)))
    problem = dataclasses.replace(candidates.problem, candidates=tuple(new))
    return CandidateSet(problem=problem, nodes=candidates.nodes)


#: Each value is measured on at most this many elements (whole rows of its
#: last dim, from the start): on CPU the torch-reference codecs would
#: otherwise make calibration cost more than planning. Measured on a GPT
#: (d256, seq 256, batch 4, memory_budget 0.5, see bench/RESULTS.md):
#: balanced 0.75 s for 77 options, aggressive 1.6 s for 257 options.
SAMPLE_ELEMENTS = 1 << 16

SEED = 0
"""Seed of the calibration forward's random ops (see the module docstring)."""


def row_sample(x: torch.Tensor, max_elements: int = SAMPLE_ELEMENTS) -> torch.Tensor:
    """Whole rows of ``x`` (last dim = channels) up to ``max_elements``,
    evenly spaced over the whole value (first and last row included), so
    that a drift in any part of a batch (later sequence positions, a later
    sample) is seen; at least one row; ``x`` itself when small enough.
    The same rows every time: plans repeat across processes."""
    if x.numel() <= max_elements or x.dim() < 2:
        return x
    flat = x.reshape(-1, x.shape[-1])
    rows = max(1, max_elements // max(1, x.shape[-1]))
    if rows == 1:
        return flat[:1]
    index = torch.linspace(0, flat.shape[0] - 1, rows, device=x.device).round().long()
    return flat[index]


def _measure(value: str, codec_name: str, x: torch.Tensor) -> OptionCalibration:
    """One option on one real value. A codec that takes parameters has them
    measured on the whole value and its error measured with them, as the
    compiled graph will run it, on the value in storage order (as the
    compiled graph compresses it, `storage_order`)."""
    codec = get_codec(codec_name)
    x = in_storage_order(x)
    try:
        parameters = _parameters(codec, x)
        stats = codec.calibrate([row_sample(x)]) if parameters is None else codec.calibrate([row_sample(x)], parameters)
    except Exception as exc:  # noqa: BLE001 - a codec that fails here is simply not offered
        return _failed(value, codec_name, exc)
    error = stats.relative_error
    refusal = codec.calibration_refusal(stats)
    accepted = math.isfinite(error) and error <= codec.error_bound and refusal is None
    reason = "" if accepted else refusal or f"measured error {error:.4g} > declared bound {codec.error_bound}"
    return OptionCalibration(
        value=value, codec=codec_name, stats=stats, declared_bound=codec.error_bound,
        accepted=accepted, reason=reason, parameters=parameters,
    )


def _parameters_only(value: str, codec_name: str, x: torch.Tensor) -> OptionCalibration:
    """A stand-in's option (`calibration_sample`): its codec's parameters
    measured on its own value, nothing else (its verdict comes from the
    measured blocks)."""
    codec = get_codec(codec_name)
    try:
        parameters = _parameters(codec, in_storage_order(x))
    except Exception as exc:  # noqa: BLE001 - as in _measure: the option is not offered
        return _failed(value, codec_name, exc)
    return OptionCalibration(
        value=value, codec=codec_name, stats=None, declared_bound=codec.error_bound, accepted=True,
        parameters=parameters,
    )


def _parameters(codec: Any, x: torch.Tensor) -> torch.Tensor | None:
    """The codec's parameters measured on ``x`` (in storage order), on the
    CPU (they travel between ranks pickled); None for a codec that takes none."""
    parameters = codec.calibration_parameters(x)
    return None if parameters is None else parameters.detach().to("cpu").contiguous()


def _failed(value: str, codec_name: str, exc: Exception) -> OptionCalibration:
    """An option whose codec failed on the value: not offered."""
    return OptionCalibration(
        value=value, codec=codec_name, stats=None, declared_bound=get_codec(codec_name).error_bound,
        accepted=False, reason=f"{type(exc).__name__}: {exc}",
    )


def _input_mismatch(primals: list[fx.Node], real_inputs: Sequence[Any]) -> str:
    if len(primals) != len(real_inputs):
        return f"{len(real_inputs)} real inputs for {len(primals)} graph inputs"
    for node, real in zip(primals, real_inputs):
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            return f"input {node.name} is not a tensor (symbolic shapes are not calibrated)"
        if not isinstance(real, torch.Tensor) or compat.is_fake(real):
            return f"input {node.name} has no real value"
        if any(not isinstance(s, int) for s in fake.shape):
            return f"input {node.name} has a symbolic shape"
        if tuple(fake.shape) != tuple(real.shape) or fake.dtype != real.dtype:
            return f"input {node.name}: graph expects {tuple(fake.shape)} {fake.dtype}, got {tuple(real.shape)} {real.dtype}"
    return ""


def run_forward(
    gm: fx.GraphModule,
    primals: list[fx.Node],
    real_inputs: Sequence[Any],
    forward: list[fx.Node],
    wanted: dict[fx.Node, list[str]],
    visit: Any,
) -> None:
    """Runs the forward nodes that the wanted values depend on, in graph
    order, calling ``visit(node, value)`` for each wanted one; a value is
    dropped after its last use in this run."""
    needed = ancestors(wanted)
    order = [n for n in forward if n in needed]
    last_use: dict[fx.Node, int] = {}
    for i, node in enumerate(order):
        for arg in node.all_input_nodes:
            last_use[arg] = i
    env: dict[fx.Node, Any] = {}
    inputs = set(primals)
    with seeded_real_run(real_inputs, SEED):
        for node, real in zip(primals, real_inputs):
            env[node] = real.detach()
        for i, node in enumerate(order):
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            if node.op == "call_function":
                env[node] = node.target(*args, **kwargs)
            elif node.op == "get_attr":
                env[node] = get_attr(gm, str(node.target))
            else:
                raise RuntimeError(f"unexpected {node.op} node {node.name} in the forward")
            if node in wanted:
                visit(node, env[node])
            for arg in node.all_input_nodes:
                if last_use.get(arg) == i and arg not in inputs:
                    env.pop(arg, None)
            if node not in last_use:
                env.pop(node, None)


def _finite_or_str(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)
