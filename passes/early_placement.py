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

Views (`AdaccConfig.place_backward_only_views_early`, in both realisations): a
view the backward alone reads (an attention's probabilities transposed for
V's gradient, a weight transposed for its input's gradient) costs nothing
to take anywhere, but a plan that compresses it compresses it where it
stands, at the forward's end, and on CPU all those compress chains then
form the forward's last kernel group (`fusion.kernel_group_ends`): the
model held every such value there, Inductor's peak-memory reorder runs
each chain right after its producer instead. A GPT d256 compress-only plan
@0.4 was predicted at 48.14 MiB for a measured 32.66; with its views
placed early, 32.67 for 32.66 (measured, bench/RESULTS.md).

Computed values, under Inductor (`AdaccConfig.place_backward_only_early`),
go to the forward kernel Inductor fuses them into: the first one, at or
after the point where their inputs exist, that reads one of those inputs,
a node fused into its readers reading where their kernel runs
(`_reading_kernel`). A LayerNorm's normalised input is written by the
norm's own kernel, a SwiGLU's backward factors by the product after the up
projection's matmul. Placed after the last forward reader instead (the
first version), the norm's value sat after the residual add past the
attention, and the SwiGLU factors before the up projection, where the SiLU
node stands though Inductor computes it in the product: a Llama
compress-only plan @0.4 measured 28.09 MiB for a predicted 24.90; now
24.97 for 24.98 (25.96 for 25.97 since such values get lossless codecs
only, `codec_options`). The eager realisation fuses nothing: there the
computed values keep the joint graph's order.
"""

from __future__ import annotations

import torch.fx as fx

from adacc_compile.compat import JointGraphInfo

from .fusion import Realization, materialised
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


def _reading_kernel(node: fx.Node, info: JointGraphInfo, mode: Realization, memo: dict[fx.Node, fx.Node]) -> fx.Node:
    """The node where ``node``'s reads happen in the forward: itself, or
    under Inductor, for a view or a value fused into the forward nodes that
    read it, the latest of their reading kernels. Why: a SwiGLU's SiLU is
    fused into its product with the up projection, which runs after that
    projection's matmul, so the gate projection is read there; a value
    placed after the SiLU node would be computed, and fused, in the
    product's kernel anyway (Inductor fused a Llama's SwiGLU backward
    factors there, 3.2 MiB above a model that placed them after the SiLU)."""
    if node in memo:
        return memo[node]
    memo[node] = node
    users = [u for u in node.users if u in info.forward_needed and u.op == "call_function"]
    if mode is Realization.INDUCTOR and users and node.op == "call_function":
        fused = is_view_op(node) or not materialised(node, users, mode)
        if fused:
            kernels = [_reading_kernel(u, info, mode, memo) for u in users]
            memo[node] = max(kernels)
    return memo[node]


def place_backward_only_values_early(
    gm: fx.GraphModule, info: JointGraphInfo, *, views_only: bool = False, mode: Realization = Realization.EAGER
) -> int:
    """Moves every movable node to right after the last node the forward
    outputs need that reads one of its inputs (or the last barrier before
    it, whichever is later), or under ``mode`` INDUCTOR a computed value
    to the kernel Inductor fuses it into (`place`, module docstring),
    never later than it was; a node with no inputs
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

    kernel_memo: dict[fx.Node, fx.Node] = {}

    def kernel(node: fx.Node) -> fx.Node:
        return _reading_kernel(node, info, mode, kernel_memo)

    def done_with(value: fx.Node) -> fx.Node:
        """The last node the forward outputs need that reads ``value`` (the
        value itself when none does): the forward holds it until there anyway."""
        readers = [u for u in value.users if u in info.forward_needed]
        return latest([value, *readers]) or value

    def place(node: fx.Node, fixed_inputs: list[fx.Node], lower: fx.Node | None) -> fx.Node | None:
        """Where ``node`` goes, given where its moved inputs went
        (``lower``, with the barrier before it). A view: where the forward is
        done with its base (it costs nothing; a codec compressing it then
        reads the base where the base is read last anyway). A computed value
        under Inductor: the first kernel at or after ``lower`` and its inputs
        that reads one of its inputs, which Inductor fuses it into (a
        LayerNorm's normalised input: the norm's own kernel; a SwiGLU's
        factors: the product after the up projection), else right after its
        inputs. Otherwise: where the forward is done with its inputs."""
        if views_only or mode is not Realization.INDUCTOR or is_view_op(node):
            return latest([lower, *(done_with(a) for a in fixed_inputs)])
        bound = latest([lower, *fixed_inputs])
        if bound is None:
            return None
        readers = [kernel(u) for a in fixed_inputs for u in a.users if u in info.forward_needed and u is not node]
        after = [k for k in readers if position[k] >= position[bound]]
        return min(after, key=position.__getitem__) if after else bound

    # The anchor of a movable node is the fixed node it goes right after
    # (`place`), looking through movable inputs to their anchors.
    anchor: dict[fx.Node, fx.Node | None] = {}
    for node in movable:
        moved_inputs = [anchor.get(a) for a in node.all_input_nodes if a in is_movable]
        fixed = [a for a in node.all_input_nodes if a not in is_movable]
        anchor[node] = place(node, fixed, latest([barrier_before[node], *moved_inputs]))
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
        moved_inputs = [anchor[a] for a in node.all_input_nodes if a in is_movable and a not in stays]
        fixed = [a for a in node.all_input_nodes if a not in is_movable or a in stays]
        target = place(node, fixed, latest([from_users.get(node), barrier_before[node], *moved_inputs]))
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
