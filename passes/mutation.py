"""Mutation safety: which values a recomputation would read after the forward
has changed them.

Reads: the forward nodes of a graph, their op schemas. Writes nothing.

A recomputed value runs again in the backward, after the whole forward has
run. If the forward writes one of its inputs in place after the value was
first computed (a buffer updated under ``no_grad``, BatchNorm's running
statistics, any op whose schema writes an argument, ``copy_`` into a graph
input being the functionalised form of all of these), the recomputation
reads the new contents and silently yields another value. So a node is
*stale-reading* when one of the inputs its output depends on is an alias of
a value the forward writes later; such a node may be kept or compressed,
never recomputed. Recomputing from a pre-mutation value stays legal when that
value is itself kept: the rule is per node, and the planner's "recompute
needs its inputs available" constraint does the rest.

Some ops read a mutated input that does not affect every output. BatchNorm
in training mode reads the running statistics only to produce the updated
statistics (outputs 3 and 4); the normalised output and the batch
statistics (outputs 0-2) do not depend on them. `_PARTIAL_READS` lists such
ops as data, so that BatchNorm stacks stay recomputable while the outputs
that do depend on the old statistics are not.

The same rule checks a split backward graph (`stale_recomputations`): there
every mutated graph input has already been written when the backward runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.fx as fx

from .op_class import is_view_op


@dataclass(frozen=True, slots=True)
class PartialRead:
    """Inputs ``args`` of an op affect only outputs ``outputs``, provided
    ``condition(node)`` holds (e.g. BatchNorm in training mode)."""

    args: tuple[int, ...]
    outputs: tuple[int, ...]
    condition: Callable[[fx.Node], bool]


def _training(node: fx.Node) -> bool:
    value = node.args[5] if len(node.args) > 5 else node.kwargs.get("training")
    return value is True


_PARTIAL_READS: dict[Any, PartialRead] = {
    torch.ops.aten._native_batch_norm_legit_functional.default: PartialRead(
        args=(3, 4), outputs=(3, 4), condition=_training
    ),
}


def written_args(node: fx.Node) -> list[fx.Node]:
    """The inputs ``node`` writes in place (schema ``Tensor(a!)`` arguments)."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for index, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[index] if index < len(node.args) else node.kwargs.get(arg.name)
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, fx.Node):
                out.append(item)
    return out


def storage_base(node: fx.Node) -> fx.Node:
    """The node owning the storage ``node`` aliases (itself if not a view)."""
    while is_view_op(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def last_writes(nodes: Iterable[fx.Node]) -> dict[fx.Node, int]:
    """Storage base -> position (in ``nodes``) of the last node writing it."""
    writes: dict[fx.Node, int] = {}
    for position, node in enumerate(nodes):
        for arg in written_args(node):
            writes[storage_base(arg)] = position
    return writes


def _value_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs the node's output depends on (see `_PARTIAL_READS`)."""
    partial = _PARTIAL_READS.get(node.target) if node.op == "call_function" else None
    if partial is None or not partial.condition(node):
        return list(node.all_input_nodes)
    ignored = {node.args[i] for i in partial.args if i < len(node.args)}
    return [a for a in node.all_input_nodes if a not in ignored]


def _partial_output_reads(node: fx.Node) -> list[fx.Node]:
    """For ``getitem(op, k)`` where output k of op depends on inputs that
    op's own value inputs leave out: those inputs."""
    if node.op != "call_function" or getattr(node.target, "__name__", "") != "getitem":
        return []
    producer, index = node.args[0], node.args[1]
    if not isinstance(producer, fx.Node) or producer.op != "call_function":
        return []
    partial = _PARTIAL_READS.get(producer.target)
    if partial is None or not partial.condition(producer) or index not in partial.outputs:
        return []
    return [producer.args[i] for i in partial.args if i < len(producer.args) and isinstance(producer.args[i], fx.Node)]


def stale_reading(nodes: list[fx.Node]) -> set[fx.Node]:
    """Nodes of ``nodes`` (one graph's forward, in order) whose recomputation
    after the forward would read an input the forward writes after them."""
    position = {n: i for i, n in enumerate(nodes)}
    writes = last_writes(nodes)
    if not writes:
        return set()

    def stale(arg: fx.Node, reader: fx.Node) -> bool:
        written = writes.get(storage_base(arg))
        return written is not None and written > position.get(reader, -1)

    out = set()
    for node in nodes:
        if node.op != "call_function" or written_args(node):
            continue
        reads = _value_inputs(node) + _partial_output_reads(node)
        if any(stale(a, node) for a in reads):
            out.add(node)
    return out


def mutated_inputs(fw_module: fx.GraphModule) -> set[str]:
    """Names of the forward graph's placeholders that it writes in place."""
    nodes = list(fw_module.graph.nodes)
    return {base.name for base in last_writes(nodes) if base.op == "placeholder"}


def stale_recomputations(
    bw_module: fx.GraphModule, mutated: set[str], recomputed: Callable[[fx.Node], bool]
) -> list[str]:
    """Recomputed nodes of a backward graph that read a graph input the
    forward has written (the backward only ever sees the new contents)."""
    errors = []
    placeholders = {n for n in bw_module.graph.nodes if n.op == "placeholder" and n.name in mutated}
    if not placeholders:
        return errors
    for node in bw_module.graph.nodes:
        if node.op != "call_function" or not recomputed(node):
            continue
        reads = _value_inputs(node) + _partial_output_reads(node)
        hit = sorted({storage_base(a).name for a in reads if storage_base(a) in placeholders})
        if hit:
            errors.append(
                f"{node.name} is recomputed in the backward but reads {hit}, which the forward "
                f"writes in place: the recomputation would see the new contents"
            )
    return errors
