"""Fuzz: random small models with buffers updated in place, multi-output
ops, in-place ops on intermediates, BatchNorm and dropout. For every planner
and several budgets, a lossless plan gives eager's loss, gradients and
buffer values, over two steps (the second starts from updated buffers).

Each model is a seeded random sequence of blocks (`adacc_test_utils
.RandomNet`); the seed is in the test id, so a failure names a reproducible
model.
"""

from __future__ import annotations

import pytest
import torch

from adacc_test_utils import EAGER_REL, WIDTH, RandomNet, assert_same, assert_same_buffers, compile_with_reports, loss_and_grads

PLANS = (
    {"memory_budget": 1.0},
    {"memory_budget": 0.3},
    {"memory_budget": 0.05},
    {"planner": "greedy", "memory_budget": 0.3},
    {"planner": "recompute_all"},
    {"planner": "keep_all"},
)


@pytest.mark.parametrize("seed", range(6))
def test_lossless_plans_match_eager_on_random_models(seed):
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(seed))
    for plan in PLANS:
        torch._dynamo.reset()
        eager, model = RandomNet(seed), RandomNet(seed)
        compiled, _ = compile_with_reports(
            model, "adacc_eager", {**plan, "accuracy": "lossless", "device_profile": "h100"}
        )
        for step in range(2):
            expected = loss_and_grads(eager, eager, x, seed=step)
            actual = loss_and_grads(model, compiled, x, seed=step)
            label = f"seed {seed}, {plan}, step {step}, blocks {eager.blocks}"
            try:
                assert_same(expected, actual, rel=EAGER_REL)
                assert_same_buffers(eager, model, rel=EAGER_REL)
            except AssertionError as error:
                raise AssertionError(f"{label}: {error}") from None
