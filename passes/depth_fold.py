"""Depth folding: plan a deep stack of identical blocks from a shallow trace.

Tracing is most of the time ``adacc plan`` takes on a deep model (Llama-2-7B
at 32 layers: Dynamo and AOTAutograd take 26-36 s, and both grow with the
depth), yet identical blocks tell the planner nothing the first few do not:
block reuse gives them one set of decisions anyway. So the CLI traces a
few blocks and plans as if one middle block, the *repeated* block, stood
``copies`` more times right after itself (`BlockRepeat` on the problem).
Every copy takes the repeated block's decisions, and each figure of the
deep step is the traced step's plus what the copies add:

* saved bytes, the plan's added time and the step's roofline time: ``copies``
  times the repeated block's share (`plan_problem.saved_bytes`,
  `plan_problem.added_seconds`, `DepthFold.step_seconds`);
* activation memory: ``copies`` x H, where H is what one block holds from its
  forward to its backward (kept values, compressed payloads), at every
  forward position from the repeated block on and every backward position
  up to its last (`peak_model.repeat_span`): in the MILP's rows, in the plan
  simulator and in the split graphs' timeline (`DepthFold.extend`);
* the step's memory (gradients too): after the repeated block's backward the
  copies' parameter gradients, ``copies`` x G, instead of H; inside it the
  larger of the two (a copy's backward sees the copies before it holding
  their saved values and those after it their gradients).

A copy's own working set (its forward temporaries, its recomputation and
decompression in the backward) is the repeated block's, so the positions of
the repeated block bound the copies' positions: the folded figures are the
deep step's wherever the repeated block is identical to the blocks it
stands for, which block reuse has checked. ``tests/e2e/test_depth_fold.py``
compares them with a full-depth trace.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.fx as fx

from adacc_compile import compat

from .annotate import META_KEY
from .memory_sim import MemoryEvent, MemoryTimeline
from .plan_problem import BlockRepeat, PlanProblem, PlanSolution, repeated_held_bytes

FOLD_TRACE_BLOCKS = 3
"""Blocks the CLI traces of a deeper stack: the first and the last differ
from the others (they read the embedding, feed the final norm), the middle
one is repeated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DepthFold:
    """How the traced step's graph-level figures become the deep step's."""

    repeat: BlockRepeat
    gradient_bytes: int
    """G: bytes of the parameter gradients of one block."""
    block_seconds: float
    """Roofline time of one block's forward and backward nodes."""
    node_layers: dict[str, str]
    """Joint graph node name -> block id (the split graphs keep the names)."""
    parameter_only: frozenset[str] = frozenset()
    """Nodes computed from graph inputs alone (a weight's transpose): the
    backward may run them anywhere, so they do not mark where a block's
    backward runs."""

    def step_seconds(self, traced_seconds: float) -> float:
        return traced_seconds + self.repeat.copies * self.block_seconds

    def extend(self, timeline: MemoryTimeline, held_bytes: int) -> MemoryTimeline:
        """The deep step's timeline from the traced one, for a plan whose
        repeated block holds ``held_bytes`` (H). The copies' own positions
        are not drawn: the repeated block's positions stand for them."""
        copies, block = self.repeat.copies, self.repeat.block
        held, grads = copies * held_bytes, copies * self.gradient_bytes
        forward_from = _first(timeline.events, "forward", block, self.node_layers)
        backward = [
            i for i, e in enumerate(timeline.events)
            if e.phase == "backward" and self.node_layers.get(e.node) == block and e.node not in self.parameter_only
        ]
        if forward_from is None or not backward:
            raise ValueError(f"depth folding: the timeline has no forward or no backward of {block!r}")
        first_bw, last_bw = backward[0], backward[-1]
        events = []
        for i, e in enumerate(timeline.events):
            if e.phase == "forward":
                live_add = act_add = held if i >= forward_from or e.node == "<boundary>" else 0
            elif i < first_bw:
                live_add = act_add = held
            elif i <= last_bw:
                live_add, act_add = max(held, grads), held
            else:
                live_add, act_add = grads, 0
            events.append(dataclasses.replace(
                e, live_bytes=e.live_bytes + live_add, activation_bytes=e.activation_bytes + act_add
            ))
        saved = timeline.saved_bytes + held
        return MemoryTimeline(
            peak_bytes=max([timeline.peak_bytes, *(e.live_bytes for e in events)]),
            activation_peak_bytes=max([saved, *(e.activation_bytes for e in events)]),
            saved_bytes=saved,
            events=tuple(events),
        )

    def extend_for(self, timeline: MemoryTimeline, problem: PlanProblem, solution: PlanSolution) -> MemoryTimeline:
        return self.extend(timeline, repeated_held_bytes(problem, solution))

    def summary(self, traced_blocks: int) -> dict[str, object]:
        return {
            "repeated_block": self.repeat.block,
            "copies": self.repeat.copies,
            "traced_blocks": traced_blocks,
            "planned_blocks": traced_blocks + self.repeat.copies,
            "block_gradient_bytes": self.gradient_bytes,
            "block_seconds": self.block_seconds,
        }


def _first(events: tuple[MemoryEvent, ...], phase: str, block: str, layers: dict[str, str]) -> int | None:
    return next((i for i, e in enumerate(events) if e.phase == phase and layers.get(e.node) == block), None)


def repeated_block(classes: tuple[tuple[str, ...], ...], sizes: dict[str, int]) -> str | None:
    """The block to repeat: in the class with the most candidates per block,
    a member that is neither the first nor the last of its class in model
    order (block ids end in their index), else its first member."""
    if not classes:
        return None
    largest = max(classes, key=lambda cls: (sizes.get(cls[0], 0) * len(cls), cls[0]))
    ordered = sorted(largest, key=_index)
    return ordered[1] if len(ordered) >= 3 else ordered[0]


def _index(block: str) -> tuple[int, str]:
    tail = block.rsplit(".", 1)[-1]
    return (int(tail), block) if tail.isdigit() else (-1, block)


def make_fold(
    joint: fx.GraphModule, info: compat.JointGraphInfo, num_fwd_outputs: int, repeat: BlockRepeat
) -> DepthFold:
    """The graph-level figures of one copy of ``repeat.block``: its parameter
    gradients (parameters only its forward nodes read) and its nodes' time."""
    forward = set(info.forward_nodes)
    layers = {n.name: n.meta[META_KEY].layer for n in joint.graph.nodes if META_KEY in n.meta}
    seconds = sum(w * n.meta[META_KEY].runtime_s for n, w in _stretch(joint, repeat.block, layers))
    gradient_bytes = 0
    primals = [n for n in joint.graph.nodes if compat.is_primal(n)]
    outputs = list(joint.graph.output_node().args[0])
    gradients = outputs[num_fwd_outputs:]
    for primal, grad in zip(primals, gradients):
        users = [u for u in primal.users if u in forward]
        if grad is None or not users or any(layers.get(u.name) != repeat.block for u in users):
            continue
        val = primal.meta.get("val")
        if isinstance(val, torch.Tensor):
            gradient_bytes += compat.concrete_int(val.numel()) * val.element_size()
    inputs_only: set[fx.Node] = set()
    for node in joint.graph.nodes:
        if node.op == "placeholder" and compat.is_primal(node):
            inputs_only.add(node)
        elif node.op == "call_function" and all(a in inputs_only for a in node.all_input_nodes):
            inputs_only.add(node)
    return DepthFold(
        repeat=repeat, gradient_bytes=gradient_bytes, block_seconds=seconds, node_layers=layers,
        parameter_only=frozenset(n.name for n in inputs_only),
    )


def _stretch(joint: fx.GraphModule, block: str, layers: dict[str, str]) -> list[tuple[fx.Node, float]]:
    """The nodes one block adds to the step: its own, and those outside
    every block whose neighbours (inputs and users) all lie in it (the
    gradient sums of the residual stream, which carry no module)."""
    nodes = [n for n in joint.graph.nodes if n.op == "call_function" and META_KEY in n.meta]
    owner = {n: layers[n.name] for n in nodes}
    for _ in range(4):  # chains of such nodes take their owner step by step
        changed = False
        for node in nodes:
            if owner[node]:
                continue
            near = {owner.get(n, "") for n in (*node.all_input_nodes, *node.users)} - {""}
            if len(near) == 1:
                owner[node] = near.pop()
                changed = True
        if not changed:
            break
    # What lies between two blocks (the sum of the residual stream's two
    # gradients) counts half to each: a middle block has two such seams.
    own = [(n, 1.0) for n in nodes if owner[n] == block]
    for node in nodes:
        if not owner[node]:
            near = {owner.get(n, "") for n in (*node.all_input_nodes, *node.users)} - {""}
            if len(near) == 2 and block in near:
                own.append((node, 0.5))
    return own


def timeline_held_bytes(timeline: MemoryTimeline, fold: DepthFold) -> int:
    """H of a plan read off its split graphs' timeline: the bytes of the
    saved storages the repeated block's values are the first to hold, as
    the simulator counts them (views of saved values, parameters and other
    graph inputs add nothing). For plans chosen on the graph (PyTorch's),
    which the plan problem may count differently."""
    block = fold.repeat.block
    return sum(n for name, n in timeline.saved_by_node.items() if fold.node_layers.get(name) == block)
