"""Adaptive re-planning end to end (adacc_eager; Inductor slow): a small GPT
trains, a shift injected midway (a few channels of one layer norm's weight
scaled, so the next linear layer's input grows outlier channels beyond what
its int8 payload holds) fires exactly one re-plan, after which every
compressed value is within its plan's limits again; the same run without the
shift never re-plans; the API, dumps and log lines show the versions."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

import adacc_compile
from adacc_compile.adaptation import graphs_of
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import compile_with_reports

CFG = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=64, dropout=0.0)
OPTIONS = {
    # Keep-or-compress at half the default's memory: int8 on most linear inputs,
    # int8_outlier, whose exact-channel slots the shift overflows (int8_channel
    # gives every channel its own scales: the shift does not move its error).
    "memory_budget": 0.5, "accuracy": "balanced", "codecs": ("int8_outlier",), "allow_recompute": False,
    "device_profile": "h100",
    "adapt": True, "adapt_every": 3, "adapt_patience": 2,
}
SHIFTED_CHANNELS = [3, 10, 17, 29, 40, 55]


def shift(model: GPT) -> None:
    """Six channels of block 1's second layer norm grow 60x: the MLP's input
    now has six outlier channels where its payload keeps one exact."""
    with torch.no_grad():
        model.blocks[1].ln_2.weight[SHIFTED_CHANNELS] *= 60.0


def train(*, shift_at: int | None, steps: int = 24, backend: str = "adacc_eager", options=OPTIONS, perturb=None):
    torch.manual_seed(0)
    model = init_weights(GPT(CFG))
    compiled, partitioner = compile_with_reports(model, backend, options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    batches = [gpt_batch(CFG, 2, generator) for _ in range(6)]
    losses = []
    for step in range(steps):
        if step == shift_at:
            (perturb or shift)(model)
        loss = compiled(*batches[step % len(batches)])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, partitioner, losses


def assert_within_limits(check) -> None:
    for name, value in check.values.items():
        assert value["error"] <= value["bound"], (check.step, name, value)
        if value["outlier_limit"] is not None:
            assert value["outliers"] <= value["outlier_limit"], (check.step, name, value)


def check_shifted_run(backend: str, steps: int) -> None:
    model, partitioner, losses = train(shift_at=10, steps=steps, backend=backend)
    graph = graphs_of(model)[0]
    assert all(map(lambda x: x == x, losses))
    assert graph.replans == 1, [(c.step, c.drifts) for c in graph.checks]
    assert graph.compiles == 1 + graph.replans and len(partitioner.reports) == graph.compiles
    first, second = graph.versions
    assert first.trigger == "compile" and second.trigger == "drift"
    # Detected at the second failing check after the shift (hysteresis 2).
    assert second.step == 15
    assert any("outlier channels" in r for r in second.reasons)
    fired = [c for c in graph.checks if c.drifts]
    assert [c.action for c in fired] == ["replan"]
    after = [c for c in graph.checks if c.step > second.step]
    assert after and all(c.plan_version == 1 and not c.drifts for c in after)
    for check in after:
        assert_within_limits(check)
    assert adacc_compile.current_plan(model) is second


def test_shift_fires_exactly_one_replan():
    check_shifted_run("adacc_eager", steps=24)


@pytest.mark.slow
def test_shift_fires_exactly_one_replan_inductor():
    check_shifted_run("adacc", steps=24)


def test_no_shift_no_replan():
    model, partitioner, _ = train(shift_at=None)
    graph = graphs_of(model)[0]
    assert graph.replans == 0 and graph.compiles == 1 and len(partitioner.reports) == 1
    assert len(graph.checks) == 8
    for check in graph.checks:
        assert not check.drifts
        assert_within_limits(check)
    assert adacc_compile.plan_history(model) == graph.versions


def test_requested_replan_is_dumped_logged_and_capped(tmp_path, caplog):
    options = {**OPTIONS, "adapt_every": 1000, "adapt_max_replans": 1, "dump_dir": str(tmp_path)}
    torch.manual_seed(0)
    model = init_weights(GPT(CFG))
    compiled, partitioner = compile_with_reports(model, "adacc_eager", options)
    batch = gpt_batch(CFG, 2, torch.Generator().manual_seed(0))
    compiled(*batch).backward()
    with pytest.raises(ValueError, match="adapt"):
        adacc_compile.current_plan(torch.nn.Linear(2, 2))
    assert adacc_compile.current_plan(compiled).version == 0
    assert adacc_compile.replan(compiled, reason="new budget headroom") == 1
    with caplog.at_level(logging.INFO, logger="adacc_compile.adaptation"):
        compiled(*batch).backward()
    history = adacc_compile.plan_history(model)
    assert [(v.version, v.step, v.trigger) for v in history] == [
        (0, 1, "compile"), (1, 2, "request: new budget headroom")
    ]
    assert history[1].changed == {}  # same weights, same batch: same plan
    assert history[1].summary["plan_hash"] == history[0].summary["plan_hash"]
    # The re-plan's MILP started from the plan it replaced; the first did not.
    assert "started from the given plan" in partitioner.reports[1]["summary"]["notes"]
    assert "started from the given plan" not in partitioner.reports[0]["summary"]["notes"]
    assert "re-plan 1 at step 2 (request: new budget headroom)" in caplog.text
    folder = tmp_path / "graph_000"
    assert sorted(os.listdir(folder / "plan_v1")) == sorted(
        f for f in os.listdir(folder) if f not in ("plan_v1", "adaptation.json")
    )
    saved = json.loads((folder / "adaptation.json").read_text())
    assert saved["compiles"] == 2 and [v["trigger"] for v in saved["versions"]] == ["compile", "request: new budget headroom"]
    # The cap: a second request is refused, nothing recompiles.
    adacc_compile.replan(model)
    with caplog.at_level(logging.WARNING, logger="adacc_compile.adaptation"):
        compiled(*batch).backward()
    assert "adapt_max_replans=1 reached" in caplog.text
    assert graphs_of(model)[0].compiles == 2 and len(partitioner.reports) == 2


def test_a_catastrophic_drift_re_plans_at_the_first_check():
    """fp8 with a calibrated scale, then one layer norm's weight 1e4x: the
    MLP input's codes saturate, the error is far over the bound, and the
    graph re-plans at the first check after the shift (step 12), not after
    `adapt_patience` checks (step 15, as the outlier drift above does)."""
    options = {**OPTIONS, "accuracy": "aggressive", "codecs": ("fp8_e5m2",)}

    def blow_up(model: GPT) -> None:
        with torch.no_grad():
            model.blocks[1].ln_2.weight.mul_(1e4)

    model, _, _ = train(shift_at=10, steps=13, options=options, perturb=blow_up)
    graph = graphs_of(model)[0]
    assert graph.replans == 1, [(c.step, c.drifts) for c in graph.checks]
    assert graph.versions[1].step == 12 and graph.versions[1].trigger == "drift"
    assert any("error" in r for r in graph.versions[1].reasons), graph.versions[1].reasons
