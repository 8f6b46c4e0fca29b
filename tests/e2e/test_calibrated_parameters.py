"""Calibrated codec parameters reach the compiled graph as constants.

A codec that takes parameters (`Codec.calibration_parameters`; int8_smooth's
channel factors) has them measured by the calibrate pass on the real batch
the backend compiles for; the compress rewrite then holds them as a buffer
of the forward graph, so the compress reads the value once. Without
calibration the compress measures them itself on every call (a channel
maximum and a sort of the maxima). On the calibration batch both give the
same factors, so both plans give the same gradients.
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from adacc_compile.kernels import get_codec
from adacc_test_utils import EAGER_REL, INDUCTOR_REL, assert_same, build, compile_with_reports, loss_and_grads

CODEC = "int8_smooth"
#: As in test_fused_codecs: lossy plans within twice the codec's bound.
GRADIENT_ERROR_MULTIPLE = 2.0


def _options(calibrate: bool) -> dict:
    return {
        "memory_budget": 0.3, "accuracy": "aggressive", "codecs": (CODEC,), "allow_recompute": False,
        "device_profile": "h100", "calibrate_codecs": calibrate,
    }  # fmt: skip


def _compressed_rows(partitioner) -> list[dict]:
    return [r for r in partitioner.reports[-1]["plan"] if r["decision"] == "compress"]


def _run(backend: str, calibrate: bool):
    model, batch = build("mlp")
    compiled, partitioner = compile_with_reports(model, backend, _options(calibrate))
    if backend == "adacc":
        result, codes = run_and_get_code(lambda: loss_and_grads(model, compiled, *batch))
    else:
        result, codes = loss_and_grads(model, compiled, *batch), []
    torch._dynamo.reset()
    return model, batch, result, codes, _compressed_rows(partitioner)


def test_calibrated_plan_reads_its_parameters_from_a_constant():
    model, batch, actual, codes, rows = _run("adacc", calibrate=True)
    assert rows and {r["codec"] for r in rows} == {CODEC}
    for row in rows:
        assert row["calibration"]["parameters_shape"] == [64]  # the MLP's hidden width: one factor per channel
    forward = codes[0]
    assert f"_{CODEC}_parameters" in forward
    assert "sort" not in forward, "a calibrated compress measures no channel statistics"
    expected = loss_and_grads(model, model, *batch)
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * get_codec(CODEC).error_bound + INDUCTOR_REL)


def test_uncalibrated_plan_measures_its_parameters_in_the_graph_and_agrees():
    """The negative control of the test above (the constant is missing and
    the sort is there), and the factors calibration measured are those the
    compress measures on the same batch: the gradients agree."""
    _, _, calibrated, _, _ = _run("adacc", calibrate=True)
    _, _, per_call, codes, rows = _run("adacc", calibrate=False)
    assert rows and {r["codec"] for r in rows} == {CODEC}
    assert f"_{CODEC}_parameters" not in codes[0]
    assert "sort" in codes[0]
    assert_same(calibrated, per_call, rel=INDUCTOR_REL)


def test_eager_backend_runs_the_constant():
    """adacc_eager interprets the forward graph: the buffer is read like
    any attribute, and gives the same codes as factors measured per call."""
    _, _, calibrated, _, rows = _run("adacc_eager", calibrate=True)
    assert rows and all("parameters_shape" in r["calibration"] for r in rows)
    _, _, per_call, _, _ = _run("adacc_eager", calibrate=False)
    assert_same(calibrated, per_call, rel=EAGER_REL)


@pytest.mark.parametrize("calibrate", [True, False])
def test_the_same_graph_gives_the_same_plan_and_calibration(calibrate):
    """Compiled twice, the plan and what calibration measured agree (the
    calibration forward draws from its own seed)."""
    first = _run("adacc_eager", calibrate)[4]
    second = _run("adacc_eager", calibrate)[4]
    assert first == second
