"""The activation monitor: the statistics of a plan's compressed values,
measured again on a later step of training.

Why a sampled side path rather than statistics written by the compress
kernels themselves: the round-trip error needs the full-precision value and
its decompressed twin side by side, which the compiled forward never holds
(compress frees the value; decompress runs in the backward). A side path
can be exact about it and costs nothing on the steps it does not run. Every
`AdaccConfig.adapt_every`-th call, the monitor runs the planned joint
graph's forward (no grad, RNG state restored, only the nodes the compressed
values depend on, each intermediate freed after its last use:
`calibrate.run_forward`) on that call's real inputs, and measures every
lossy compressed value with the same `Codec.calibrate` on the same row
sample that planning used, so the numbers compare one to one with the
plan's calibration (`drift.ValueReference`), and the error each value's
round trip causes in the backward ops that read it, as calibration measures
it (`gradient_sensitivity`): a drift can leave a value's own error where it
was and still make the backward amplify it. The results are read on the
host once per check; the measured overhead is in bench/results/adaptive.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.kernels import get_codec
from adacc_compile.passes.calibrate import Calibration, row_sample, run_forward
from adacc_compile.passes.gradient_sensitivity import gradient_errors
from adacc_compile.passes.drift import ValueObservation, ValueReference
from adacc_compile.passes.plan_problem import Decision, PlanSolution
from adacc_compile.passes.storage_order import in_storage_order
from adacc_compile.state import PartitionState


def plan_references(solution: PlanSolution, calibration: Calibration | None) -> dict[str, ValueReference]:
    """One reference per lossy compressed value that calibration measured
    (lossless codecs cannot drift; unmeasured values, stand-ins among them,
    have nothing to compare with)."""
    out: dict[str, ValueReference] = {}
    if calibration is None or not calibration.used:
        return out
    for name, choice in solution.choices.items():
        if choice.decision is not Decision.COMPRESS or choice.codec is None:
            continue
        codec = get_codec(choice.codec)
        measured = calibration.options.get(name, {}).get(choice.codec)
        if codec.lossless or measured is None or measured.stats is None or measured.inherited_from:
            continue  # a stand-in's statistics are another block's (`calibration_sample`)
        stats = measured.stats
        slots = stats.extra.get("outlier_slots")
        out[name] = ValueReference(
            value=name,
            codec=choice.codec,
            bound=codec.error_bound,
            error=stats.relative_error,
            abs_max=stats.abs_max,
            outlier_channels=tuple(stats.outlier_channels),
            outlier_slots=int(slots) if slots is not None and math.isfinite(slots) else None,
        )
    return out


@dataclass(slots=True)
class ActivationMonitor:
    """Measures the compressed values of one planned graph on real inputs."""

    joint: fx.GraphModule
    info: compat.JointGraphInfo
    primals: list[fx.Node]
    forward: list[fx.Node]
    references: dict[str, ValueReference]
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)
    """Value -> the calibrated parameters its compiled compress holds
    (`Calibration.codec_parameters`): the monitor measures the error with
    them, not with parameters measured afresh on the new batch, so factors
    that no longer fit the activations show up as drift."""
    unwatched_parameters: tuple[str, ...] = ()
    """Compressed values whose compiled compress holds parameters but which
    the monitor does not watch: stand-ins of blocks calibration did not
    measure (`calibration_sample`). Swapping only the watched values'
    parameters would leave theirs stale, so a recalibration is refused
    where there are any (`recalibration`): a full re-plan measures them."""

    @staticmethod
    def from_state(state: PartitionState) -> "ActivationMonitor | None":
        """None when there is nothing to watch or no way to run it (no
        calibration, which refuses forwards that mutate or communicate)."""
        if state.solution is None or state.info is None:
            return None
        references = plan_references(state.solution, state.calibration)
        if not references:
            return None
        gm = state.joint
        primals = [n for n in gm.graph.nodes if n.op == "placeholder" and compat.is_primal(n)]
        forward = [n for n in gm.graph.nodes if n in state.info.forward_nodes and n.op != "placeholder"]
        measured = state.calibration.codec_parameters() if state.calibration is not None else {}
        parameters = {
            name: measured[(name, ref.codec)] for name, ref in references.items() if (name, ref.codec) in measured
        }
        compressed = {name: choice.codec for name, choice in state.solution.choices.items()
                      if choice.decision is Decision.COMPRESS}
        unwatched = tuple(sorted(
            name for name, codec in compressed.items() if name not in references and (name, codec) in measured
        ))
        return ActivationMonitor(
            joint=gm, info=state.info, primals=primals, forward=forward, references=references, parameters=parameters,
            unwatched_parameters=unwatched,
        )

    def observe(
        self, real_inputs: Sequence[Any], parameters: dict[str, torch.Tensor] | None = None
    ) -> list[ValueObservation]:
        """Every watched value measured on ``real_inputs``, with the plan's
        parameters or with ``parameters`` (value -> parameters) in their
        place (`recalibration` tries new ones this way)."""
        parameters = self.parameters if parameters is None else parameters
        nodes = {n.name: n for n in self.forward}
        wanted = {nodes[name]: [ref.codec] for name, ref in self.references.items() if name in nodes}
        out: list[ValueObservation] = []

        def visit(node: fx.Node, value: Any) -> None:
            if not isinstance(value, torch.Tensor):
                return
            ref = self.references[node.name]
            codec, measured = get_codec(ref.codec), parameters.get(node.name)
            sample = row_sample(in_storage_order(value))  # as compressed (`storage_order`)
            stats = codec.calibrate([sample]) if measured is None else codec.calibrate([sample], measured)
            out.append(ValueObservation(
                value=node.name, codec=ref.codec, error=stats.relative_error,
                abs_max=stats.abs_max, outlier_channels=tuple(stats.outlier_channels),
            ))

        run_forward(self.joint, self.primals, real_inputs, self.forward, wanted, visit)
        gradients = gradient_errors(
            self.joint, self.info, {node: codecs for node, codecs in wanted.items()}, real_inputs,
            {(name, self.references[name].codec): p for name, p in parameters.items()},
        )
        return [
            dataclasses.replace(obs, gradient_error=gradients[(obs.value, obs.codec)].error)
            if (obs.value, obs.codec) in gradients else obs
            for obs in out
        ]
