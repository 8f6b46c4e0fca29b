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

Room for later graphs (``budget_scope="step"``): a later graph's own step
peak (its activations, its gradients, its loss's logits) comes on top of
what the earlier graphs hold, and it is known only once the later graph is
planned, after the earlier ones ran. Where the later graph's plan cannot
fit beside them, it asks the earlier graphs for the difference
(`ask_room`): each is capped, in proportion to what it holds, at fewer
saved bytes at its forward/backward boundary (`cap_for`). An earlier
graph re-plans once under its cap at its next call, the next step boundary
(`StepBudgetGraph`, or `adaptation.AdaptiveGraph` with ``adapt``): the
first step of a model with graph breaks may exceed a step budget, and
later steps keep it where the earlier graphs' reachable minimum allows.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from adacc_compile import compat
from adacc_compile.passes.annotate import tensor_bytes

if TYPE_CHECKING:
    from adacc_compile.state import PartitionState


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
        self._caps: dict[int, int] = {}
        """Per graph, the saved bytes its boundary may hold so that later
        graphs of the step fit (the lowest asked)."""
        self._after: dict[int, dict[int, int]] = {}
        """Per graph, per later graph: the bytes the later graph's backward
        leaves alive (its parameters' gradients) through this graph's backward."""
        self._planned: dict[int, _Planned] = {}
        """Per graph, what its current plan was made under."""
        self.holds = 0
        """Training-graph calls so far (`hold`): a call whose backward ends
        with one more than at its start ran no other graph in between."""

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
            self.holds += 1

    def release(self, graph: int) -> None:
        with self._lock:
            self._held.pop(graph, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._caps.clear()
            self._after.clear()
            self._planned.clear()

    def ask_room(self, asker: int, over_bytes: int, gradient_bytes: int) -> dict[int, int]:
        """Graph ``asker``'s plan needs ``over_bytes`` more than the budget
        leaves beside the graphs holding now, and its backward leaves
        ``gradient_bytes`` alive through theirs. Caps each holding graph, in
        proportion to what it holds, at that much less, and charges the
        gradients to its backward. Returns the caps set (graph -> saved bytes)."""
        holding = self.holding()
        held = sum(h.saved_bytes for h in holding)
        caps = {}
        with self._lock:
            for h in holding:
                self._after.setdefault(h.graph, {})[asker] = gradient_bytes
                if over_bytes > 0 and held > 0:
                    cap = max(0, h.saved_bytes - math.ceil(over_bytes * h.saved_bytes / held))
                    self._caps[h.graph] = caps[h.graph] = min(cap, self._caps.get(h.graph, cap))
        return caps

    def cap_for(self, graph: int) -> int | None:
        """Saved bytes graph ``graph`` may hold at its boundary (None: no cap)."""
        with self._lock:
            return self._caps.get(graph)

    def later_gradient_bytes(self, graph: int) -> int:
        """Bytes later graphs' backwards leave alive through ``graph``'s backward."""
        with self._lock:
            return sum(self._after.get(graph, {}).values())

    def planned_under(self, graph: int, *, cap: int | None, later_gradients: int, peak: int, budget: int) -> None:
        """Graph ``graph`` was (re-)planned under ``cap`` and
        ``later_gradients``, for a simulated step peak ``peak`` against its
        budget ``budget`` (bytes)."""
        with self._lock:
            self._planned[graph] = _Planned(cap, later_gradients, peak, budget)

    def needs_room(self, graph: int) -> bool:
        """Whether ``graph``'s plan no longer fits what later graphs of the
        step asked since it was made: a lower cap, or more of their
        gradients than its budget has room for beside its own peak."""
        with self._lock:
            planned = self._planned.get(graph)
            if planned is None:
                return False
            cap = self._caps.get(graph)
            if cap is not None and (planned.cap is None or cap < planned.cap):
                return True
            extra = sum(self._after.get(graph, {}).values()) - planned.later_gradients
            return extra > 0 and planned.peak + extra > planned.budget

    def settle(self, graph: int) -> None:
        """``graph`` was asked and answered (re-planned, or could not): no
        further re-plan until a later graph asks again."""
        with self._lock:
            planned = self._planned.get(graph)
            if planned is not None:
                later = sum(self._after.get(graph, {}).values())
                self._planned[graph] = _Planned(
                    self._caps.get(graph), later, planned.peak + max(0, later - planned.later_gradients), planned.budget
                )


@dataclass(frozen=True, slots=True)
class _Planned:
    cap: int | None
    later_gradients: int
    peak: int
    budget: int


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


def ask_earlier_graphs_for_room(state: "PartitionState", ledger: StepLedger = LEDGER) -> dict[int, int]:
    """Under a step budget, after ``state``'s graph is planned: where its
    simulated step peak exceeds what the budget leaves it beside the
    earlier graphs' saved activations, those graphs are asked for the
    difference (`StepLedger.ask_room`), with a warning. Returns the caps."""
    if not state.earlier_graphs or state.timeline is None or state.budget is None:
        return {}
    over = state.timeline.peak_bytes - state.budget.requested_bytes
    caps = ledger.ask_room(state.graph_index, over, parameter_gradient_bytes(state))
    if caps:
        warnings.warn(
            f"adacc: budget_scope='step' with graph breaks: graph {state.graph_index} needs {over} bytes more "
            f"than the budget leaves it beside what graphs {sorted(caps)} hold through it, so this step can "
            f"exceed the budget; at their next call they re-plan to hold at most "
            f"{', '.join(f'{b} bytes (graph {g})' for g, b in sorted(caps.items()))} at their forward/backward "
            f"boundary",
            stacklevel=3,
        )
    return caps


def parameter_gradient_bytes(state: "PartitionState") -> int:
    """Bytes of the gradients ``state``'s backward returns for its static
    inputs (parameters, buffers): they stay alive after it, through the
    backward of earlier graphs. The gradients of its other inputs are an
    earlier graph's tangents, charged by that graph's own backward
    (`lifetimes.backward_base`)."""
    assert state.info is not None
    output = next(n for n in reversed(state.joint.graph.nodes) if n.op == "output")
    grads = list(output.args[0])[state.num_fwd_outputs :]
    primals = [n for n in state.joint.graph.nodes if compat.is_primal(n)]
    static = set(state.info.static_lifetime_input_nodes)
    if len(grads) != len(primals):  # not AOTAutograd's layout: every gradient, to be safe
        return sum(tensor_bytes(g.meta.get("val")) for g in grads if isinstance(g, torch.fx.Node))
    return sum(
        tensor_bytes(g.meta.get("val"))
        for p, g in zip(primals, grads)
        if isinstance(g, torch.fx.Node) and p in static
    )


class StepBudgetGraph:
    """A compiled training graph under a step budget: at the first call
    after a later graph of the step asked it for room (`StepLedger
    .ask_room`), the step boundary, it is planned and compiled again under
    its cap (``replan``) and runs that from then on.

    With ``measured``, the first training call that runs no other graph is
    measured (`step_measure`); ``measured(peak_bytes)`` says whether to
    re-plan, which happens at the next call, once.

    Steps in flight keep their own backward (AOTAutograd's autograd node
    holds it). With ``adapt``, `adaptation.AdaptiveGraph` does the same."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        replan: Callable[[tuple[Any, ...]], Callable[..., Any] | None],
        graph: int,
        ledger: StepLedger = LEDGER,
        *,
        measured: Callable[[int], bool] | None = None,
    ) -> None:
        self.compiled = compiled
        self.replan = replan
        self.graph = graph
        self.ledger = ledger
        self.replans = 0
        self.measured = measured
        self._probe: object | None = None
        """The measurement in flight (its backward has not run yet)."""
        self._correct = False

    def __call__(self, *args: Any) -> Any:
        if self._correct or self.ledger.needs_room(self.graph):
            compiled = self.replan(args)
            self.replans += 1
            self._correct = False
            self.ledger.settle(self.graph)
            if compiled is not None:
                self.compiled = compiled
        if self.measured is None or self.ledger.held_bytes():
            return self.compiled(*args)  # measured already, or after a graph break
        from adacc_compile.step_measure import StepPeakProbe, measured_call

        if self._probe is not None:  # the last measured call never ran its backward
            self._probe.stop()  # type: ignore[attr-defined]
        probe = self._probe = StepPeakProbe.for_inputs(args)
        if probe is None:
            return self.compiled(*args)
        holds = self.ledger.holds

        def done(peak: int | None) -> None:
            if self._probe is not probe:
                return  # given up for a later call
            self._probe = None
            if peak is None:
                return  # no backward: a later call is measured
            alone, self.measured = self.measured, None
            if alone is not None and self.ledger.holds == holds + 1:
                self._correct = alone(peak)

        return measured_call(self.compiled, args, probe, done)
