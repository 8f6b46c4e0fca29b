"""Recompute ahead: a pipeline stage runs its backward's recomputation
while it waits for the gradient from the next stage.

Mechanism (eager split graphs, ``backend="adacc_eager"`` semantics): the
stage is compiled through `RecomputeAheadBackend`, which plans with the
same `AdaccPartitioner` and wraps the two graphs AOTAutograd produces:

* the **forward** runner records each call's saved values (the forward's
  trailing outputs, which AOTAutograd hands the backward unchanged) in a
  FIFO of micro-batches awaiting their backward;
* the **backward** is split (`backward_split`) into a gradient-independent
  prologue, capped at ``max_ahead_bytes`` of values held, and an epilogue.
  Its runner looks up the micro-batch by the storage of its saved inputs:
  if `recompute_ahead` already ran the prologue for it, the epilogue runs
  with those values; otherwise the original backward graph runs
  (recomputation on demand, exactly adacc's plan and its memory profile).

The schedule calls `RecomputeAheadBackend.recompute_ahead` after posting
the gradient receive and before waiting on it (`one_f_one_b`). What the
prologue produced is held from then until the backward consumes it;
`held_bytes` / `max_held_bytes` record it. The cap is what keeps it
bounded: an uncapped prologue holds every recomputed value of the stage at
once (for a stage that recomputes everything, about what keeping the
micro-batch's activations would have held); the partitioner's stage model
leaves room for one layer's working set, which is the cap the benchmark
passes.

Inductor's fused backward is one kernel program, not two graphs, so the
ahead path runs the split graphs eagerly; the plan is the same either way.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx

from adacc_compile import compat_inductor
from adacc_compile.config import AdaccConfig
from adacc_compile.partitioner import AdaccPartitioner

from .backward_split import SplitBackward, split_backward


def _key(values: Sequence[Any]) -> tuple:
    return tuple(
        (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)) if isinstance(v, torch.Tensor) else None
        for v in values
    )


def _nbytes(values: Sequence[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


@dataclass(slots=True)
class _GraphPair:
    """One Dynamo graph's forward and backward, wrapped."""

    index: int
    split: SplitBackward | None = None
    prologue: Any = None
    epilogue: Any = None
    pending: "collections.OrderedDict[tuple, tuple[int, list[Any]]]" = field(default_factory=collections.OrderedDict)
    """Saved values of forwards whose backward has not run, oldest first,
    with the forward's call number."""
    calls: int = 0
    ready: dict[tuple, collections.deque] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class PrologueEvent:
    graph: int
    microbatch: int
    """Call number of the forward whose backward this prologue serves
    (-1: a backward whose forward was not recorded)."""
    ahead: bool
    """Always True: a backward run on demand runs the original graph and
    records no prologue."""
    start: float
    end: float
    """``time.time()``: comparable across processes on one machine."""
    held_bytes: int


class RecomputeAheadBackend:
    """A ``torch.compile`` backend that plans like ``adacc_eager`` and lets
    the caller run each micro-batch's recomputation early.

    ``enabled=False`` gives the same plans and graphs with the prologue
    always run on demand (the comparison the benchmark makes)."""

    def __init__(self, options: dict[str, Any] | AdaccConfig, *, enabled: bool = True,
                 max_ahead_bytes: int | None = None):
        config = options if isinstance(options, AdaccConfig) else AdaccConfig.from_options(options)
        self.partitioner = AdaccPartitioner(config)
        self.enabled = enabled
        self.max_ahead_bytes = max_ahead_bytes
        """Cap on the bytes one micro-batch's prologue may leave held
        (None: everything gradient-independent runs ahead)."""
        self.pairs: list[_GraphPair] = []
        self.events: list[PrologueEvent] = []
        self.held_bytes = 0
        """Bytes of prologue results now waiting for their backward."""
        self.max_held_bytes = 0

    @property
    def reports(self) -> list[dict[str, Any]]:
        return self.partitioner.reports

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        pair = _GraphPair(index=len(self.pairs))
        self.pairs.append(pair)
        partitioner = self.partitioner
        partitioner.real_inputs = list(example_inputs)
        partitioner.eager = True
        return compat_inductor.aot_compile_with(
            gm, example_inputs,
            fw_compiler=lambda fw, ex: self._forward_runner(pair, fw),
            bw_compiler=lambda bw, ex: self._backward_runner(pair, bw),
            partition_fn=partitioner,
        )

    def _forward_runner(self, pair: _GraphPair, fw: fx.GraphModule) -> Any:
        run = compat_inductor.interpret(fw)

        def forward(args: list[Any]) -> Any:
            outputs = run(args)
            if self.enabled and pair.split is not None and torch.is_grad_enabled() is False:
                saved = list(outputs[len(outputs) - pair.split.num_saved:])
                pair.pending[_key(saved)] = (pair.calls, saved)
            pair.calls += 1
            return outputs

        forward._boxed_call = True  # type: ignore[attr-defined]
        return forward

    def _backward_runner(self, pair: _GraphPair, bw: fx.GraphModule) -> Any:
        original = compat_inductor.interpret(bw)
        split = split_backward(bw, max_ahead_bytes=self.max_ahead_bytes)
        if split is None:
            return original
        pair.split = split
        pair.prologue = compat_inductor.interpret(split.prologue)
        pair.epilogue = compat_inductor.interpret(split.epilogue)

        def backward(args: list[Any]) -> Any:
            key = _key(args[: split.num_saved])
            pair.pending.pop(key, None)
            waiting = pair.ready.get(key)
            if not waiting:
                return original(args)  # on demand: the plan's own backward
            values = waiting.popleft()
            if not waiting:
                del pair.ready[key]
            self.held_bytes -= _nbytes(values)
            inputs = list(args) + list(values)
            args.clear()
            del values
            return pair.epilogue(inputs)

        backward._boxed_call = True  # type: ignore[attr-defined]
        return backward

    def _run_prologue(self, pair: _GraphPair, saved: list[Any], *, microbatch: int) -> Any:
        start = time.time()
        values = pair.prologue(saved)
        self.events.append(PrologueEvent(graph=pair.index, microbatch=microbatch, ahead=True,
                                         start=start, end=time.time(), held_bytes=_nbytes(values)))
        return values

    def recompute_ahead(self) -> int:
        """Runs the prologue of the oldest micro-batch of each graph whose
        forward ran and whose backward (and prologue) has not; returns the
        bytes now held for those backwards. A no-op when disabled."""
        if not self.enabled:
            return 0
        for pair in self.pairs:
            if pair.split is None or not pair.pending:
                continue
            key, (microbatch, saved) = pair.pending.popitem(last=False)
            values = self._run_prologue(pair, saved, microbatch=microbatch)
            del saved
            pair.ready.setdefault(key, collections.deque()).append(values)
            self.held_bytes += _nbytes(values)
        self.max_held_bytes = max(self.max_held_bytes, self.held_bytes)
        return self.held_bytes

    def new_step(self) -> None:
        """Starts a step: events cleared, forwards numbered from 0 again
        (what is still pending from an unfinished step stays pending)."""
        self.events.clear()
        for pair in self.pairs:
            pair.calls = 0

    def split_summary(self) -> list[dict[str, Any]]:
        return [
            {"graph": p.index, "prologue_nodes": p.split.prologue_nodes if p.split else 0,
             "independent_nodes": p.split.independent_nodes if p.split else 0,
             "held_values": len(p.split.held) if p.split else 0,
             "held_bytes": p.split.held_bytes if p.split else 0}
            for p in self.pairs
        ]
