"""Lifetimes: where every candidate value lives in the training step, as
plain positions the memory model and the plan simulator can read.

Reads: the joint graph, the forward/backward split (`compat.JointGraphInfo`),
``node.meta["adacc"]`` (annotate pass), the candidates. Writes nothing; returns
a `Lifetime` per candidate and the `StepLayout` of the step.

Positions follow the order the split graphs run in. The forward runs the
joint graph's forward nodes in their order (a forward node the forward
outputs do not need runs only if the plan saves it, or something computed
from it). The backward runs the joint graph's backward nodes in their order;
PyTorch's extractor and its autograd-order pass insert each recomputed value
right before the first backward node that needs it, directly or through
other recomputed values, and every value is freed after its last reader. So
the backward nodes' positions do not depend on the plan, and a value's
lifetime in the backward is fixed by the positions of the nodes that read
it: that is what makes the memory of every plan a function of its decisions
that a MILP can bound (`peak_model`).

Bytes follow `fusion.Realization`: under Inductor a pointwise value fused
into its consumers occupies nothing, neither as a forward temporary nor when
recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch.fx as fx

from adacc_compile.compat import JointGraphInfo, is_tangent

from .annotate import annotation, tensor_bytes
from .fusion import Realization, materialised
from .op_class import is_view_op
from .plan_problem import Lifetime, StepLayout


@dataclass(frozen=True, slots=True)
class Orders:
    """Forward and backward positions of the joint graph's nodes."""

    forward: dict[fx.Node, int]
    backward: dict[fx.Node, int]


def step_orders(gm: fx.GraphModule, info: JointGraphInfo) -> Orders:
    forward: dict[fx.Node, int] = {}
    backward: dict[fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node in info.backward_nodes:
            backward[node] = len(backward)
        elif node in info.forward_nodes:
            forward[node] = len(forward)
    return Orders(forward, backward)


def _real_users(node: fx.Node) -> list[fx.Node]:
    return [u for u in node.users if u.op != "output"]


def _multi_output(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (list, tuple))


def _output_of_multi(node: fx.Node) -> bool:
    """``getitem(op, k)`` of a multi-output op that allocates its outputs
    (not ``split``/``chunk``/``unbind``, whose outputs are views): it owns
    output k's storage (the op's tuple itself owns nothing)."""
    if node.op != "call_function" or getattr(node.target, "__name__", "") != "getitem":
        return False
    producer = node.args[0]
    return isinstance(producer, fx.Node) and _multi_output(producer) and not is_view_op(producer)


def owned_bytes(node: fx.Node) -> int:
    """Bytes of the storage ``node`` owns: 0 for views and for a multi-output
    op's tuple (its ``getitem`` outputs own the storages)."""
    if node.op != "call_function":
        return 0
    if _output_of_multi(node):
        return tensor_bytes(node.meta.get("val"))
    if is_view_op(node) or _multi_output(node):
        return 0
    return tensor_bytes(node.meta.get("val"))


def _allocates(node: fx.Node, consumers: list[fx.Node], mode: Realization) -> bool:
    if _output_of_multi(node):
        producer = node.args[0]
        return materialised(producer, list(producer.users), mode)
    return materialised(node, consumers, mode)


def _storage_readers(node: fx.Node) -> list[fx.Node]:
    """Every node that reads ``node``'s storage: its users, and through views
    of it (which alias it) theirs, transitively."""
    out: list[fx.Node] = []
    stack = list(node.users)
    seen: set[fx.Node] = set()
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        out.append(user)
        if user.op == "call_function" and is_view_op(user):
            stack.extend(user.users)
    return out


def _forward_end(
    node: fx.Node, orders: Orders, forward_outputs: set[fx.Node], position: int, needed: Iterable[fx.Node] | None = None
) -> int:
    """Last forward position at which ``node``'s storage is read (the end of
    the forward when it, or a view of it, is a forward output); with
    ``needed``, only readers among those count."""
    readers = _storage_readers(node)
    if node in forward_outputs or any(r in forward_outputs for r in readers):
        return len(orders.forward) - 1
    keep = set(needed) if needed is not None else None
    return max([position, *(orders.forward[r] for r in readers if r in orders.forward and (keep is None or r in keep))])


def candidate_lifetime(
    node: fx.Node, info: JointGraphInfo, orders: Orders, mode: Realization, forward_outputs: set[fx.Node]
) -> Lifetime:
    """The `Lifetime` of one candidate (a forward value or a graph input)."""
    users = _real_users(node)
    forward_users = [u for u in users if u in orders.forward]
    reads = sorted({orders.backward[u] for u in users if u in orders.backward})
    if node.op == "placeholder":
        return Lifetime(produced=-1, forward_last_use=-1, forward_always=True, forward_bytes=0,
                        backward_bytes=0, reads=tuple(reads))
    produced = orders.forward[node]
    # Readers only the backward needs run in the forward only if the plan
    # saves them (or what is computed from them): they extend the lifetime
    # conditionally (`late_readers`).
    forward_last = _forward_end(node, orders, forward_outputs, produced, info.forward_needed)
    late = tuple(sorted(
        (r.name, orders.forward[r]) for r in _storage_readers(node)
        if r in orders.forward and r not in info.forward_needed and orders.forward[r] > forward_last
    ))
    nbytes = owned_bytes(node)
    fw_consumers = forward_users + [u for u in node.users if u.op == "output"]
    base = node.args[0] if is_view_op(node) and node.args else None
    # Recomputing a multi-output op makes all its outputs at once: in the
    # backward the op owns them (until its outputs' last need) and its
    # getitems are views of it; in the forward each output is its own.
    recomputed_bytes = tensor_bytes(node.meta.get("val")) if _multi_output(node) else (
        0 if _output_of_multi(node) else nbytes
    )
    forward_bytes = nbytes if _allocates(node, fw_consumers, mode) else 0
    return Lifetime(
        alias_of=base.name if isinstance(base, fx.Node) else "",
        produced=produced,
        forward_last_use=forward_last,
        forward_always=node in info.forward_needed,
        forward_bytes=forward_bytes,
        written_bytes=0 if forward_bytes else _written_bytes(node, orders, mode),
        backward_bytes=recomputed_bytes if materialised(node, users, mode) or _output_of_multi(node) else 0,
        reads=tuple(reads),
        late_readers=late,
    )


def _written_bytes(node: fx.Node, orders: Orders, mode: Realization) -> int:
    """Bytes Inductor writes for a value it would otherwise fuse away when
    a codec reads it (`compress_rewrite` passes a compressed value through
    `compat_inductor.realize_op` first): the value's own bytes, or for a view those
    of its base where no forward reader makes the base exist anyway."""
    if mode is not Realization.INDUCTOR or _output_of_multi(node) or _multi_output(node):
        return 0
    base = node
    while is_view_op(base) and base.args and isinstance(base.args[0], fx.Node):
        base = base.args[0]
    if base is not node:
        if base.op != "call_function" or _allocates(base, [u for u in base.users if u in orders.forward], mode):
            return 0
    return tensor_bytes(node.meta.get("val"))


def step_layout(
    gm: fx.GraphModule,
    info: JointGraphInfo,
    orders: Orders,
    candidates: Iterable[fx.Node],
    mode: Realization,
    forward_outputs: set[fx.Node],
    *,
    with_backward_base: bool = False,
) -> StepLayout:
    """Positions and the plan-independent activation bytes of the forward:
    what the forward allocates for values no plan decides about (those the
    backward never reads), alive from their node to their last forward use
    (forward outputs to the end of the forward); ``with_backward_base``,
    also the backward's own bytes (`backward_base`)."""
    decided = set(candidates)
    spans = []
    for node, position in orders.forward.items():
        if node in decided or node not in info.forward_needed:
            continue
        consumers = [u for u in node.users if u in orders.forward or u.op == "output"]
        nbytes = owned_bytes(node)
        if not nbytes or not _allocates(node, consumers, mode):
            continue
        spans.append((position, _forward_end(node, orders, forward_outputs, position), nbytes))
    base = _bytes_alive(len(orders.forward), spans)
    layers_fw = tuple(annotation(n).layer for n in orders.forward)
    layers_bw = tuple(annotation(n).layer for n in orders.backward)
    return StepLayout(
        forward_positions=len(orders.forward),
        backward_positions=len(orders.backward),
        forward_base=tuple(base),
        forward_layers=layers_fw,
        backward_layers=layers_bw,
        backward_base=backward_base(orders, mode, tangents(gm)) if with_backward_base else (),
    )


def tangents(gm: fx.GraphModule) -> list[fx.Node]:
    """The joint graph's tangents: the gradients of its outputs (a scalar
    loss's 4 bytes; after a graph break, the gradient of the activation
    the next graph read), inputs of the backward."""
    return [n for n in gm.graph.nodes if is_tangent(n)]


def backward_base(orders: Orders, mode: Realization, inputs: Iterable[fx.Node] = ()) -> tuple[int, ...]:
    """Bytes the backward's own values hold at each backward position: its
    ``inputs`` (`tangents`) from its start to their last reader, and each
    gradient (or other backward value) that allocates under ``mode``, from
    its node to its storage's last backward reader, or to the end where the
    backward returns it (a parameter's gradient). No plan changes them, so
    they are constants of the memory rows when the budget bounds the whole
    step; Inductor's in-place reuse and kernel groups move them a little,
    which the plan search's simulation of the split graphs corrects."""
    count = len(orders.backward)
    spans = []
    for node, position in orders.backward.items():
        nbytes = owned_bytes(node)
        consumers = [u for u in node.users if u in orders.backward or u.op == "output"]
        if not nbytes or not _allocates(node, consumers, mode):
            continue
        readers = _storage_readers(node)
        if any(r.op == "output" for r in readers):
            end = count - 1
        else:
            end = max([position, *(orders.backward[r] for r in readers if r in orders.backward)])
        spans.append((position, end, nbytes))
    for node in inputs:
        readers = [orders.backward[r] for r in _storage_readers(node) if r in orders.backward]
        if readers and (nbytes := tensor_bytes(node.meta.get("val"))):
            spans.append((0, max(readers), nbytes))
    return tuple(_bytes_alive(count, spans))


def _bytes_alive(count: int, spans: Iterable[tuple[int, int, int]]) -> list[int]:
    """Bytes alive at each of ``count`` positions, from (first, last,
    bytes) spans, inclusive: a difference array, summed."""
    diff = [0] * (count + 1)
    for first, last, nbytes in spans:
        diff[first] += nbytes
        diff[last + 1] -= nbytes
    alive, running = [], 0
    for position in range(count):
        running += diff[position]
        alive.append(running)
    return alive
