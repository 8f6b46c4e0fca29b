"""Where the budget is out of the MILP plans' reach but above what full
checkpointing's plan holds, the plan search keeps what of the last blocks
the room allows (`passes.kept_blocks`): the plan recomputes less than full
AC's, still fits the budget it was given, and gives eager's gradients.

The case is a 3-layer HF GPT-2 at ``memory_budget=0.3`` (the recorded
plans' case, `tests/e2e/test_recorded_plans.py`): the MILP's lowest plan
is over it, full AC's is under it."""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_test_utils import EAGER_REL, assert_same, compile_with_reports, loss_and_grads

transformers = pytest.importorskip("transformers")


class _Loss(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, labels=ids).loss


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Loss(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)))


def _plan(options):
    torch._dynamo.reset()
    model = _gpt2()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    expected = loss_and_grads(model, model, ids)
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"device_profile": "h100", **options})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = loss_and_grads(model, compiled, ids)
    assert_same(expected, got, rel=EAGER_REL)
    return partitioner.reports[0]["summary"]


def test_full_checkpointing_with_its_last_blocks_values_kept():
    summary = _plan({"memory_budget": 0.3})
    assert summary["plan_source"] == "full_ac"
    assert any("values of its last blocks kept" in note for note in summary["notes"]), summary["notes"]
    assert summary["activation_peak_fits_budget"], (summary["predicted_activation_peak_bytes"], summary["budget_bytes"])
    full_ac = _plan({"memory_budget": 0.3, "planner": "full_ac"})
    assert summary["decisions"]["keep"] > full_ac["decisions"]["keep"]
    assert summary["estimated_added_seconds"] < full_ac["estimated_added_seconds"]
