"""End to end through ``adacc`` (Inductor code generation on CPU).

Budget 0.5 runs by default for every model; the full budget matrix is
marked slow (Inductor's C++ compile takes tens of seconds per graph here).
Inductor runs with ``fallback_random=True`` (tests/conftest.py) so dropout
draws the same masks as eager.
"""

from __future__ import annotations

import pytest

from adacc_test_utils import assert_same, build, compile_with_reports, loss_and_grads


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
    assert_same(expected, actual, atol=2e-5, rtol=1e-4)
    summary = partitioner.reports[-1]["summary"]
    if summary["activation_peak_fits_budget"]:  # else: lowest-peak plan, see test_backend_eager
        assert summary["planned_saved_bytes"] <= summary["budget_bytes"]
