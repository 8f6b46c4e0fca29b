"""`plan_preview.attention_as_on_a_gpu`: ``adacc plan`` traces attention
with dropout as a GPU's flash attention runs it (no scores or mask saved),
not as the CPU's math path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adacc_compile import plan_preview
from adacc_compile.model_source import resolve_model


def _qkv() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))


def test_dropout_is_traced_inside_the_kernel_and_the_function_restored():
    q, k, v = _qkv()
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    original = F.scaled_dot_product_attention
    with plan_preview.attention_as_on_a_gpu():
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True), plain)
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, None, 0.5, True), plain)
    assert F.scaled_dot_product_attention is original
    torch.manual_seed(0)
    assert not torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True), plain)


def test_a_traced_gpt_with_attention_dropout_saves_no_scores():
    source = resolve_model("adacc_cli_factories:tiny_gpt_with_attention_dropout")
    traced = plan_preview.trace(source, batch=2, seq=16, dtype=torch.float32)
    targets = {str(n.target) for n in traced.joint.gm.graph.nodes if n.op == "call_function"}
    assert any("scaled_dot_product_flash_attention" in t for t in targets), sorted(targets)
    assert not any("bmm" in t for t in targets), "the math path's score matmuls were traced"
    assert any("native_dropout" in t or "philox" in t or "rand" in t for t in targets), "the other dropouts stay"
