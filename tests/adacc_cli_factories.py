"""Model factories for the ``adacc plan MODEL=module:factory`` tests."""

from adacc_examples.models import GPT, GPTConfig


def tiny_gpt() -> GPT:
    """Three identical blocks, small enough to trace in seconds."""
    return GPT(GPTConfig(vocab_size=64, seq_len=32, n_layer=3, n_head=2, d_model=32))


def not_a_module() -> int:
    return 3
