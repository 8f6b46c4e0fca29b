"""``adacc plan``'s answer against a measured training step on this CPU: a
2-layer HF Llama, fp32 weights, gradients and AdamW states, compiled. The
CLI's ``total_peak_bytes`` less its GPU reserve (CUDA context and
allocator margin, which a CPU step has not) is within 10% of the step's
measured absolute peak: the weights and AdamW's states that exist before
the step, plus the most the allocator held above them while forward,
backward and ``optimizer.step()`` ran. For no checkpointing (Inductor's
default partitioner) and for an adacc plan at the CLI's own budget."""

from __future__ import annotations

import contextlib
import io
import json
import warnings

import pytest
import torch

from adacc_compile import cli
from adacc_compile.measure import second_step_peak_bytes

transformers = pytest.importorskip("transformers")

CONFIG = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 256,
}
BATCH, SEQ = 4, 256


def _answer(path, *extra):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([
            "plan", str(path), "--gpu", "h100", "--batch", str(BATCH), "--seq", str(SEQ), "--dtype", "fp32",
            "--precision", "fp32-master", "--optimizer", "adamw", "--json", *extra,
        ]) == 0
    return json.loads(out.getvalue())


def _measured(model, compiled) -> int:
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        compiled(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        above = second_step_peak_bytes(model, step)  # the first compiles and makes the optimizer's states
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    held += sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if t.dim() > 0)
    return held + above


def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"}, use_cache=False)
    return transformers.LlamaForCausalLM(config).train()


@pytest.mark.slow
def test_the_answer_is_within_10_percent_of_a_measured_step_with_adamw(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    answer = _answer(path)
    no_ac = next(v for k, v in answer["strategies"].items() if k.startswith("no checkpointing"))
    static = answer["total_peak_bytes"] - answer["reserve_bytes"] - answer["activation_peak_bytes"]
    predicted = static + no_ac["step_peak_bytes"]
    model = _model()
    torch._dynamo.reset()
    measured = _measured(model, torch.compile(model))
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)

    answer = _answer(path, "--budget", "0.5")
    predicted = answer["total_peak_bytes"] - answer["reserve_bytes"]
    model = _model()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="adacc", options={
        "memory_budget": answer["budget_bytes"], "budget_scope": answer["budget_scope"], "device_profile": "h100",
        "measure_step": False,
    })
    measured = _measured(model, compiled)
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
