"""Cutting a GPT-2-style model into pipeline stages.

Duck-typed on the attribute names nanoGPT uses (and
``adacc_examples.models.GPT``): ``wte``, ``wpe``, ``drop``, ``blocks``,
``ln_f``, ``lm_head``. A stage shares the model's modules (no copies), so
the gradients a pipelined step leaves in the stages' parameters are the
model's own and can be compared with an unpipelined step directly.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn


class GPTStage(nn.Module):
    """Blocks ``first .. end - 1``; the first stage also embeds the token
    ids, the last also applies the final norm and the head (logits out)."""

    def __init__(self, model: nn.Module, first: int, end: int, *, is_first: bool, is_last: bool):
        super().__init__()
        self.is_first, self.is_last = is_first, is_last
        if is_first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        self.blocks = nn.ModuleList(model.blocks[first:end])
        if is_last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.ln_f(x))
        return x


def gpt_stages(model: nn.Module, split_points: Sequence[int]) -> list[GPTStage]:
    """One `GPTStage` per pipeline stage; ``split_points`` are the first
    block of every stage after the first (`partition.Partition.split_points`
    counted in blocks)."""
    bounds = [0, *split_points, len(model.blocks)]
    last = len(bounds) - 2
    return [GPTStage(model, bounds[s], bounds[s + 1], is_first=s == 0, is_last=s == last) for s in range(last + 1)]
