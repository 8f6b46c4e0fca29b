"""adacc reaches where full activation checkpointing goes, on an HF Llama.

Full AC (Hugging Face's ``gradient_checkpointing_enable``: each decoder
layer's input kept, the layer recomputed in its backward) is a plan in
adacc's space once the decoder layers are recognised as blocks. The step
budget's reachable minimum, as the summary reports it, is at or below full
AC's measured step peak, and the plan adacc runs there measures within 2%
of it (allocator trace, eager graphs on both sides, same weights and batch).

HF GPT-2 is not there yet at this size: its reported minimum was 1.05x
full AC's measured peak and its measured step 1.13x (bench/RESULTS.md).
A step with ``labels=`` (the loss in the graph) is predicted as it runs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_compile.measure import measure_peak_bytes
from adacc_test_utils import compile_with_reports

transformers = pytest.importorskip("transformers")

VOCAB, D_MODEL, SEQ, LAYERS = 512, 64, 64, 4


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=172, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ, use_cache=False,
    )
    return transformers.LlamaForCausalLM(config).train()


def _step(model, ids):
    def run():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids).logits.float().mean().backward()

    return run


def test_the_reachable_minimum_is_at_or_below_full_checkpointings_measured_peak():
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
    full_ac = _llama()
    full_ac.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _step(full_ac, ids)()
    full_ac_peak = measure_peak_bytes(_step(full_ac, ids))
    compiled, partitioner = compile_with_reports(
        _llama(), "adacc_eager", {"memory_budget": "1B", "budget_scope": "step", "device_profile": "h100"}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1 byte: below the minimum, by design
        _step(compiled, ids)()
    ours = measure_peak_bytes(_step(compiled, ids))
    (report,) = partitioner.reports
    summary = report["summary"]
    assert summary["block_reuse"]["used"] and summary["budget_clamped_to_minimum"]
    assert summary["minimum_activation_peak_bytes"] <= full_ac_peak, (summary["minimum_activation_peak_bytes"], full_ac_peak)
    assert ours <= 1.02 * full_ac_peak, (ours, full_ac_peak)


def test_a_step_with_labels_is_predicted_without_the_logits_gradient():
    """HF returns the logits beside the loss; their gradient is never
    materialised when the loss is what the backward starts from. The
    simulated step (which once charged it: one logits buffer over) matches
    the allocator trace."""
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
    model = _llama()
    compiled, partitioner = compile_with_reports(
        model, "adacc_eager",
        {"memory_budget": "1B", "budget_scope": "step", "device_profile": "h100", "measure_step": False},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1 byte: below the minimum, by design
        compiled(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    measured = measure_peak_bytes(lambda: compiled(input_ids=ids, labels=ids).loss.backward())
    (report,) = partitioner.reports
    predicted = report["summary"]["predicted_peak_bytes"]
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)
