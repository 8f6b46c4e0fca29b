"""The activation monitor measures a compressed value as its compiled
compress runs it: with the calibrated parameters the plan holds, not with
parameters measured afresh on the new batch (stale channel factors would
never show up as drift otherwise)."""

from __future__ import annotations

import torch
import torch.fx as fx

from adacc_compile import compat
from adacc_compile.kernels import get_codec
from adacc_compile.monitor import ActivationMonitor
from adacc_compile.passes.drift import ValueObservation, ValueReference

VALUE = "relu"


def _relu_graph() -> tuple[fx.GraphModule, compat.JointGraphInfo, fx.Node, fx.Node]:
    """relu forward, and a backward that reads the relu's output."""
    graph = fx.Graph()
    x = graph.placeholder("primals_1")
    x.meta["val"] = torch.empty(512, 64)
    tangent = graph.placeholder("tangents_1")
    tangent.meta["val"] = torch.empty(512, 64)
    relu = graph.call_function(torch.ops.aten.relu.default, (x,), name=VALUE)
    grad = graph.call_function(torch.ops.aten.mul.Tensor, (tangent, relu))
    graph.output((relu, grad))
    info = compat.JointGraphInfo(
        forward_nodes=frozenset({x, relu}), backward_nodes=frozenset({tangent, grad}),
        static_lifetime_input_nodes=(),
    )
    return fx.GraphModule(torch.nn.Module(), graph), info, x, relu


def _observation(batch: torch.Tensor, parameters: dict[str, torch.Tensor]) -> ValueObservation:
    gm, info, primal, relu = _relu_graph()
    reference = ValueReference(value=relu.name, codec="int8_smooth", bound=0.05, error=0.0, abs_max=0.0)
    monitor = ActivationMonitor(
        joint=gm, info=info, primals=[primal], forward=[relu], references={relu.name: reference},
        parameters=parameters,
    )
    (observation,) = monitor.observe([batch])
    return observation


def _observed_error(batch: torch.Tensor, parameters: dict[str, torch.Tensor]) -> float:
    return _observation(batch, parameters).error


def test_monitor_measures_with_the_plans_parameters():
    gen = torch.Generator().manual_seed(0)
    calibration_batch = torch.randn(512, 64, generator=gen).abs()
    calibration_batch[:, 7] *= 100.0  # an outlier channel at calibration: factor 2^5
    stale = get_codec("int8_smooth").calibration_parameters(calibration_batch)
    assert stale[7] == 32.0
    later = torch.randn(512, 64, generator=gen).abs()  # the outlier channel is gone
    fresh_error = _observed_error(later, {})
    stale_error = _observed_error(later, {VALUE: stale})
    # Channel 7, still divided by 32, now gets 1/32 of its resolution.
    assert stale_error > 2 * fresh_error, (stale_error, fresh_error)
    assert _observed_error(later, {VALUE: get_codec("int8_smooth").calibration_parameters(later)}) == fresh_error


def test_monitor_measures_the_error_in_the_backward_that_reads_the_value():
    """The backward here multiplies the upstream gradient by the value
    elementwise, so the gradient's relative error is close to the value's
    (not identical: the upstream gradient is noise and weights the
    elements differently)."""
    batch = torch.randn(512, 64, generator=torch.Generator().manual_seed(0)).abs()
    observation = _observation(batch, {})
    assert observation.gradient_error is not None
    assert 0 < observation.gradient_error < 2 * observation.error
    assert observation.gradient_error > 0.5 * observation.error
