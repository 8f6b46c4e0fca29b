"""Early placement: a value only the backward reads, when the forward
computes it (to save or compress it), runs where the forward is done with
its inputs instead of at the forward's end.

Reads and writes: the joint graph's node order (`place_backward_only_values_early`).

Why: AOTAutograd's joint graph puts such values (PyTorch's "unclaimed"
nodes: a LayerNorm's normalised input, an RMSNorm's ``2 * x``, computed in
the backward from forward values) among the backward nodes, and both the
extractor and the memory model run the forward in joint order. A plan that
saves one therefore computes it at the very end of the forward, and every
forward value it reads lives until then: on a 2-layer GPT whose plan
compressed the normalised inputs, each block's residual sum (1 MiB) stayed
alive through the whole forward, and on a Llama each RMSNorm input did.
Computed where the forward is done with its inputs, the inputs die there
(a same-sized value can even take the last one's buffer), and the value
itself is not allocated any earlier than that.

Only pure ops move, never past an op that writes memory or has other
effects (a value read after an in-place update must still read the new
contents), never random ops (their order is the random stream's order);
values do move across random ops (as barriers, a GPT's last dropout held
every block's values behind it and its blocks stopped being identical).
The backward does not depend on this order: the extractor's autograd-order
pass places each recomputation right before its first use.

Views only, by default (`AdaccConfig.place_backward_only_views_early`): a
view the backward alone reads (an attention's probabilities transposed for
V's gradient, a weight transposed for its input's gradient) costs nothing
to take anywhere, but a plan that compresses it compresses it where it
stands, at the forward's end, and on CPU all those compress chains then
form the forward's last kernel group (`fusion.kernel_group_ends`): the
model held every such value there, Inductor's peak-memory reorder runs
each chain right after its producer instead. A GPT d256 compress-only plan
@0.4 was predicted at 48.14 MiB for a measured 32.66; with its views
placed early, 32.67 for 32.66 (measured, bench/RESULTS.md). Values that
are computed stay put unless ``place_backward_only_early`` moves them too
(experimental: Inductor then fuses a Llama's SwiGLU backward factors with
a product after the next matmul, which the model does not follow).
"""

from __future__ import annotations

import torch.fx as fx

from adacc_compile.compat import JointGraphInfo

from .op_class import is_view_op


def _is_barrier(node: fx.Node) -> bool:
    """An op no value may move across: it writes memory (a mutable schema)
    or has other effects. Random ops are not barriers: values move across
    them, though not they themselves (`_movable`)."""
    if node.op != "call_function":
        return node.op == "output"
    return node.is_impure(impure_random=False)


def _movable(node: fx.Node, info: JointGraphInfo, views_only: bool = False) -> bool:
    """A backward-only forward value whose op is pure: no writes, no
    effects, not random (``is_impure`` counts random ops by default); with
    ``views_only``, a view."""
    if node.op != "call_function" or node not in info.forward_nodes or node in info.forward_needed:
        return False
    if views_only and not is_view_op(node):
        return False
    return not node.is_impure()


def place_backward_only_values_early(gm: fx.GraphModule, info: JointGraphInfo, *, views_only: bool = False) -> int:
    """Moves every movable node to right after the last node the forward
    outputs need that reads one of its inputs (or the last barrier before
    it, whichever is later), never later than it was; a node with no inputs
    (a constant fill) goes with its earliest movable user. With
    ``views_only`` only views move (see the module docstring).
    Returns how many nodes moved. Deterministic: the same graph gives the
    same order."""
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    last_placeholder = max((n for n in nodes if n.op == "placeholder"), key=position.__getitem__, default=None)
    movable = [n for n in nodes if _movable(n, info, views_only)]
    is_movable = set(movable)
    barrier_before: dict[fx.Node, fx.Node | None] = {}
    barrier = None
    for node in nodes:
        barrier_before[node] = barrier
        if _is_barrier(node) and node.op != "output":
            barrier = node

    def latest(nodes: list[fx.Node | None]) -> fx.Node | None:
        placed = [n for n in nodes if n is not None]
        return max(placed, key=position.__getitem__) if placed else None

    def done_with(value: fx.Node) -> fx.Node:
        """The last node the forward outputs need that reads ``value`` (the
        value itself when none does): the forward holds it until there anyway."""
        readers = [u for u in value.users if u in info.forward_needed]
        return latest([value, *readers]) or value

    # The anchor of a movable node is the fixed node it goes right after:
    # where the forward is done with its last input, looking through movable
    # inputs to their anchors. Not earlier: the inputs live until there
    # anyway, and the value itself would only live longer (a loss's
    # probabilities would sit next to the logits the loss still reads,
    # instead of taking their buffer).
    anchor: dict[fx.Node, fx.Node | None] = {}
    for node in movable:
        inputs = [anchor.get(a) if a in is_movable else done_with(a) for a in node.all_input_nodes]
        anchor[node] = latest([barrier_before[node], *inputs])
    # Inputless values (fills, iota, and what is computed from them alone)
    # go with their earliest movable user; with none, they stay.
    from_users: dict[fx.Node, fx.Node | None] = {}
    for node in reversed(movable):
        if anchor[node] is None:
            users = [anchor[u] for u in node.users if u in is_movable and anchor[u] is not None]
            first = min(users, key=position.__getitem__) if users else None
            if first is not None and position[first] > position[node]:
                first = None  # only ever earlier: a later user outside the movable ones may read it
            from_users[node] = anchor[node] = first
    stays = {n for n in movable if anchor[n] is None}
    for node in movable:  # a value that stays holds its users back
        if node in stays:
            continue
        inputs = [anchor[a] if a in is_movable and a not in stays else done_with(a) for a in node.all_input_nodes]
        target = latest([from_users.get(node), barrier_before[node], *inputs])
        if target is None or position[target] > position[node]:  # never later than it was
            stays.add(node)
            target = None
        anchor[node] = target
    moved = 0
    cursor: dict[fx.Node, fx.Node] = {}
    for node in movable:
        target = anchor[node]
        if target is None:
            continue
        if target.op == "placeholder" and last_placeholder is not None:
            target = last_placeholder
        after = cursor.get(target, target)
        if after is not node.prev:
            after.append(node)
            moved += 1
        cursor[target] = node
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
