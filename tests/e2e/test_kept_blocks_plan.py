"""Where the budget is out of the MILP plans' reach but above what full
checkpointing's plan holds, the plan search keeps what of the last blocks
the room allows (`passes.kept_blocks`): the plan recomputes less than full
AC's, still fits the budget it was given, and gives eager's gradients.

The case is a 3-layer HF GPT-2 at ``memory_budget=0.3`` (the recorded
plans' case, `tests/e2e/test_recorded_plans.py`): the MILP's lowest plan
is over it, full AC's is under it."""

from __future__ import annotations

import re
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


def _kept(summary) -> int:
    note = next(n for n in summary["notes"] if "values of its last blocks kept" in n)
    return int(re.search(r"with (\d+) values", note).group(1))


def test_full_checkpointing_with_its_last_blocks_values_kept(monkeypatch):
    """Kept values recompute less than full AC's plan, within the budget.
    The plan simulator over-counts what a kept value adds to full AC's
    step, so one bisection by it leaves room the split graphs show: the
    search goes on from there (`plan_search.KEEP_ROUNDS` splits) and keeps
    more than one round does."""
    from adacc_compile.passes import plan_search

    summary = _plan({"memory_budget": 0.3})
    assert summary["plan_source"] == "full_ac"
    assert summary["activation_peak_fits_budget"], (summary["predicted_activation_peak_bytes"], summary["budget_bytes"])
    full_ac = _plan({"memory_budget": 0.3, "planner": "full_ac"})
    assert summary["decisions"]["keep"] > full_ac["decisions"]["keep"]
    assert summary["estimated_added_seconds"] < full_ac["estimated_added_seconds"]
    monkeypatch.setattr(plan_search, "KEEP_ROUNDS", 1)
    one_round = _plan({"memory_budget": 0.3})
    assert _kept(summary) > _kept(one_round), (_kept(summary), _kept(one_round))


def test_a_budget_full_checkpointing_meets_is_not_out_of_reach():
    """A byte budget under every MILP plan's modelled peak but over what
    full AC's split graphs hold (140 kB here; full AC's 132 kB): the
    budget is not clamped to a minimum, no warning says it is out of
    reach, and its room above full AC goes to kept values."""
    torch._dynamo.reset()
    model = _gpt2()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    expected = loss_and_grads(model, model, ids)
    options = {"device_profile": "h100", "memory_budget": 140_000}
    compiled, partitioner = compile_with_reports(model, "adacc_eager", options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = loss_and_grads(model, compiled, ids)
    assert_same(expected, got, rel=EAGER_REL)
    summary = partitioner.reports[0]["summary"]
    assert not any("reachable minimum" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert summary["plan_source"] == "full_ac" and not summary["budget_clamped_to_minimum"]
    assert summary["budget_bytes"] == 140_000 and summary["activation_peak_fits_budget"]
    assert any("values of its last blocks kept" in note for note in summary["notes"]), summary["notes"]
