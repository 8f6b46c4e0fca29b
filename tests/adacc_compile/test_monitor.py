"""The activation monitor measures a compressed value as its compiled
compress runs it: with the calibrated parameters the plan holds, not with
parameters measured afresh on the new batch (stale channel factors would
never show up as drift otherwise)."""

from __future__ import annotations

import torch
import torch.fx as fx

from adacc_compile.kernels import get_codec
from adacc_compile.monitor import ActivationMonitor
from adacc_compile.passes.drift import ValueReference

VALUE = "relu"


def _relu_graph() -> tuple[fx.GraphModule, fx.Node, fx.Node]:
    graph = fx.Graph()
    x = graph.placeholder("primals_1")
    x.meta["val"] = torch.empty(512, 64)
    relu = graph.call_function(torch.ops.aten.relu.default, (x,), name=VALUE)
    graph.output((relu,))
    return fx.GraphModule(torch.nn.Module(), graph), x, relu


def _observed_error(batch: torch.Tensor, parameters: dict[str, torch.Tensor]) -> float:
    gm, primal, relu = _relu_graph()
    reference = ValueReference(value=relu.name, codec="int8_smooth", bound=0.05, error=0.0, abs_max=0.0)
    monitor = ActivationMonitor(
        joint=gm, primals=[primal], forward=[relu], references={relu.name: reference}, parameters=parameters
    )
    (observation,) = monitor.observe([batch])
    return observation.error


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
