"""adacc reaches where full activation checkpointing goes, on HF Llama
and HF GPT-2.

Full AC (Hugging Face's ``gradient_checkpointing_enable``: each decoder
layer's input kept, the layer recomputed in its backward) is a plan in
adacc's space once the decoder layers are recognised as blocks. The step
budget's reachable minimum, as the summary reports it, is at or below full
AC's measured step peak, and the plan adacc runs there measures within 2%
of it (allocator trace, eager graphs on both sides, same weights and batch).

HF GPT-2 runs at d_model 256: at 64 its step is dominated by the logits'
gradient, which autograd hands the compiled backward as an argument and so
keeps alive through all of it (under HF's own checkpointing it dies after
the LM head's backward); there adacc's lowest plan measured 1.10x full AC.
A step with ``labels=`` (the loss in the graph) is predicted as it runs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_compile.measure import second_step_peak_bytes
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


def _gpt2(d_model: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=d_model, n_layer=LAYERS, n_head=4, n_positions=SEQ, use_cache=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config).train()


def _step(model, ids, *, labels: bool = False):
    def run():
        if labels:
            model(input_ids=ids, labels=ids).loss.backward()
        else:
            model(input_ids=ids).logits.float().mean().backward()

    return run


def _full_ac_and_lowest(make, *, labels: bool = False, planner: str = "milp"):
    """Full AC's measured step peak; adacc's (1-byte step budget: its lowest
    plan, or ``planner``'s plan) measured step peak and its summaries."""
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
    full_ac = make()
    full_ac.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    full_ac_peak = second_step_peak_bytes(full_ac, _step(full_ac, ids, labels=labels))
    model = make()
    options = {"memory_budget": "1B", "budget_scope": "step", "device_profile": "h100", "measure_step": False}
    if planner != "milp":
        options = {**options, "planner": planner}
    compiled, partitioner = compile_with_reports(model, "adacc_eager", options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 1 byte: below the minimum, by design
        ours = second_step_peak_bytes(model, _step(compiled, ids, labels=labels))
    return full_ac_peak, ours, [report["summary"] for report in partitioner.reports]


def test_the_reachable_minimum_is_at_or_below_full_checkpointings_measured_peak():
    full_ac_peak, ours, summaries = _full_ac_and_lowest(_llama)
    (summary,) = summaries
    assert summary["block_reuse"]["used"] and summary["budget_clamped_to_minimum"]
    assert summary["minimum_activation_peak_bytes"] <= full_ac_peak, (summary["minimum_activation_peak_bytes"], full_ac_peak)
    assert ours <= 1.02 * full_ac_peak, (ours, full_ac_peak)


@pytest.mark.slow  # 24 s; the HF Llama case above runs by default
def test_hf_gpt2_reaches_full_checkpointings_measured_peak():
    full_ac_peak, ours, summaries = _full_ac_and_lowest(lambda: _gpt2(256))
    (summary,) = summaries
    assert summary["block_reuse"]["used"] and summary["budget_clamped_to_minimum"]
    assert summary["minimum_activation_peak_bytes"] <= full_ac_peak, (summary["minimum_activation_peak_bytes"], full_ac_peak)
    assert ours <= 1.02 * full_ac_peak, (ours, full_ac_peak)


def test_with_labels_the_lowest_plan_measures_at_most_full_checkpointings_peak():
    """With the loss in the graph, the MILP's lowest plan measured 1.05x
    full AC (its rows over-count a block recomputed in one burst); the plan
    search then runs full AC's own plan where that holds less. The reported
    minimum is that plan's simulated step, which sits up to 0.1% over the
    measured one (2 KB of 2.5 MB)."""
    full_ac_peak, ours, summaries = _full_ac_and_lowest(_llama, labels=True)
    (summary,) = summaries
    assert ours <= 1.005 * full_ac_peak, (ours, full_ac_peak)
    assert summary["minimum_activation_peak_bytes"] <= 1.005 * full_ac_peak, (
        summary["minimum_activation_peak_bytes"], full_ac_peak,
    )


@pytest.mark.parametrize("planner", [pytest.param("milp", marks=pytest.mark.slow), "full_ac"])  # milp: 30 s
def test_a_step_with_labels_is_predicted_as_it_runs(planner):
    """HF returns the logits beside the loss. A training loop keeps the
    loss only, and autograd materialises zeros for the logits' gradient,
    alive to the ``add`` that reads it: the simulation drops the logits at
    the boundary and charges that tangent. It once held the logits and left
    the tangent out, which cancelled before the ``add`` (the lowest plan's
    peak) and over-counted a logits buffer after it (full AC's plan, whose
    peak is in a block's backward: 16% over)."""
    _, measured, summaries = _full_ac_and_lowest(_llama, labels=True, planner=planner)
    (summary,) = summaries
    predicted = summary["predicted_peak_bytes"]
    assert abs(predicted - measured) <= 0.02 * measured, (predicted, measured)
