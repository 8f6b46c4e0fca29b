"""Model factories for the ``adacc plan MODEL=module:factory`` tests."""

import torch

from adacc_examples.models import GPT, GPTConfig


def tiny_gpt() -> GPT:
    """Three identical blocks, small enough to trace in seconds."""
    return GPT(GPTConfig(vocab_size=64, seq_len=32, n_layer=3, n_head=2, d_model=32))


def not_a_module() -> int:
    return 3


class _BreaksBeforeLoss(GPT):
    def forward(self, ids, labels):
        embedded = self.wte(ids)
        torch._dynamo.graph_break()
        return super().forward(ids, labels) + 0 * embedded.sum()


def breaks_before_loss() -> GPT:
    """Dynamo breaks the graph before the loss (after the embedding)."""
    return _BreaksBeforeLoss(GPTConfig(vocab_size=64, seq_len=32, n_layer=2, n_head=2, d_model=32))


def tiny_gpt_with_attention_dropout() -> GPT:
    """As `tiny_gpt`, with dropout inside the attention (and around it)."""
    return GPT(GPTConfig(vocab_size=64, seq_len=32, n_layer=2, n_head=2, d_model=32, dropout=0.1))
