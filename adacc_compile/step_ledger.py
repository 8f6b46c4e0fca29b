"""The step ledger: bytes that graphs compiled by adacc still hold for
their backward while later graphs of the same step plan and run.

Why: a training step is often several graphs (Dynamo breaks the graph at
code it cannot trace; Hugging Face GPT-2 compiles its body and its loss
separately). The first graph's saved activations stay alive through every
later graph's forward and backward, so a later graph planned alone would
be granted the whole budget again. Graphs are compiled while the first step
runs, in execution order, so when one is planned the ledger knows exactly
what the graphs whose forward ran and whose backward has not yet run are
holding: that is charged against its budget (`PartitionState
.held_by_earlier_graphs`), and a ratio budget is taken of the step's total
at that point (the default partitioner's holdings plus its peak).

What is recorded: each compiled training graph's planned saved bytes (and
PyTorch's default plan's) when its forward returns; the entry is released
when the backward of that call runs (a hook on the outputs' autograd node).
The ledger is process-wide, like the memory it accounts for; a forward
whose backward never runs leaves its entry until the same graph runs again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True, slots=True)
class Holding:
    graph: int
    """Index of the holding graph in the process (compile order)."""
    saved_bytes: int
    default_saved_bytes: int


class StepLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, Holding] = {}
        self._next = 0

    def new_graph(self) -> int:
        with self._lock:
            self._next += 1
            return self._next - 1

    def holding(self) -> list[Holding]:
        with self._lock:
            return sorted(self._held.values(), key=lambda h: h.graph)

    def held_bytes(self) -> int:
        return sum(h.saved_bytes for h in self.holding())

    def held_default_bytes(self) -> int:
        return sum(h.default_saved_bytes for h in self.holding())

    def hold(self, holding: Holding) -> None:
        with self._lock:
            self._held[holding.graph] = holding

    def release(self, graph: int) -> None:
        with self._lock:
            self._held.pop(graph, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


LEDGER = StepLedger()


def tracked(compiled: Callable[..., Any], holding: Holding, ledger: StepLedger = LEDGER) -> Callable[..., Any]:
    """Wraps a compiled training graph (as Dynamo calls it) so that each call holds
    ``holding`` in the ledger until the backward of that call runs."""

    def run(*args: Any) -> Any:
        out = compiled(*args)
        node = next(
            (t.grad_fn for t in (out if isinstance(out, (list, tuple)) else [out])
             if isinstance(t, torch.Tensor) and t.grad_fn is not None),
            None,
        )
        if node is not None:
            ledger.hold(holding)
            node.register_hook(lambda *_: ledger.release(holding.graph))
        return out

    return run
