"""The simulator's predicted peak against a measured peak.

Measured with the profiler's allocator trace (`adacc_compile.measure`),
on ``adacc_eager``, whose graphs run op by op exactly as planned, so the
prediction must be close. The same check under Inductor's generated code
is `test_inductor_peak_prediction`.
"""

from __future__ import annotations

import pytest
import torch

from adacc_compile.measure import measure_peak_bytes
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_test_utils import compile_with_reports


@pytest.mark.parametrize(
    "cfg",
    [
        GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=64, vocab_size=128, dropout=0.1),
        GPTConfig(n_layer=3, d_model=128, n_head=4, seq_len=128, vocab_size=256, dropout=0.1),
    ],
    ids=["small", "larger"],
)
@pytest.mark.parametrize("budget", [1.0, 0.5])
def test_simulated_peak_within_10_percent_of_measured(cfg, budget):
    model = init_weights(GPT(cfg))
    batch = gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
    compiled, partitioner = compile_with_reports(model, "adacc_eager", {"memory_budget": budget})

    def step():
        compiled(*batch).backward()

    step()  # compile
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(step)
    predicted = partitioner.reports[-1]["summary"]["predicted_peak_bytes"]
    assert measured > 0
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)


def test_measure_counts_a_known_allocation():
    def step():
        a = torch.empty(1 << 20, dtype=torch.uint8)
        b = torch.empty(1 << 19, dtype=torch.uint8)
        del a, b

    assert (1 << 20) + (1 << 19) <= measure_peak_bytes(step) < (1 << 20) + (1 << 19) + 4096
