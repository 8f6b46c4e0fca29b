"""Splitting a backward graph into a gradient-independent part run ahead
and the rest.

Everything a backward graph computes from saved values alone (recomputed
activations, transposed weights) needs no incoming gradient, so a pipeline
stage can run it while it still waits for that gradient. Running all of it
early would hold every recomputed value of the stage at once, which is the
memory recomputation was meant to save (adacc's plan recomputes each value
right before its use). So the part run ahead is capped in bytes: the
gradient-independent values are taken in the order the backward first needs
them (the last layer's first, as the backward runs in reverse), while what
they and their recomputation chains leave held fits the cap. The rest of
the graph, gradient-independent nodes not taken included, runs in its
original order, reading the values computed ahead as extra inputs; op for
op it computes what the original graph computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from adacc_compile import compat


@dataclass(slots=True, kw_only=True)
class SplitBackward:
    prologue: fx.GraphModule
    """``(*saved) -> (*held)``: the saved inputs are the backward's
    placeholders before its tangents."""
    epilogue: fx.GraphModule
    """``(*saved, *tangents, *held) -> gradients``."""
    num_saved: int
    held: list[str]
    """Names of the values computed ahead that the epilogue reads."""
    held_bytes: int
    """Their size (from the graph's fake values)."""
    prologue_nodes: int
    """Nodes run ahead (views included)."""
    independent_nodes: int
    """All gradient-independent compute nodes (what an uncapped split runs
    ahead)."""


def _nbytes(node: fx.Node) -> int:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(v.numel() * v.element_size() for v in value if isinstance(v, torch.Tensor))
    return 0


def _ancestors(targets: list[fx.Node], independent: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(targets)
    while stack:
        node = stack.pop()
        if node in seen or node not in independent:
            continue
        seen.add(node)
        stack.extend(node.all_input_nodes)
    return seen


def _held(ahead: set[fx.Node]) -> list[fx.Node]:
    """Nodes run ahead that something outside the ahead set reads."""
    return [n for n in ahead if any(u not in ahead for u in n.users)]


def split_backward(bw: fx.GraphModule, *, max_ahead_bytes: int | None = None) -> SplitBackward | None:
    """The split, or None where tangents do not all come after the saved
    inputs (the calling convention the wrapper relies on) or nothing is
    gradient-independent. ``max_ahead_bytes=None``: no cap."""
    graph = bw.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    tangent_flags = [compat.is_tangent(n) for n in placeholders]
    num_saved = tangent_flags.index(True) if True in tangent_flags else len(placeholders)
    if any(not t for t in tangent_flags[num_saved:]):
        return None
    dependent: set[fx.Node] = set(placeholders[num_saved:])
    order = {n: k for k, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        if node.op in ("call_function", "output") and any(a in dependent for a in node.all_input_nodes):
            dependent.add(node)
    independent = {n for n in graph.nodes if n.op == "call_function" and n not in dependent}
    if not independent:
        return None
    frontier = [n for n in independent if any(u in dependent for u in n.users)]
    frontier.sort(key=lambda n: min(order[u] for u in n.users if u in dependent))

    chosen: list[fx.Node] = []
    ahead: set[fx.Node] = set()
    for node in frontier:
        trial = _ancestors([*chosen, node], independent)
        if max_ahead_bytes is not None and sum(_nbytes(n) for n in _held(trial)) > max_ahead_bytes:
            break
        chosen.append(node)
        ahead = trial
    if not ahead:
        return None
    held = sorted(_held(ahead), key=lambda n: order[n])
    early = sorted(ahead, key=lambda n: order[n])
    constants = [n for n in graph.nodes if n.op == "get_attr"]

    pro = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in placeholders[:num_saved]:
        env[node] = pro.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in constants:
        env[node] = pro.node_copy(node)
    for node in early:
        env[node] = pro.node_copy(node, lambda n: env[n])
    pro.output(tuple(env[n] for n in held))
    pro.eliminate_dead_code()

    epi = fx.Graph()
    env2: dict[fx.Node, fx.Node] = {}
    for node in placeholders:
        env2[node] = epi.placeholder(node.name)
        env2[node].meta = dict(node.meta)
    for node in held:
        env2[node] = epi.placeholder(f"{node.name}_ahead")
        env2[node].meta = dict(node.meta)
    for node in constants:
        env2[node] = epi.node_copy(node)
    for node in graph.nodes:
        if node.op == "call_function" and node not in ahead:
            env2[node] = epi.node_copy(node, lambda n: env2[n])
        elif node.op == "output":
            epi.node_copy(node, lambda n: env2[n])
    return SplitBackward(
        prologue=fx.GraphModule(bw, pro), epilogue=fx.GraphModule(bw, epi), num_saved=num_saved,
        held=[n.name for n in held], held_bytes=sum(_nbytes(n) for n in held), prologue_nodes=len(early),
        independent_nodes=len(independent),
    )
