"""Calibration measures a few blocks of each class of identical blocks
(`passes.calibration_sample`): the others take the verdicts of their
position, and a position's verdict is the same in every block.

The unit tests build measurements by hand; the end-to-end one plans a
5-layer GPT under ``accuracy="balanced"`` on real inputs."""

from __future__ import annotations

import dataclasses

import torch

from adacc_compile.kernels.codec import CodecStats
from adacc_compile.passes.calibrate import OptionCalibration
from adacc_compile.passes.calibration_sample import CalibrationSample, uniform_verdicts
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import compile_with_reports, loss_and_grads, worst_relative_error


def _measured(value, error, accepted=True, parameters=None):
    return OptionCalibration(
        value=value, codec="int8", stats=CodecStats(codec="int8", relative_error=error), declared_bound=0.02,
        accepted=accepted, reason="" if accepted else "over", parameters=parameters,
    )


def _own(value, parameters):
    return OptionCalibration(value=value, codec="int8", stats=None, declared_bound=0.02, accepted=True,
                             parameters=parameters)


# Blocks 0, 2 and 4 measured; blocks 1 and 3 stand in.
SAMPLE = CalibrationSample(
    stand_ins={"a1": ("a0", "a2", "a4"), "a3": ("a0", "a2", "a4")},
    positions=(("a0", "a2", "a4", "a1", "a3"),),
)


def test_a_stand_in_takes_the_worst_measured_verdict_and_keeps_its_own_parameters():
    own = torch.ones(3)
    options = {
        "a0": {"int8": _measured("a0", 0.004)}, "a2": {"int8": _measured("a2", 0.011)},
        "a4": {"int8": _measured("a4", 0.007)}, "a1": {"int8": _own("a1", own)}, "a3": {"int8": _own("a3", None)},
    }
    out = uniform_verdicts(options, SAMPLE)
    a1 = out["a1"]["int8"]
    assert a1.accepted and a1.inherited_from == "a2" and a1.stats.relative_error == 0.011
    assert a1.parameters is own and a1.value == "a1"
    assert out["a3"]["int8"].parameters is None
    assert out["a0"]["int8"].inherited_from == "" and out["a0"]["int8"].stats.relative_error == 0.004


def test_a_rejection_in_one_measured_block_rejects_the_position_in_every_block():
    options = {
        "a0": {"int8": _measured("a0", 0.004)}, "a2": {"int8": _measured("a2", 0.05, accepted=False)},
        "a4": {"int8": _measured("a4", 0.007)}, "a1": {"int8": _own("a1", None)}, "a3": {"int8": _own("a3", None)},
    }
    out = uniform_verdicts(options, SAMPLE)
    assert [out[v]["int8"].accepted for v in ("a0", "a1", "a2", "a3", "a4")] == [False] * 5
    assert "a2" in out["a0"]["int8"].reason


def test_a_stand_in_whose_parameters_failed_is_not_offered():
    failed = OptionCalibration(value="a1", codec="int8", stats=None, declared_bound=0.02, accepted=False,
                               reason="RuntimeError: boom")
    options = {
        "a0": {"int8": _measured("a0", 0.004)}, "a2": {"int8": _measured("a2", 0.005)},
        "a4": {"int8": _measured("a4", 0.006)}, "a1": {"int8": failed}, "a3": {"int8": _own("a3", None)},
    }
    out = uniform_verdicts(options, SAMPLE)
    assert not out["a1"]["int8"].accepted and "boom" in out["a1"]["int8"].reason
    assert out["a3"]["int8"].accepted


def test_five_identical_blocks_measure_three_and_plan_as_one_class():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=5, d_model=32, n_head=4, seq_len=16, vocab_size=64)
    model = init_weights(GPT(cfg))
    batch = gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
    expected = loss_and_grads(model, model, *batch)
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.3, "accuracy": "balanced", "device_profile": "h100"})
    got = loss_and_grads(model, compiled, *batch)
    (report,) = partitioner.reports
    summary = report["summary"]
    calibration = summary["calibration"]
    assert calibration["used"] and calibration["stand_ins"] > 0
    # Two of five blocks stand in: about two fifths of the block values.
    assert 0.25 * calibration["values"] <= calibration["stand_ins"] <= 0.45 * calibration["values"], calibration
    assert summary["block_reuse"]["used"] and summary["block_reuse"]["blocks"] == 5, summary["block_reuse"]
    lossy = [r for r in report["plan"] if r["decision"] == "compress" and r["calibration"] is not None]
    assert lossy, "balanced at 0.3 compresses with lossy codecs here"
    # The two middle-but-one blocks (1 and 3) stand in; the others were measured.
    assert all(bool(r["calibration"].get("inherited_from")) == (r["layer"] in ("blocks.1", "blocks.3")) for r in lossy), [
        (r["name"], r["layer"], r["calibration"].get("inherited_from")) for r in lossy]
    assert worst_relative_error(expected, got)[0] <= 0.02


def test_a_stand_in_holding_parameters_makes_a_recalibration_a_full_replan():
    """The monitor watches measured values only; a recalibration that swapped
    their parameters would leave a stand-in's stale, so it is refused."""
    from types import SimpleNamespace

    import torch.fx as fx

    from adacc_compile.monitor import ActivationMonitor
    from adacc_compile.passes.calibrate import Calibration
    from adacc_compile.passes.drift import DriftRule
    from adacc_compile.passes.plan_problem import Choice, Decision, PlanSolution
    from adacc_compile.recalibration import recalibrate

    measured = dataclasses.replace(_measured("a", 0.004, parameters=torch.zeros(2)), codec="int8_outlier")
    inherited = dataclasses.replace(measured, value="b", parameters=torch.ones(2), inherited_from="a")
    compress = Choice(decision=Decision.COMPRESS, codec="int8_outlier")
    state = SimpleNamespace(
        solution=PlanSolution(choices={"a": compress, "b": compress}, status="optimal", solver="milp"),
        info=SimpleNamespace(forward_nodes=frozenset()),
        calibration=Calibration(used=True, reason="", options={"a": {"int8_outlier": measured},
                                                              "b": {"int8_outlier": inherited}}),
        joint=fx.GraphModule(torch.nn.Module(), fx.Graph()),
    )
    monitor = ActivationMonitor.from_state(state)
    assert set(monitor.references) == {"a"} and monitor.unwatched_parameters == ("b",)
    refused = recalibrate(monitor, {"a": torch.zeros(2)}, [], [], DriftRule())
    assert "did not measure" in refused.refused and not refused.parameters
