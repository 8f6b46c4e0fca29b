"""The first training step, measured (`adacc_compile.step_measure`): a
memory model that predicts low costs one re-plan, never the budget."""

from __future__ import annotations

import warnings

import pytest
import torch

import adacc_compile
from adacc_compile.measure import measure_peak_bytes
from adacc_compile.step_measure import Correction
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import EAGER_REL, TwoGraphs, assert_same, compile_with_reports, loss_and_grads

pytestmark = pytest.mark.torch_defaults


def _gpt():
    torch.manual_seed(0)
    model = init_weights(GPT(GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=128, vocab_size=256, dropout=0.0)))
    return model, gpt_batch(model.cfg, 4, torch.Generator().manual_seed(0))


def _model_scaled(monkeypatch, scale: float) -> None:
    """Every storage the split graphs' simulation (the plan's prediction)
    and the MILP's memory model count is ``scale`` of its real size: a
    mirrored allocation habit gone wrong."""
    import sys

    import adacc_compile.passes.annotate as annotate
    import adacc_compile.passes.memory_sim as memory_sim

    real_bytes, real_storage = annotate.tensor_bytes, memory_sim._Storage
    for name, module in list(sys.modules.items()):
        if name.startswith("adacc_compile") and getattr(module, "tensor_bytes", None) is real_bytes:
            monkeypatch.setattr(module, "tensor_bytes", lambda v: int(scale * real_bytes(v)))
    monkeypatch.setattr(memory_sim, "_Storage", lambda nbytes, **kw: real_storage(nbytes=int(scale * nbytes), **kw))


def _steps(model, compiled, batch, count):
    peaks = []
    for _ in range(count):
        model.zero_grad(set_to_none=True)
        peaks.append(measure_peak_bytes(lambda: compiled(*batch).backward()))
    return peaks


@pytest.mark.parametrize("backend", ["adacc_eager", pytest.param("adacc", marks=pytest.mark.slow)])
def test_a_model_twenty_percent_low_is_corrected_after_the_first_step(monkeypatch, backend):
    model, batch = _gpt()
    expected = loss_and_grads(model, model, *batch)
    _model_scaled(monkeypatch, 0.8)
    budget = 7_000_000
    compiled, partitioner = compile_with_reports(
        model, backend, {"memory_budget": budget, "budget_scope": "step", "codecs": (), "device_profile": "h100"}
    )
    with pytest.warns(UserWarning, match=r"first step peaked at \d+ bytes, \d+ bytes .* over its budget 7000000"):
        compiled(*batch).backward()  # measured by adacc (a profiler of ours would leave it unmeasured)
    summary = partitioner.reports[0]["summary"]
    first = summary["measured_step_peak_bytes"]
    assert first > 1.1 * budget and summary["predicted_peak_bytes"] <= budget  # the model was wrong
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second correction
        later = _steps(model, compiled, batch, 3)
    assert max(later) <= budget, (later, budget)
    assert len(partitioner.reports) == 2  # one re-plan
    replanned = partitioner.reports[1]["summary"]
    assert replanned["measured_correction_bytes"] == summary["measured_step_peak_bytes"] - summary["predicted_peak_bytes"]
    assert_same(expected, loss_and_grads(model, compiled, *batch), rel=EAGER_REL)
    (record,) = adacc_compile.plans(model)
    assert record.measured_peak_bytes is None and record.summary["measured_correction_bytes"] > 0


def test_an_accurate_model_is_measured_and_kept(monkeypatch):
    model, batch = _gpt()
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.6, "budget_scope": "step", "codecs": (), "device_profile": "h100"}
    )
    compiled(*batch).backward()
    model.zero_grad(set_to_none=True)
    compiled(*batch).backward()
    _, third = _steps(model, compiled, batch, 2)
    (report,) = partitioner.reports
    summary = report["summary"]
    first = summary["measured_step_peak_bytes"]
    assert abs(first - third) <= 0.01 * third  # adacc's probe agrees with measure_peak_bytes
    assert abs(summary["measured_step_peak_bytes"] - summary["predicted_peak_bytes"]) <= 0.02 * first
    (record,) = adacc_compile.plans(model)
    assert record.measured_peak_bytes == summary["measured_step_peak_bytes"]


def test_a_model_that_predicts_high_re_plans_for_speed_within_the_budget(monkeypatch):
    model, batch = _gpt()
    _model_scaled(monkeypatch, 1.3)
    budget = 7_000_000
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": budget, "budget_scope": "step", "codecs": (), "device_profile": "h100"}
    )
    compiled(*batch).backward()
    later = _steps(model, compiled, batch, 2)
    first_plan, replanned = (r["summary"] for r in partitioner.reports)
    first = first_plan["measured_step_peak_bytes"]
    assert first < 0.9 * budget and replanned["measured_correction_bytes"] < 0
    assert replanned["estimated_added_seconds"] < first_plan["estimated_added_seconds"]
    assert max(later) <= 1.02 * budget, (later, budget)


def test_measure_step_off_and_steps_of_several_graphs_are_not_measured():
    model, batch = _gpt()
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.6, "budget_scope": "step", "measure_step": False}
    )
    for _ in range(2):
        compiled(*batch).backward()
    assert partitioner.reports[0]["summary"]["measured_step_peak_bytes"] is None

    torch._dynamo.reset()
    two = TwoGraphs()
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    compiled, partitioner = compile_with_reports(two, "adacc_eager", {"memory_budget": 0.9, "budget_scope": "step"})
    for _ in range(2):
        compiled(x).backward()
    assert len(partitioner.reports) >= 2
    assert all(r["summary"]["measured_step_peak_bytes"] is None for r in partitioner.reports)


def test_a_step_under_the_callers_profiler_is_not_measured_and_profiling_after_the_step_works():
    model, batch = _gpt()
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"memory_budget": 0.6, "budget_scope": "step"})
    with torch.profiler.profile():
        compiled(*batch).backward()
    assert partitioner.reports[0]["summary"]["measured_step_peak_bytes"] is None
    compiled(*batch).backward()  # measured
    _steps(model, compiled, batch, 2)  # the caller's profiler starts after adacc's measured step
    assert partitioner.reports[0]["summary"]["measured_step_peak_bytes"] is not None


@pytest.mark.parametrize(
    ("measured", "predicted", "clamped", "wanted"),
    [
        (103, 100, False, True),  # over the budget (100)
        (101, 100, False, False),  # within the tolerance
        (103, 100, True, False),  # the budget is the reachable minimum
        (85, 97, False, True),  # far under a budget that binds
        (85, 80, False, False),  # far under, but the plan is well under the budget anyway
    ],
)
def test_when_a_correction_is_wanted(measured, predicted, clamped, wanted):
    correction = Correction(measured_bytes=measured, predicted_bytes=predicted, budget_bytes=100)
    assert correction.wanted(clamped=clamped) is wanted


def test_the_measured_peak_is_written_to_the_dumped_summary_whatever_the_folder_number(tmp_path):
    """The dump folder's number is not the step ledger's graph index (a
    folder from an earlier run is there already): the measured peak still
    reaches this graph's summary.json and its record."""
    import json

    (tmp_path / "graph_000").mkdir()
    model, batch = _gpt()
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager",
        {"memory_budget": 0.6, "budget_scope": "step", "codecs": (), "device_profile": "h100", "dump_dir": str(tmp_path)},
    )
    compiled(*batch).backward()
    dumped = json.loads((tmp_path / "graph_001" / "summary.json").read_text())
    assert dumped["measured_step_peak_bytes"] == partitioner.reports[0]["summary"]["measured_step_peak_bytes"] > 0
    (record,) = adacc_compile.plans(model)
    assert record.measured_peak_bytes == dumped["measured_step_peak_bytes"]
