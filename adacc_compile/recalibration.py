"""Recalibration: a drift that new codec parameters fix, fixed without
recompiling.

Why: a codec that takes calibrated parameters (fp8's scale, int8_smooth's
channel factors: `Codec.calibration_parameters`) holds them as constants of
the compiled forward (`compress_rewrite`). When the activations move, the
stale parameters are often all that is wrong: an fp8 scale past its
headroom saturates the codes, while the same codec with a scale measured
on today's values is within its bound again. A full re-plan then costs one
recompile (40-92 s measured on a CPU for a 2-layer GPT-2) and decides the
same plan. Instead, the parameters are measured again on the current
call's inputs, the plan's compressed values are measured with them (value
and gradient error, as the monitor measures them), and, if every one is
within its bound, the new parameters are copied into the compiled graph's
constants in place. Anything else (a drift in a value whose codec takes no
parameters, a value still over its bound with fresh parameters) is left to
a full re-plan.

In place works because the compiled forward reads each constant from the
tensor the graph module holds: the eager backend runs the module itself,
and Inductor keeps tensor constants as references to the module's tensors,
except that it inlines 1-D constants of at most 8 elements into the
generated code, which the partitioner turns off when ``adapt`` is on
(``always_keep_tensor_constants``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile.kernels import get_codec
from adacc_compile.monitor import ActivationMonitor
from adacc_compile.passes.calibrate import run_forward
from adacc_compile.passes.drift import Drift, DriftRule, ValueObservation, failures
from adacc_compile.passes.storage_order import in_storage_order


@dataclass(frozen=True, slots=True, kw_only=True)
class Recalibration:
    """New parameters for a plan's compressed values, measured on one call."""

    parameters: dict[str, torch.Tensor] = field(default_factory=dict)
    """Value -> its new parameters (on the CPU, as calibration keeps them)."""
    observations: tuple[ValueObservation, ...] = ()
    """Every monitored value measured with the new parameters."""
    refused: str = ""
    """Why the drift needs a full re-plan instead ("" when it does not)."""


def live_parameters(fw_module: fx.GraphModule | None, monitor: ActivationMonitor) -> dict[str, torch.Tensor]:
    """Value -> the constant the compiled forward reads its parameters from
    (the buffer `compress_rewrite` registered), for every monitored value
    that has parameters."""
    out: dict[str, torch.Tensor] = {}
    if fw_module is None:
        return out
    for name in monitor.parameters:
        buffer = f"{name}_{monitor.references[name].codec}_parameters"
        try:
            out[name] = fw_module.get_buffer(buffer)
        except AttributeError:
            continue
    return out


def recalibrate(
    monitor: ActivationMonitor,
    live: dict[str, torch.Tensor],
    drifts: Sequence[Drift],
    real_inputs: Sequence[Any],
    rule: DriftRule,
) -> Recalibration:
    """Measures new parameters for every parameterised value on
    ``real_inputs`` and the whole plan with them; refuses where a drifted
    value has no parameters to swap, a constant cannot be reached, a
    drifted value still fails a drift test, or any value fails one far
    over its bound (`DriftRule.urgent`), and where compressed values the
    monitor does not watch hold parameters too (stand-ins,
    `ActivationMonitor.unwatched_parameters`: theirs would stay stale). A
    value that fails once without having drifted is left to the detector's
    hysteresis, as before."""
    if monitor.unwatched_parameters:
        return Recalibration(refused=(
            f"{len(monitor.unwatched_parameters)} compressed value(s) of blocks calibration did not measure "
            f"(e.g. {monitor.unwatched_parameters[0]}) hold parameters the monitor does not watch"
        ))
    fixed = [d for d in drifts if d.value not in live]
    if fixed:
        return Recalibration(refused=f"{fixed[0].value} ({fixed[0].codec}) has no calibrated parameters to swap")
    nodes = {n.name: n for n in monitor.forward}
    wanted = {nodes[name]: [monitor.references[name].codec] for name in live if name in nodes}
    fresh: dict[str, torch.Tensor] = {}

    def visit(node: fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            measured = get_codec(monitor.references[node.name].codec).calibration_parameters(in_storage_order(value))
            if measured is not None:
                fresh[node.name] = measured.detach().to("cpu").contiguous()

    run_forward(monitor.joint, monitor.primals, real_inputs, monitor.forward, wanted, visit)
    missing = [name for name in live if name not in fresh or fresh[name].shape != live[name].shape]
    if missing:
        return Recalibration(refused=f"no parameters of the compiled shape measured for {missing[0]}")
    observations = monitor.observe(real_inputs, parameters={**monitor.parameters, **fresh})
    drifted = {d.value for d in drifts}
    for obs in observations:
        failing = [
            f for f in failures(monitor.references[obs.value], obs, rule) if obs.value in drifted or rule.urgent(f)
        ]
        if failing:
            return Recalibration(refused=f"with new parameters still {failing[0].describe()}")
    return Recalibration(parameters=fresh, observations=tuple(observations))


def swap_in(recalibration: Recalibration, live: dict[str, torch.Tensor], monitor: ActivationMonitor) -> None:
    """Copies the new parameters into the compiled graph's constants and
    into the monitor, which measures with them from now on."""
    with torch.no_grad():
        for name, new in recalibration.parameters.items():
            live[name].copy_(new.to(live[name].device))
            monitor.parameters[name] = new
