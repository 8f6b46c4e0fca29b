"""Fuzz: random small models with buffers updated in place, multi-output
ops, in-place ops on intermediates, BatchNorm and dropout. For every planner
and several budgets, a lossless plan gives eager's loss, gradients and
buffer values, over two steps (the second starts from updated buffers).

Each model is a seeded random sequence of the blocks in `BLOCKS`; the seed
is in the test id, so a failure names a reproducible model.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from adacc_test_utils import EAGER_REL, assert_same, assert_same_buffers, compile_with_reports, loss_and_grads

WIDTH = 16

BLOCKS = (
    "linear", "tanh", "gelu", "buffer_add", "buffer_update", "batch_norm", "chunk", "var_mean",
    "inplace", "dropout", "counter",
)


class RandomNet(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        rng = random.Random(seed)
        torch.manual_seed(seed)
        self.blocks = ["linear"] + rng.choices(BLOCKS, k=rng.randint(5, 9)) + ["buffer_update"]
        self.linears = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for b in self.blocks if b == "linear")
        self.norms = nn.ModuleList(nn.BatchNorm1d(WIDTH) for b in self.blocks if b == "batch_norm")
        self.register_buffer("shift", torch.randn(WIDTH) * 0.1)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linears, norms = iter(self.linears), iter(self.norms)
        h = x
        for block in self.blocks:
            if block == "linear":
                h = next(linears)(h)
            elif block == "tanh":
                h = torch.tanh(h)
            elif block == "gelu":
                h = F.gelu(h)
            elif block == "buffer_add":
                h = h + self.shift
            elif block == "buffer_update":  # after reads of `shift` above
                with torch.no_grad():
                    self.shift.mul_(0.9).add_(0.1 * h.mean(0))
            elif block == "batch_norm":
                h = next(norms)(h)
            elif block == "chunk":
                a, b = h.chunk(2, dim=-1)
                h = torch.cat([a * torch.sigmoid(b), a + b], dim=-1)
            elif block == "var_mean":
                var, mean = torch.var_mean(h, dim=-1, keepdim=True)
                h = (h - mean) * torch.rsqrt(var + 1e-5)
            elif block == "inplace":
                h = h * 1.5
                h.add_(0.25)
            elif block == "dropout":
                h = F.dropout(h, 0.2, self.training)
            elif block == "counter":
                self.steps.add_(1)
        return (self.head(h).squeeze(-1) - x.sum(-1)).pow(2).mean() + h.square().mean()


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
