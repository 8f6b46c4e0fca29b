"""End to end through ``adacc_eager``: same loss and gradients as eager
PyTorch at every budget, budgets respected, recompute really happening."""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_test_utils import EAGER_REL, assert_same, build, compile_capturing, compile_with_reports, loss_and_grads

pytestmark = pytest.mark.torch_defaults  # compile caches on (adacc_eager uses none of them)

BUDGETS = (1.0, 0.5, 0.2)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", ["mlp", "gpt", "llama"])
def test_matches_eager(name, budget):
    """Dropout masks match because random ops are never recomputed: the
    forward draws them once, in eager order, and saves them. Every plan's
    simulated activation peak fits its budget (clamped to the reachable
    minimum, with a warning, where the budget is below it), and so does its
    modelled peak unless a re-solve raised the model's cap; at 1.0 the plan
    is at least as good as PyTorch's default partitioner's in memory and
    estimated time."""
    model, batch = build(name)
    expected = loss_and_grads(model, model, *batch)
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": budget, "accuracy": "lossless"}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = loss_and_grads(model, compiled, *batch)
    assert_same(expected, actual, rel=EAGER_REL)
    summary = partitioner.reports[-1]["summary"]
    messages = " ".join(str(w.message) for w in caught)
    assert summary["predicted_activation_peak_bytes"] <= summary["modelled_activation_peak_bytes"]
    assert summary["predicted_activation_peak_bytes"] <= summary["budget_bytes"]
    if summary["plan_source"] != "default" and summary["replans"] == 0:
        # The model's own plan fits the model. (PyTorch's plan is taken where
        # its simulation fits; a re-solve may raise the model's cap over the
        # budget where the simulated peak stayed under it.)
        assert summary["modelled_activation_peak_bytes"] <= summary["budget_bytes"]
    assert summary["planned_saved_bytes"] <= summary["budget_bytes"]
    if summary["budget_clamped_to_minimum"]:
        assert "reachable minimum" in messages
        assert summary["budget_bytes"] == summary["minimum_activation_peak_bytes"]
    if budget == 1.0:
        assert not summary["budget_clamped_to_minimum"]
        assert summary["planned_saved_bytes"] <= summary["default_saved_bytes"]
        assert summary["predicted_activation_peak_bytes"] <= summary["default_activation_peak_bytes"]
        assert summary["estimated_added_seconds"] <= summary["default_added_seconds"] + 1e-12


def _backward_mm_count(module: torch.fx.GraphModule) -> int:
    names = ("aten.mm", "aten.addmm", "aten.bmm")
    return sum(
        1 for n in module.graph.nodes if n.op == "call_function" and str(n.target).rsplit(".", 1)[0] in names
    )


def test_recompute_happens_in_backward():
    """Recomputed matmul outputs put forward matmuls into the backward graph:
    count them. ``recompute_all`` recomputes all four linear outputs; any
    plan's backward has exactly as many extra matmuls as it recomputes."""
    model, batch = build("mlp")
    counts, recomputed = {}, {}
    runs = {
        "keep_all": {"planner": "keep_all"},
        "milp@0.7": {"memory_budget": 0.7},
        "recompute_all": {"planner": "recompute_all"},
    }
    for label, options in runs.items():
        torch._dynamo.reset()
        compiled, states = compile_capturing(model, {**options, "accuracy": "lossless", "device_profile": "h100"})
        expected = loss_and_grads(model, model, *batch)
        assert_same(expected, loss_and_grads(model, compiled, *batch), rel=EAGER_REL)
        state = states[-1]
        counts[label] = _backward_mm_count(state.bw_module)
        recomputed[label] = sum(
            1 for record in state.report["plan"]
            if record["decision"] == "recompute" and record["op_class"] == "matmul"
        )
    for label in runs:
        assert counts[label] == counts["keep_all"] + recomputed[label], (counts, recomputed)
    assert recomputed["keep_all"] == 0 and recomputed["recompute_all"] == 4, recomputed


def test_infeasible_budget_warns_with_minimum_or_raises():
    model, batch = build("gpt")  # dropout masks can never be recomputed
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"memory_budget": 1024})
    with pytest.warns(UserWarning, match=r"reachable minimum .*MiB \((\d+) bytes\)"):
        loss_and_grads(model, compiled, *batch)
    summary = partitioner.reports[-1]["summary"]
    assert summary["budget_clamped_to_minimum"] is True
    assert summary["budget_bytes"] == summary["minimum_activation_peak_bytes"] > 1024

    torch._dynamo.reset()
    compiled, _ = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 1024, "on_infeasible": "error"}
    )
    with pytest.raises(Exception, match="below the reachable minimum"):
        loss_and_grads(model, compiled, *batch)


@pytest.mark.parametrize("planner", ["greedy", "recompute_all", "keep_all"])
def test_registered_planners_run_and_match_eager(planner):
    model, batch = build("llama")
    expected = loss_and_grads(model, model, *batch)
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.5, "planner": planner, "accuracy": "lossless"}
    )
    assert_same(expected, loss_and_grads(model, compiled, *batch), rel=EAGER_REL)
    summary = partitioner.reports[-1]["summary"]
    if planner == "keep_all":
        assert summary["decisions"]["recompute"] == 0 or summary["estimated_added_seconds"] < 1e-3
    if planner == "recompute_all":  # keeps only what cannot be recomputed
        plan = partitioner.reports[-1]["plan"]
        assert all(r["decision"] != "keep" or "recompute" not in r["options"] for r in plan)
        assert summary["decisions"]["recompute"] > 0


def test_dynamic_shapes_compile_and_match():
    model, _ = build("mlp")
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.5, "accuracy": "lossless"}, dynamic=True
    )
    for batch_size in (8, 13):
        gen = torch.Generator().manual_seed(batch_size)
        x, y = torch.randn(batch_size, 16, generator=gen), torch.randn(batch_size, generator=gen)
        assert_same(
            loss_and_grads(model, model, x, y),
            loss_and_grads(model, compiled, x, y),
            rel=EAGER_REL,
        )
    assert partitioner.reports, "the partitioner ran on the dynamic graph"
