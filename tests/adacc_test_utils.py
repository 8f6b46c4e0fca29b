"""Helpers for end-to-end tests: compile with a partitioner we can inspect."""

from __future__ import annotations

from typing import Any, Callable

import torch

from adacc_compile.config import AdaccConfig
from adacc_compile.models import GPT, MLP, GPTConfig, Llama, LlamaConfig, gpt_batch, init_weights
from adacc_compile.partitioner import AdaccPartitioner


def compile_with_reports(
    model: torch.nn.Module, backend: str, options: dict[str, Any], **compile_kwargs: Any
) -> tuple[Callable[..., Any], AdaccPartitioner]:
    """``torch.compile`` through the same code path as ``backend=...``, keeping
    a handle on the partitioner so tests can read its reports."""
    partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
    eager = {"adacc": False, "adacc_eager": True}[backend]
    return torch.compile(model, backend=partitioner.backend(eager=eager), **compile_kwargs), partitioner


def loss_and_grads(model: torch.nn.Module, fn: Callable[..., torch.Tensor], *args, seed: int = 1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = fn(*args)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def assert_same(expected, actual, *, atol: float, rtol: float) -> None:
    (loss_e, grads_e), (loss_a, grads_a) = expected, actual
    torch.testing.assert_close(loss_a, loss_e, atol=atol, rtol=rtol)
    assert grads_e.keys() == grads_a.keys()
    for name in grads_e:
        torch.testing.assert_close(grads_a[name], grads_e[name], atol=atol, rtol=rtol, msg=name)


def build(name: str):
    """A tiny model of kind "mlp", "gpt" (with dropout) or "llama" and a batch."""
    if name == "mlp":
        model = init_weights(MLP(d_in=16, d_hidden=64, depth=3))
        gen = torch.Generator().manual_seed(0)
        return model, (torch.randn(8, 16, generator=gen), torch.randn(8, generator=gen))
    if name == "gpt":
        cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64, dropout=0.1)
        return init_weights(GPT(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
    cfg = LlamaConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64, ffn_dim=64)
    return init_weights(Llama(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))


