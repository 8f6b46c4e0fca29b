"""Workers for the pipeline-parallel tests (spawned gloo ranks on CPU).

They live in an importable module for the same reason as
`adacc_dist_utils`: spawned children import the worker by name. Each rank
builds the same seeded GPT, computes the unpipelined step on the whole
batch eagerly (the reference), then runs its own stage compiled by adacc
in a pipelined step and compares its parameters' gradients.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from adacc_dist_utils import _setup, reporting

PIPELINE_OPTIONS = {
    "device_profile": "h100",  # fixed costs: the plan does not follow this machine's load
    "accuracy": "lossless",
}


AHEAD_CAP = 100_000
"""Bytes a micro-batch's recomputation run ahead may hold (about half of
what the 2-block stages' gradient-independent values total)."""


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_gpt(n_layer: int, d_model: int = 32, seq_len: int = 16):
    from adacc_examples.models import GPT, GPTConfig, init_weights

    cfg = GPTConfig(n_layer=n_layer, d_model=d_model, n_head=4, seq_len=seq_len, vocab_size=64)
    model = init_weights(GPT(cfg), seed=0)
    return cfg, model


def _reference(model, idx, targets) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(idx, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _relative_errors(stage, model, reference: dict[str, torch.Tensor]) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for p in stage.parameters():
        name = names[id(p)]
        expected = reference[name].double()
        actual = p.grad.detach().double() if p.grad is not None else torch.zeros_like(expected)
        out[name] = float((actual - expected).norm() / expected.norm().clamp_min(1e-30))
    return out


def pipeline_worker(
    rank: int, world_size: int, port: int, out_dir: str, runner: str, budgets: list[Any], n_layer: int,
    split_points: list[int], n_microbatches: int,
) -> None:
    """``runner``: "schedule_1f1b" (torch.distributed.pipelining's
    Schedule1F1B over a stage compiled with ``backend="adacc_eager"``),
    "loop_on_demand" or "loop_ahead" (`one_f_one_b.run_1f1b` over a stage
    compiled by `RecomputeAheadBackend`, recomputation on demand or ahead)."""
    import torch.distributed as dist

    from adacc_compile.partitioner import AdaccPartitioner
    from adacc_compile.config import AdaccConfig
    from adacc_examples.gpt_stages import gpt_stages
    from adacc_compile.pipelining.one_f_one_b import run_1f1b
    from adacc_compile.pipelining.recompute_ahead import RecomputeAheadBackend
    from adacc_examples.models import gpt_batch

    result: dict[str, Any] = {"rank": rank, "runner": runner}
    _setup(rank, world_size, port)
    with reporting(out_dir, rank, result):
        cfg, model = build_gpt(n_layer)
        batch = 2 * n_microbatches
        idx, targets = gpt_batch(cfg, batch, torch.Generator().manual_seed(0))
        result["reference_loss"], reference = _reference(model, idx, targets)
        stage = gpt_stages(model, split_points)[rank]
        options = {**PIPELINE_OPTIONS, "memory_budget": budgets[rank]}
        inputs = list(idx.chunk(n_microbatches))
        target_mbs = list(targets.chunk(n_microbatches))
        activation = (batch // n_microbatches, cfg.seq_len, cfg.d_model)
        first, last = rank == 0, rank == world_size - 1
        if runner == "schedule_interleaved_1f1b":
            from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

            # Two chunks per rank: virtual stages rank and rank + world_size.
            all_stages = gpt_stages(model, split_points)
            mine = [all_stages[rank], all_stages[rank + world_size]]
            partitioners, pipe_stages = [], []
            for index, chunk in zip((rank, rank + world_size), mine):
                partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
                compiled = torch.compile(chunk, backend=partitioner.backend(eager=True))
                pipe_stages.append(PipelineStage(compiled, index, 2 * world_size, torch.device("cpu")))
                partitioners.append(partitioner)
            schedule = ScheduleInterleaved1F1B(pipe_stages, n_microbatches, loss_fn=token_loss)
            _step(schedule, first, last, idx, targets, result)
            reports = [r for p in partitioners for r in p.reports]
            stage = torch.nn.ModuleList(mine)
        elif runner == "schedule_1f1b":
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B

            partitioner = AdaccPartitioner(AdaccConfig.from_options(options))
            compiled = torch.compile(stage, backend=partitioner.backend(eager=True))
            pipe_stage = PipelineStage(compiled, rank, world_size, torch.device("cpu"))
            schedule = Schedule1F1B(pipe_stage, n_microbatches, loss_fn=token_loss)
            _step(schedule, first, last, idx, targets, result)
            reports = partitioner.reports
        else:
            backend = RecomputeAheadBackend(options, enabled=runner == "loop_ahead", max_ahead_bytes=AHEAD_CAP)
            compiled = torch.compile(stage, backend=backend)
            for step in range(2):  # the first step compiles; the second is the one inspected
                stage.zero_grad(set_to_none=True)
                backend.new_step()
                record = run_1f1b(
                    compiled, rank=rank, n_ranks=world_size, inputs=inputs if first else None,
                    targets=target_mbs if last else None, loss_fn=token_loss, activation_shape=activation,
                    n_microbatches=n_microbatches, before_gradient_wait=backend.recompute_ahead,
                )
            result["step_seconds"] = record.seconds
            if last:
                result["loss"] = sum(record.losses) / n_microbatches
            result["gradient_waits"] = record.gradient_waits
            result["gradient_sends"] = record.gradient_sends
            result["prologues"] = [
                {"microbatch": e.microbatch, "ahead": e.ahead, "start": e.start, "end": e.end,
                 "held_bytes": e.held_bytes} for e in backend.events
            ]
            result["max_held_bytes"] = backend.max_held_bytes
            result["split"] = backend.split_summary()
            reports = backend.reports
        result["relative_errors"] = _relative_errors(stage, model, reference)
        result["summaries"] = [r["summary"] for r in reports]
        dist.barrier()


def _step(schedule: Any, first: bool, last: bool, idx: torch.Tensor, targets: torch.Tensor, result: dict) -> None:
    """One step of a ``torch.distributed.pipelining`` schedule from this rank's
    side; the last stage records the mean micro-batch loss."""
    losses: list[torch.Tensor] = []
    if first:
        schedule.step(idx)
    elif last:
        schedule.step(target=targets, losses=losses)
    else:
        schedule.step()
    if last:
        result["loss"] = float(torch.stack([v.detach() for v in losses]).mean())
