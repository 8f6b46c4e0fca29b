"""``budget_scope="step"``: the budget bounds everything the training step
allocates (the backward's gradients too), measured under Inductor."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

from adacc_compile.measure import measure_peak_bytes
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import EAGER_REL, TwoGraphs, assert_same, compile_with_reports, loss_and_grads


def test_a_step_budget_bounds_the_measured_step_peak_and_keeps_the_gradients():
    torch.manual_seed(0)
    model = init_weights(GPT(GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=128, vocab_size=256, dropout=0.0)))
    batch = gpt_batch(model.cfg, 4, torch.Generator().manual_seed(0))
    expected = loss_and_grads(model, model, *batch)
    compiled, partitioner = compile_with_reports(
        model, "adacc", {"memory_budget": 0.6, "budget_scope": "step", "codecs": (), "device_profile": "h100"}
    )
    with inductor_config.patch(fallback_random=True):
        assert_same(expected, loss_and_grads(model, compiled, *batch), rel=EAGER_REL)
        model.zero_grad(set_to_none=True)
        measured = measure_peak_bytes(lambda: compiled(*batch).backward())
    (report,) = partitioner.reports
    summary = report["summary"]
    assert summary["budget_scope"] == "step"
    assert summary["decisions"]["recompute"] > 0  # the budget binds
    budget = summary["budget_bytes"]
    assert summary["fits_budget"] and summary["predicted_peak_bytes"] <= budget
    # The step's simulated peak is what the budget bounds (not only its
    # activations), and the allocator agrees with it.
    assert summary["predicted_peak_bytes"] > summary["predicted_activation_peak_bytes"]
    assert measured <= 1.03 * budget, (measured, budget)


def test_a_step_budget_across_graph_breaks_warns_that_it_is_not_the_steps():
    model, x = TwoGraphs(), torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"memory_budget": "300KB", "budget_scope": "step"})
    with pytest.warns(UserWarning, match=r"budget_scope='step' with graph breaks") as caught:
        loss_and_grads(model, compiled, x)
    first, second = (r["summary"] for r in partitioner.reports)
    assert first["budget_scope"] == second["budget_scope"] == "step"
    messages = [str(w.message) for w in caught if "graph breaks" in str(w.message)]
    assert messages == [  # the second graph only: the first has no earlier graph
        m for m in messages if f"graph {second['graph_index']} " in m and f"[{first['graph_index']}]" in m
    ] and len(messages) == 1
