"""`adacc_compile.plans(model)`: each planned graph of a model, with no
option set, through the module or its compiled wrapper; nothing for a
model adacc did not plan."""

from __future__ import annotations

import torch

import adacc_compile
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights


def _gpt():
    cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64, dropout=0.0)
    return init_weights(GPT(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))


def test_plans_lists_each_planned_graph_of_the_model_without_options():
    model, batch = _gpt()
    other, _ = _gpt()
    compiled = torch.compile(model, backend="adacc_eager", options={"memory_budget": 0.5, "device_profile": "h100"})
    assert adacc_compile.plans(model) == []  # nothing planned before the first step
    compiled(*batch).backward()
    (plan,) = adacc_compile.plans(model)
    assert plan is adacc_compile.plans(compiled)[0]
    assert plan.graph_index == plan.summary["graph_index"]  # counts graphs across the process
    assert plan.budget_bytes > 0 and plan.predicted_peak_bytes > 0
    assert sum(plan.decisions.values()) > 0 and plan.planning_seconds > 0
    assert plan.summary["block_reuse"]["used"]
    assert adacc_compile.plans(other) == []
