"""A tensor-parallel GPT-style model (Megatron-LM layout) on functional collectives.

Each block shards attention by heads and the MLP by hidden units over the
ranks of one process group:

    x ─ LN ─ f ─ [QKV, column-parallel] ─ attention(local heads) ─ [proj, row-parallel] ─ g ─ + ─
    x ─ LN ─ f ─ [fc, column-parallel] ─ GELU ─ [fc_proj, row-parallel] ─ g ─ + ─

``f`` is the identity forward and an all-reduce of the input gradient
backward; ``g`` an all-reduce forward and the identity backward. Both are
``torch.autograd.Function`` over ``torch.distributed._functional_collectives``,
so a compiled backward graph holds ``_c10d_functional.all_reduce`` +
``wait_tensor`` pairs: the communication windows adacc fills with
recomputation. Embeddings, final norm and LM head are replicated.

`TPGPT.from_dense` slices a dense `adacc_examples.models.GPT` (dropout 0), so
tests can compare the sharded model's loss and gradients with the dense
model's. Run standalone on CPU processes with gloo::

    python -m adacc_examples.tp_example --world-size 2 --backend adacc_eager
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group_name: str) -> torch.Tensor:
        ctx.group_name = group_name
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(grad, "sum", ctx.group_name), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group_name: str) -> torch.Tensor:
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(x, "sum", group_name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _CopyToTensorParallel.apply(x, group_name)


def reduce_from_tp(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _ReduceFromTensorParallel.apply(x, group_name)


class TPAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, tp: int, group_name: str):
        super().__init__()
        if n_head % tp:
            raise ValueError(f"n_head={n_head} is not divisible by the tensor-parallel size {tp}")
        self.group_name = group_name
        self.local_heads = n_head // tp
        self.head_dim = d_model // n_head
        local = self.local_heads * self.head_dim
        self.qkv = nn.Linear(d_model, 3 * local)  # column-parallel
        self.proj = nn.Linear(local, d_model, bias=False)  # row-parallel
        self.proj_bias = nn.Parameter(torch.zeros(d_model))  # added after the reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = copy_to_tp(x, self.group_name)
        q, k, v = self.qkv(h).view(b, t, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, self.local_heads * self.head_dim)
        return reduce_from_tp(self.proj(y), self.group_name) + self.proj_bias


class TPMLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, tp: int, group_name: str):
        super().__init__()
        if hidden % tp:
            raise ValueError(f"MLP width {hidden} is not divisible by the tensor-parallel size {tp}")
        self.group_name = group_name
        self.fc = nn.Linear(d_model, hidden // tp)  # column-parallel
        self.fc_proj = nn.Linear(hidden // tp, d_model, bias=False)  # row-parallel
        self.fc_proj_bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = copy_to_tp(x, self.group_name)
        return reduce_from_tp(self.fc_proj(F.gelu(self.fc(h))), self.group_name) + self.fc_proj_bias


class TPBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, tp: int, group_name: str):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = TPAttention(cfg.d_model, cfg.n_head, tp, group_name)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = TPMLP(cfg.d_model, cfg.mlp_ratio * cfg.d_model, tp, group_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TPGPT(nn.Module):
    """GPT with tensor-parallel blocks; ``forward(idx, targets)`` -> mean loss.

    Args:
        cfg: model shape (``dropout`` must be 0: random masks would differ
            between ranks and from the dense reference).
        tp: tensor-parallel size (ranks in ``group_name``).
        group_name: the process group's name (``dist.group.WORLD.group_name``
            for all ranks); a string keeps the module traceable.
    """

    def __init__(self, cfg: GPTConfig, tp: int, group_name: str):
        super().__init__()
        if cfg.dropout:
            raise ValueError("TPGPT needs dropout=0")
        self.cfg, self.tp = cfg, tp
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(TPBlock(cfg, tp, group_name) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    @staticmethod
    def from_dense(dense: GPT, rank: int, tp: int, group_name: str) -> "TPGPT":
        """The shard of ``dense`` that ``rank`` holds."""
        cfg = dense.cfg
        model = TPGPT(cfg, tp, group_name)
        d, heads = cfg.d_model, cfg.n_head
        head_dim, local_heads = d // heads, heads // tp
        rows = torch.arange(rank * local_heads * head_dim, (rank + 1) * local_heads * head_dim)
        hidden = cfg.mlp_ratio * d
        cols = torch.arange(rank * hidden // tp, (rank + 1) * hidden // tp)
        with torch.no_grad():
            for name in ("wte", "wpe", "ln_f", "lm_head"):
                getattr(model, name).load_state_dict(getattr(dense, name).state_dict())
            for mine, ref in zip(model.blocks, dense.blocks):
                mine.ln_1.load_state_dict(ref.ln_1.state_dict())
                mine.ln_2.load_state_dict(ref.ln_2.state_dict())
                qkv_rows = torch.cat([rows + i * d for i in range(3)])
                mine.attn.qkv.weight.copy_(ref.attn.qkv.weight[qkv_rows])
                mine.attn.qkv.bias.copy_(ref.attn.qkv.bias[qkv_rows])
                mine.attn.proj.weight.copy_(ref.attn.proj.weight[:, rows])
                mine.attn.proj_bias.copy_(ref.attn.proj.bias)
                mine.mlp.fc.weight.copy_(ref.fc.weight[cols])
                mine.mlp.fc.bias.copy_(ref.fc.bias[cols])
                mine.mlp.fc_proj.weight.copy_(ref.fc_proj.weight[:, cols])
                mine.mlp.fc_proj_bias.copy_(ref.fc_proj.bias)
        return model


def dense_grad_shard(dense: GPT, name: str, rank: int, tp: int) -> torch.Tensor:
    """The slice of the dense model's gradient that the TP parameter ``name``
    (a `TPGPT` parameter name) holds on ``rank``."""
    cfg = dense.cfg
    d, heads = cfg.d_model, cfg.n_head
    head_dim, local_heads = d // heads, heads // tp
    rows = torch.arange(rank * local_heads * head_dim, (rank + 1) * local_heads * head_dim)
    hidden = cfg.mlp_ratio * d
    cols = torch.arange(rank * hidden // tp, (rank + 1) * hidden // tp)
    params = dict(dense.named_parameters())
    parts = name.split(".")
    if parts[0] != "blocks":
        return params[name].grad
    prefix, leaf = f"blocks.{parts[1]}.", ".".join(parts[2:])
    qkv_rows = torch.cat([rows + i * d for i in range(3)])
    table = {
        "ln_1.weight": ("ln_1.weight", None),
        "ln_1.bias": ("ln_1.bias", None),
        "ln_2.weight": ("ln_2.weight", None),
        "ln_2.bias": ("ln_2.bias", None),
        "attn.qkv.weight": ("attn.qkv.weight", (0, qkv_rows)),
        "attn.qkv.bias": ("attn.qkv.bias", (0, qkv_rows)),
        "attn.proj.weight": ("attn.proj.weight", (1, rows)),
        "attn.proj_bias": ("attn.proj.bias", None),
        "mlp.fc.weight": ("fc.weight", (0, cols)),
        "mlp.fc.bias": ("fc.bias", (0, cols)),
        "mlp.fc_proj.weight": ("fc_proj.weight", (1, cols)),
        "mlp.fc_proj_bias": ("fc_proj.bias", None),
    }
    dense_name, index = table[leaf]
    grad = params[prefix + dense_name].grad
    return grad if index is None else grad.index_select(index[0], index[1])


def build(cfg: GPTConfig, rank: int, tp: int, group_name: str, seed: int = 0) -> tuple[TPGPT, GPT]:
    """(this rank's TP shard, the dense reference), from the same weights."""
    dense = init_weights(GPT(cfg), seed=seed)
    return TPGPT.from_dense(dense, rank, tp, group_name), dense


def init_gloo(rank: int, world_size: int, port: int) -> str:
    """Joins a gloo process group on localhost; returns the world group's name."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return dist.group.WORLD.group_name


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _demo(rank: int, world_size: int, port: int, backend: str, budget: float) -> None:
    torch.set_num_threads(1)
    group = init_gloo(rank, world_size, port)
    try:
        cfg = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab_size=128)
        model, _dense = build(cfg, rank, world_size, group)
        compiled = torch.compile(model, backend=backend, options={"memory_budget": budget})
        idx, targets = gpt_batch(cfg, 4, torch.Generator().manual_seed(0))
        loss = compiled(idx, targets)
        loss.backward()
        if rank == 0:
            print(f"rank 0: loss {loss.item():.5f} on {world_size} gloo ranks with backend={backend}")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default="adacc_eager")
    parser.add_argument("--budget", type=float, default=0.3)
    args = parser.parse_args(argv)
    mp.spawn(_demo, args=(args.world_size, free_port(), args.backend, args.budget), nprocs=args.world_size)


if __name__ == "__main__":
    main()
