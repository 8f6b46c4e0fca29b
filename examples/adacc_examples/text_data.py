"""Real English text for small training runs, without downloading anything.

The source is the standard library's ``pydoc_data.topics``: the help texts
that ``help("topic")`` prints (about 465k characters of English prose and
code from the Python reference manual), shipped with every CPython. It is
tokenized at the character level, which keeps the vocabulary (about 100
symbols) and therefore the model small, so accuracy studies of activation
compression (`bench/bench_accuracy.py`) can train for a few hundred steps on
a CPU.

Batches are deterministic: a seeded generator picks the window offsets, so
every variant of an experiment trains on exactly the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def pydoc_topics_text() -> str:
    """The help topics of ``pydoc_data.topics`` in sorted key order, joined by
    blank lines (sorted so the corpus does not depend on dict order)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@dataclass(frozen=True, slots=True)
class CharCorpus:
    """A character-level corpus split into a train and a validation part."""

    chars: tuple[str, ...]
    """The vocabulary: every distinct character, sorted (id = index)."""
    train: torch.Tensor
    """Token ids (int64) of the first ``1 - val_fraction`` of the text."""
    val: torch.Tensor
    """Token ids of the rest."""

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())

    def batches(
        self, *, batch: int, seq_len: int, steps: int, seed: int = 0, split: str = "train"
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``steps`` batches of ``(idx, targets)``, each ``[batch, seq_len]``,
        targets shifted by one character; random windows from a generator
        seeded with ``seed``, so the same arguments give the same batches."""
        data = self.train if split == "train" else self.val
        if data.numel() <= seq_len + 1:
            raise ValueError(f"the {split} split ({data.numel()} tokens) is shorter than seq_len + 1")
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.arange(seq_len + 1)
        out = []
        for _ in range(steps):
            starts = torch.randint(0, data.numel() - seq_len - 1, (batch, 1), generator=gen)
            window = data[starts + offsets]
            out.append((window[:, :-1].contiguous(), window[:, 1:].contiguous()))
        return out


def load_char_corpus(text: str | None = None, *, val_fraction: float = 0.1) -> CharCorpus:
    """Tokenizes ``text`` (default: `pydoc_topics_text`) by character."""
    if text is None:
        text = pydoc_topics_text()
    chars = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * (1.0 - val_fraction))
    return CharCorpus(chars=chars, train=ids[:cut], val=ids[cut:])
