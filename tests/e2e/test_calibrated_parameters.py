"""Calibrated codec parameters reach the compiled graph as constants.

A codec that takes parameters (`Codec.calibration_parameters`; int8_smooth's
channel factors) has them measured by the calibrate pass on the real batch
the backend compiles for; the compress rewrite then holds them as a buffer
of the forward graph, so the compress reads the value once. Without
calibration the compress measures them itself on every call (a channel
maximum and a sort of the maxima). On the calibration batch both give the
same factors, so both plans give the same gradients.

fp8's calibrated parameter is one scale for the whole value in place of a
scale per row (`kernels/fp8.py`): the calibrated compress takes no row
maxima, and its gradients agree with the per-row plan's within the codec's
bound, not bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from adacc_compile.kernels import get_codec
from adacc_test_utils import EAGER_REL, INDUCTOR_REL, assert_same, build, compile_with_reports, loss_and_grads

CODEC = "int8_smooth"
#: Codec -> (the shape of its parameters on the MLP, what only its per-call
#: statistics put into the forward's generated code: int8_smooth's sort of
#: the channel maxima, fp8's row maxima, a NaN-propagating max reduction).
CALIBRATED = {"int8_smooth": ([64], "sort"), "fp8_e5m2": ([1], "max_propagate_nan")}
#: As in test_fused_codecs: lossy plans within twice the codec's bound.
GRADIENT_ERROR_MULTIPLE = 2.0


def _options(calibrate: bool, codec: str = CODEC) -> dict:
    return {
        "memory_budget": 0.3, "accuracy": "aggressive", "codecs": (codec,), "allow_recompute": False,
        "device_profile": "h100", "calibrate_codecs": calibrate,
    }  # fmt: skip


def _compressed_rows(partitioner) -> list[dict]:
    return [r for r in partitioner.reports[-1]["plan"] if r["decision"] == "compress"]


def _run(backend: str, calibrate: bool, codec: str = CODEC):
    model, batch = build("mlp")
    compiled, partitioner = compile_with_reports(model, backend, _options(calibrate, codec))
    if backend == "adacc":
        result, codes = run_and_get_code(lambda: loss_and_grads(model, compiled, *batch))
    else:
        result, codes = loss_and_grads(model, compiled, *batch), []
    torch._dynamo.reset()
    return model, batch, result, codes, _compressed_rows(partitioner)


@pytest.mark.parametrize("codec", list(CALIBRATED))
def test_calibrated_plan_reads_its_parameters_from_a_constant(codec: str):
    model, batch, actual, codes, rows = _run("adacc", calibrate=True, codec=codec)
    shape, statistic = CALIBRATED[codec]
    assert rows and {r["codec"] for r in rows} == {codec}
    for row in rows:
        assert row["calibration"]["parameters_shape"] == shape  # int8_smooth: one factor per channel of the MLP
    forward = codes[0]
    if shape != [1]:  # a one-element constant Inductor folds into the kernel as a literal
        assert f"_{codec}_parameters" in forward
    assert statistic not in forward, "a calibrated compress measures no statistics of the value"
    expected = loss_and_grads(model, model, *batch)
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * get_codec(codec).error_bound + INDUCTOR_REL)


def test_an_uncalibrated_fp8_plan_scales_each_row_in_the_graph():
    """fp8's negative control: without calibration the forward takes each
    row's maximum (the statistic the constant replaces), and the gradients
    agree with the calibrated plan's within the codec's bound."""
    _, _, calibrated, _, _ = _run("adacc", calibrate=True, codec="fp8_e5m2")
    _, _, per_row, codes, rows = _run("adacc", calibrate=False, codec="fp8_e5m2")
    assert rows and {r["codec"] for r in rows} == {"fp8_e5m2"}
    assert CALIBRATED["fp8_e5m2"][1] in codes[0]
    assert_same(calibrated, per_row, rel=GRADIENT_ERROR_MULTIPLE * get_codec("fp8_e5m2").error_bound + INDUCTOR_REL)


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
