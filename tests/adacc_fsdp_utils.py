"""Worker for the FSDP2 tests (`tests/distributed/test_fsdp2.py`), in an
importable module for the same reason as `adacc_dist_utils`: spawned ranks
import the function they run by name."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import torch

from adacc_dist_utils import _setup, reporting


def shard_and_compile(model: torch.nn.Module, backend: str, options: dict[str, Any], mode: str) -> torch.nn.Module:
    """The two recipes: ``"blocks"`` is torchtitan's (each block compiled in
    place, then every block and the root sharded); ``"whole"`` shards first
    and compiles the root."""
    from torch.distributed.fsdp import fully_shard

    if mode == "blocks":
        for block in model.blocks:
            block.compile(backend=backend, options=options)
            fully_shard(block)
        fully_shard(model)
        return model
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return torch.compile(model, backend=backend, options=options)


def fsdp2_worker(rank: int, world_size: int, port: int, out_dir: str, backend: str, mode: str, steps: int) -> None:
    """Trains a small GPT sharded over the ranks (each on its own batch) and
    the unsharded model on all the batches, ``steps`` AdamW steps; reports
    every step's loss and worst per-parameter gradient error."""
    import torch.distributed as dist

    from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
    from adacc_test_utils import relative_error

    result: dict[str, Any] = {"rank": rank, "losses": [], "dense_losses": [], "grad_errors": []}
    _setup(rank, world_size, port)
    with reporting(out_dir, rank, result):
        cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab_size=64)
        dense, model = init_weights(GPT(cfg)), init_weights(GPT(cfg))
        batches = [gpt_batch(cfg, 2, torch.Generator().manual_seed(r)) for r in range(world_size)]
        dump = os.path.join(out_dir, f"dump{rank}")
        compiled = shard_and_compile(model, backend, {"dump_dir": dump}, mode)
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (dense, model)]
        for _ in range(steps):
            dense_losses = [dense(*batch) for batch in batches]
            (sum(dense_losses) / world_size).backward()  # FSDP averages gradients over ranks
            loss = compiled(*batches[rank])
            loss.backward()
            result["losses"].append(loss.item())
            result["dense_losses"].append(dense_losses[rank].item())
            expected = dict(dense.named_parameters())
            errors = {
                name: relative_error(param.grad.full_tensor(), expected[name].grad)
                for name, param in model.named_parameters()
            }
            worst = max(errors, key=errors.get)
            result["grad_errors"].append([worst, errors[worst]])
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        summaries = sorted(pathlib.Path(dump).glob("graph_*/summary.json"))
        result["summaries"] = [json.loads(path.read_text()) for path in summaries]
        dist.barrier()
