"""End to end through ``adacc`` (Inductor code generation on CPU).

Budget 0.5 runs by default for every model; the full budget matrix is
marked slow (Inductor's C++ compile takes tens of seconds per graph here).
Inductor runs with ``fallback_random=True`` (tests/conftest.py) so dropout
draws the same masks as eager.
"""

from __future__ import annotations

import pytest

from adacc_test_utils import EAGER_REL, INDUCTOR_REL, assert_same, build, compile_with_reports, loss_and_grads


@pytest.mark.parametrize(
    "budget",
    [pytest.param(1.0, marks=pytest.mark.slow), 0.5, pytest.param(0.2, marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("name", ["mlp", "gpt", "llama"])
def test_inductor_matches_eager(name, budget):
    model, batch = build(name)
    expected = loss_and_grads(model, model, *batch)
    compiled, partitioner = compile_with_reports(
        model, "adacc", {"memory_budget": budget, "accuracy": "lossless"}
    )
    actual = loss_and_grads(model, compiled, *batch)
    assert_same(expected, actual, rel=INDUCTOR_REL)
    summary = partitioner.reports[-1]["summary"]
    if summary["activation_peak_fits_budget"]:  # else: lowest-peak plan, see test_backend_eager
        assert summary["planned_saved_bytes"] <= summary["budget_bytes"]


def test_fx_graph_cache_hits_for_same_options_and_misses_for_another_budget():
    """Inductor's FX graph cache on: the same options hit (the partitioner's
    uuid is stable), another budget misses (the uuid hashes the config)."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    model, batch = build("mlp")
    seen = {}
    with fresh_cache(), inductor_config.patch(fx_graph_cache=True):
        for label, budget in (("first", 0.5), ("same", 0.5), ("other", 0.3)):
            torch._dynamo.reset()
            counters.clear()
            compiled, _ = compile_with_reports(model, "adacc", {"memory_budget": budget})
            loss_and_grads(model, compiled, *batch)
            seen[label] = (counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
    assert seen["first"] == (0, 2), seen  # forward and backward compiled
    assert seen["same"] == (2, 0), seen
    assert seen["other"][1] == 2, seen
