"""The same graph and explicit options give the same plan across changes
to the planner's code that are not meant to change plans (a faster
simulation, restructured stages): each plan hash below was recorded with
torch 2.13 and must not move unless a commit says why. Lossless plans on
``adacc_eager`` with the built-in H100 cost model: nothing in them depends
on the machine (no measured profile, no calibration of lossy codecs).

Re-record (after a change meant to move plans, or under another torch):
``python tests/e2e/test_recorded_plans.py``, which prints the table."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

if __name__ == "__main__":
    _ROOT = pathlib.Path(__file__).resolve().parents[2]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "tests"), str(_ROOT / "examples")]

from adacc_test_utils import build, compile_with_reports, loss_and_grads  # noqa: E402

#: (model, backend, options) -> plan hash (torch 2.13).
CASES = {
    ("gpt", "adacc_eager", "lossless@0.5"): {"memory_budget": 0.5},
    ("gpt", "adacc_eager", "lossless@0.3"): {"memory_budget": 0.3},
    ("llama", "adacc_eager", "lossless@0.3"): {"memory_budget": 0.3},
    ("llama", "adacc_eager", "lossless@0.5"): {"memory_budget": 0.5},
    ("llama", "adacc_eager", "step@0.6"): {"memory_budget": 0.6, "budget_scope": "step"},
    ("hf_llama", "adacc_eager", "lossless@0.5"): {"memory_budget": 0.5},
    ("hf_gpt2", "adacc_eager", "lossless@0.3"): {"memory_budget": 0.3},
}
RECORDED: dict[tuple[str, str, str], tuple[str, ...]] = {
    ('gpt', 'adacc_eager', 'lossless@0.5'): ('2b18aa1854f615fa027d6faaeccad20e3e9ca6ffe2f6245e36a8062ce941fdbc',),
    ('gpt', 'adacc_eager', 'lossless@0.3'): ('9a8b8e00f3d2a7aa6a6bce03e4892ba195d0de17ef2feb82e996267f100ee306',),
    ('llama', 'adacc_eager', 'lossless@0.3'): ('3345fd807c972a04c5a1fe1944b85a3c12a7772b347375b25f3fa8ba503845db',),
    ('llama', 'adacc_eager', 'lossless@0.5'): ('35dd50acdd78eeb812b19955caa12e9681fa4df759111e3d340fe5306876d5c7',),
    ('llama', 'adacc_eager', 'step@0.6'): ('fd60d4c0c3c98e4a9446ae6dc37bc4e76345ed2a1a86fccd16ea6036f8526cc2',),
    ('hf_llama', 'adacc_eager', 'lossless@0.5'): ('b08c08b32273ee2143ddc60adc621101e5a3d77108ba99e8c8659acf4c7075da',),
    ('hf_gpt2', 'adacc_eager', 'lossless@0.3'): ('d00b701e000ee8c611db97fff9bbbbf4e1b88f5888fb620e7dfcef1bc0c1d03f', '0f40821162604c5f00f26105e5e54de93d9ca57adca33620dc4ef4ede37f9ef6'),
}


def _model(name: str):
    if not name.startswith("hf_"):
        return build(name)
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(vocab_size=64, num_hidden_layers=3, max_position_embeddings=16)
    if name == "hf_llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **common, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, ids):
            return self.inner(input_ids=ids, labels=ids).loss

    return Loss(), (ids,)


def plan_hashes(case: tuple[str, str, str]) -> tuple[str, ...]:
    """The plan hash of every graph the case compiles, in order."""
    name, backend, _ = case
    torch._dynamo.reset()
    model, batch = _model(name)
    options = {"device_profile": "h100", **CASES[case]}
    compiled, partitioner = compile_with_reports(model, backend, options)
    loss_and_grads(model, compiled, *batch)
    return tuple(report["summary"]["plan_hash"] for report in partitioner.reports)


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "-".join(c))
def test_the_plan_is_the_recorded_one(case):
    assert plan_hashes(case) == RECORDED[case]


if __name__ == "__main__":
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    # As the tests run (tests/conftest.py): dropout as PyTorch's own random ops.
    with inductor_config.patch(fx_graph_cache=False, fallback_random=True), \
            functorch_config.patch(enable_autograd_cache=False):
        for case in CASES:
            print(f"    {case!r}: {plan_hashes(case)!r},")
