"""Dropout replayed from its mask: the output of ``aten.native_dropout`` is
rewritten as ``input * mask * scale``, so the planner may recompute it from
the mask instead of keeping it.

Why: dropout is random, and adacc never re-runs a random op in the backward
(no RNG replay, `candidates`). Where dropout reaches the joint graph as one
``native_dropout`` node (Inductor with ``fallback_random=True``), its float
output (the attention probabilities after dropout: 12 MiB per block on
Hugging Face GPT-2 at batch 8, seq 256) could only be kept, although
everything random about it is in its boolean mask, which the backward keeps
anyway and which the lossless ``bitmask`` codec packs 8x.
Full activation checkpointing gets that value back by replaying the RNG;
here it comes back from the mask, bit for bit: ATen computes the output as
``input.mul(mask).mul_(scale)`` (CPU; the CUDA kernel and PyTorch's own
decomposition compute the same two products), and this rewrite computes
exactly those two products, so the forward values, the loss and the
gradients are unchanged.

Applied to graphs Inductor compiles (the prepare stage, `Realization
.INDUCTOR`), where the two products fuse into one pass. Not for
``adacc_eager``: op by op, the products are two more tensors and
``native_dropout`` still allocates the output nobody reads, which the
memory models do not count (their bound broke on random models with
dropout). Where Inductor decomposes dropout itself (``fallback_random=
False``, the default), the graph already holds ``rand_like > p`` and the
products, and nothing here applies. Evaluation-mode dropout
(``train=False``) is a copy and is left alone.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

aten = torch.ops.aten


def replay_dropout_from_masks(gm: fx.GraphModule) -> int:
    """Rewrites every training ``native_dropout`` output in ``gm`` in place;
    returns how many were rewritten."""
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.native_dropout.default:
            continue
        x, p = node.args[0], float(node.args[1])
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        if train is False or not isinstance(x, fx.Node):
            continue
        outputs = {user.args[1]: user for user in node.users
                   if user.op == "call_function" and user.target is operator.getitem}
        out = outputs.get(0)
        if out is None or not out.users:
            continue
        mask = outputs.get(1)
        if mask is None:
            with graph.inserting_after(out):
                mask = graph.call_function(operator.getitem, (node, 1))
            mask.meta = {**out.meta, "val": node.meta["val"][1]}
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)  # as ATen computes it
        anchor = mask if _comes_after(mask, out) else out
        with graph.inserting_after(anchor):
            masked = graph.call_function(aten.mul.Tensor, (x, mask))
            with graph.inserting_after(masked):
                scaled = graph.call_function(aten.mul.Tensor, (masked, scale))
        for new in (masked, scaled):
            new.meta = {k: v for k, v in out.meta.items() if k not in ("val", "tensor_meta")}
            new.meta["val"] = _like(out.meta.get("val"))
        out.replace_all_uses_with(scaled)
        graph.erase_node(out)
        rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def _comes_after(a: fx.Node, b: fx.Node) -> bool:
    for n in b.graph.nodes:
        if n is a:
            return False
        if n is b:
            return True
    return False


def _like(val: object) -> object:
    """A new example value with ``val``'s metadata: both products have the
    dropout output's shape, strides and dtype. A fresh tensor each, never
    ``val`` itself (shared example values would read as aliases)."""
    if not isinstance(val, torch.Tensor):
        return val
    mode = getattr(val, "fake_mode", None)
    make = lambda: torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device)  # noqa: E731
    if mode is None:
        return make()
    with mode:
        return make()
