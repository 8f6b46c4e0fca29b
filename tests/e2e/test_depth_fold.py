"""Depth folding against the full-depth trace: a six-layer Llama-style
config traced with three blocks and planned at six gives the plan, saved
bytes, predicted peaks and step time of tracing all six (PyTorch's
memory-budget partitioner excepted: its knapsack sees the shallow graph)."""

from __future__ import annotations

import warnings

import pytest
import torch

from adacc_compile import plan_preview
from adacc_compile.config import AdaccConfig

pytest.importorskip("transformers")
from adacc_compile.model_source import resolve_model  # noqa: E402

SIX_LAYERS = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
}
SUMMARY_KEYS = (
    "requested_budget_bytes", "default_saved_bytes", "default_activation_peak_bytes", "planned_saved_bytes",
    "simulated_saved_bytes", "modelled_activation_peak_bytes", "predicted_activation_peak_bytes",
    "predicted_peak_bytes", "estimated_added_seconds", "estimated_step_seconds",
)


@pytest.fixture(scope="module")
def previews(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("six") / "config.json"
    path.write_text(json.dumps(SIX_LAYERS))
    source = resolve_model(str(path))
    config = AdaccConfig.from_options(
        {"memory_budget": 0.5, "device_profile": "h100", "calibrate_codecs": False, "on_infeasible": "warn"}
    )
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fold in (False, True):
            traced = plan_preview.trace(source, batch=2, seq=32, dtype=torch.float32, fold=fold)
            out[fold] = (traced, plan_preview.preview(traced, config))
    return out


def test_folded_trace_is_shallow_and_names_its_repeat(previews):
    (full_traced, full), (traced, folded) = previews[False], previews[True]
    assert full_traced.fold_copies == 0 and traced.fold_copies == 3
    assert len(traced.joint.gm.graph.nodes) < 0.7 * len(full_traced.joint.gm.graph.nodes)
    assert traced.parameter_bytes == full_traced.parameter_bytes
    fold = folded.summary["depth_fold"]
    assert fold["used"] and fold["copies"] == 3 and fold["traced_blocks"] == 3 and fold["planned_blocks"] == 6
    assert fold["repeated_block"].endswith("layers.1")
    assert full.summary["depth_fold"] == {"used": False}


def test_folded_summary_equals_the_full_trace(previews):
    full, folded = previews[False][1].summary, previews[True][1].summary
    for key in SUMMARY_KEYS:
        assert folded[key] == pytest.approx(full[key], rel=1e-6), key
    # The same decisions per block position: counts scale with the traced blocks.
    assert folded["decisions"]["recompute"] < full["decisions"]["recompute"]


def test_folded_strategies_equal_the_full_trace(previews):
    full, folded = previews[False][1].strategies, previews[True][1].strategies
    assert [s.name for s in full] == [s.name for s in folded]
    for a, b in zip(full, folded):
        if a.name.startswith("PyTorch memory budget"):
            # Its knapsack runs on the traced graph; at six layers it chose within 10% of that.
            assert b.activation_peak_bytes == pytest.approx(a.activation_peak_bytes, rel=0.1)
            continue
        assert (b.saved_bytes, b.activation_peak_bytes, b.step_peak_bytes) == (
            a.saved_bytes, a.activation_peak_bytes, a.step_peak_bytes), a.name
        assert b.step_seconds == pytest.approx(a.step_seconds, rel=1e-6), a.name
