"""Memory simulator: the peak memory of one training step of a plan.

Walks the extracted forward graph and then the backward graph in execution
order, allocating each node's new output storage and freeing a storage when
the last node that reads any alias of it has run (graph outputs excepted).
Saved tensors stay alive from the forward into the backward until their last
backward use; gradients stay alive to the end of the step. Views and
``getitem`` share their base's storage. Graph inputs (parameters, data)
exist before the step and are not counted; the tangents are allocated at
the backward's start and count to their last reader (`tangents`).

Activation memory is what the forward allocates (its temporaries while
they live, the values it saves until their last backward use) and what the
backward makes from it: values recomputed inside the backward and
decompressed values (tagged `compress_rewrite.DECOMPRESSED`), each until its
last use. Graph inputs are not (parameters and data exist before the
step), except those listed in ``charged_inputs``, activations an earlier
graph handed over, which count from the boundary while the backward holds
them; the forward's user outputs count until the boundary, and beyond it
where the caller keeps them (all but the ones `tangents.dropped_outputs`
names).

With ``mode=Realization.INDUCTOR`` a pointwise value fused into all its
consumers allocates nothing (`fusion`), as in Inductor's generated code,
unless Inductor's lowering writes it anyway (several readers, many inlined
reads or an exponential, a reader past a matmul: `fusion.realised_by_lowering`).
On CPU, Inductor's C++ backend also runs the generated kernels between two
external calls (matmuls, attention, fallbacks) as one function: every
output of that group is allocated before it runs, and what the group was
the last to read is freed when it returns (`fusion.kernel_group_ends`), so
the simulator frees there too.

A multi-output node's storages are kept by output position, ``None``
outputs included (``convolution_backward`` returns ``(None, grad_w,
grad_b)`` when its input needs no gradient), so ``getitem(node, k)``
aliases the k-th output.

Codec ops (``torch.ops.adacc.<codec>_compress`` / ``_decompress``) also
need scratch memory while they run: the codec declares it
(`Codec.compress_workspace_nbytes`), for the device the node's tensors live
on (their fake tensors carry it), and it is counted as live during that node
only: it raises the peak, not the live set after the node. So is the
input-sized temporary of ATen's CPU ``native_dropout`` (`_eager_dropout_workspace`).

This is the same accounting a caching allocator sees for the step's own
tensors (minus rounding), which is why `bench/` compares it with
``torch.cuda.max_memory_allocated`` on GPU and with the profiler's allocator
trace on CPU (`adacc_compile.measure`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.fx as fx

from adacc_compile.compat import concrete_int, is_tangent
from adacc_compile.kernels import Codec, available_codecs, get_codec

from .compress_rewrite import DECOMPRESSED
from .fusion import (
    Realization, absorbs_producer, copies_its_input, is_pointwise, kernel_group_ends, materialised, tensor_value,
)
from .op_class import is_view_op, op_name
from .tangents import dropped_outputs


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEvent:
    phase: str
    """"forward" or "backward"."""
    node: str
    live_bytes: int
    activation_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTimeline:
    peak_bytes: int
    """Peak of all bytes the step allocates."""
    activation_peak_bytes: int
    """Peak of forward-produced bytes alive for the backward: saved values
    plus values recomputed inside the backward."""
    saved_bytes: int
    """Bytes held at the forward/backward boundary."""
    events: tuple[MemoryEvent, ...] = field(default_factory=tuple)
    saved_by_node: dict[str, int] = field(default_factory=dict)
    """Saved forward output -> the bytes of the storages it is the first
    saved output to hold (a view of a saved value adds nothing); they sum
    to ``saved_bytes``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "saved_bytes": self.saved_bytes,
            "events": [
                [e.phase, e.node, e.live_bytes, e.activation_bytes] for e in self.events
            ],
        }


@dataclass(slots=True, eq=False)
class _Storage:
    nbytes: int
    refs: int = 0
    """Nodes (alive, not yet fully read) aliasing this storage."""
    activation: bool = False
    donatable: bool = True
    """May a kernel write its output into this storage when its last reader
    runs (`_inplace_donor`)? Not a graph input's or a user output's:
    AOTAutograd donates only the saved values the forward computed."""


@dataclass(slots=True)
class _State:
    live: int = 0
    activation: int = 0
    peak: int = 0
    activation_peak: int = 0
    events: list[MemoryEvent] = field(default_factory=list)

    def alloc(self, storage: _Storage) -> None:
        self.live += storage.nbytes
        if storage.activation:
            self.activation += storage.nbytes

    def free(self, storage: _Storage) -> None:
        self.live -= storage.nbytes
        if storage.activation:
            self.activation -= storage.nbytes

    def retag(self, storage: _Storage, activation: bool) -> None:
        """``storage`` now holds a value that is (or is not) an activation."""
        if storage.activation != activation:
            self.activation += storage.nbytes if activation else -storage.nbytes
            storage.activation = activation

    def record(self, phase: str, node: str) -> None:
        self.peak = max(self.peak, self.live)
        self.activation_peak = max(self.activation_peak, self.activation)
        self.events.append(MemoryEvent(phase=phase, node=node, live_bytes=self.live, activation_bytes=self.activation))


def simulate_step(
    fw_module: fx.GraphModule,
    bw_module: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    forward_names: Iterable[str] = (),
    mode: Realization = Realization.EAGER,
    charged_inputs: Iterable[str] = (),
    forward_extra_bytes: int = 0,
    backward_extra_bytes: int = 0,
) -> MemoryTimeline:
    """Simulates forward then backward; ``forward_names`` are the joint
    graph's forward node names (a backward node with such a name is a
    recomputation and counts as activation memory). ``forward_extra_bytes``
    are alive through the whole forward, ``backward_extra_bytes`` through the
    whole backward, besides the graph's own (under a step budget, what other
    graphs of the step hold: `adacc_compile.step_ledger`)."""
    state = _State()
    workspaces = _workspaces()
    forward_names = set(forward_names)
    charged = set(charged_inputs)
    fw_outputs = _output_nodes(fw_module)
    saved_outputs = fw_outputs[num_fwd_outputs:]
    state.live += forward_extra_bytes
    fw_storages = _run_graph(
        fw_module, state, "forward", keep=set(fw_outputs), is_activation=lambda node: True,
        workspaces=workspaces, mode=mode,
    )
    state.live -= forward_extra_bytes  # a kept input among them is charged below
    user_outputs = fw_outputs[:num_fwd_outputs]
    handed: dict[int, _Storage] = {}
    for out in user_outputs:  # handed to the caller at the boundary
        for storage in _real(fw_storages.get(out, ())) if out is not None else ():
            storage.donatable = False
            if storage.activation:
                storage.activation = False
                state.activation -= storage.nbytes
                handed[id(storage)] = storage
    # Beside a scalar loss the caller keeps only the loss (`tangents`).
    drop = dropped_outputs(user_outputs)
    dropped = {id(s): s for out in drop for s in _real(fw_storages.get(out, ())) if id(s) in handed}
    kept = {id(s) for out in user_outputs if out is not None and out not in drop for s in _real(fw_storages.get(out, ()))}
    saved_storages: dict[int, _Storage] = {}
    saved_by_node: dict[str, int] = {}
    for out in saved_outputs:
        if out is not None and out.op == "placeholder" and out.name in charged:
            fw_storages[out] = [_Storage(nbytes=_nbytes(out.meta.get("val")), activation=True, donatable=False)]
            state.alloc(fw_storages[out][0])
        for storage in _real(fw_storages.get(out, ())):
            if not storage.activation:  # also a user output: held for the backward now
                storage.activation = True
                state.activation += storage.nbytes
            if id(storage) not in saved_storages:
                saved_by_node[out.name] = saved_by_node.get(out.name, 0) + storage.nbytes
            saved_storages[id(storage)] = storage
    # The backward's placeholders take over the saved storages' references.
    state.activation = sum(s.nbytes for s in saved_storages.values())
    saved_bytes = state.activation
    for storage in saved_storages.values():
        storage.refs = 0
    state.record("forward", "<boundary>")
    bw_inputs = [n for n in bw_module.graph.nodes if n.op == "placeholder"]
    saved_by_name = {n.name: fw_storages.get(n, []) for n in saved_outputs}
    preset = {}
    for node in bw_inputs:
        storages = _real(saved_by_name.get(node.name, ()))
        if storages:
            preset[node] = storages
    read = {id(storage) for storages in preset.values() for storage in storages}
    for key, storage in saved_storages.items():
        if key not in read:
            state.free(storage)  # saved but never read: freed at once
    for key, storage in dropped.items():
        if key not in saved_storages and key not in kept:
            state.free(storage)
    state.live += backward_extra_bytes
    for node in bw_inputs:  # the tangents, gradients of the forward's outputs: to their last reader
        if is_tangent(node) and node not in preset and (nbytes := _nbytes(node.meta.get("val"))):
            preset[node] = [_Storage(nbytes=nbytes, donatable=False)]
            state.alloc(preset[node][0])
    _run_graph(
        bw_module,
        state,
        "backward",
        keep=set(_output_nodes(bw_module)),
        is_activation=lambda node: node.name in forward_names or DECOMPRESSED in node.meta,
        preset=preset,
        workspaces=workspaces,
        mode=mode,
    )
    return MemoryTimeline(
        peak_bytes=state.peak,
        activation_peak_bytes=max(state.activation_peak, saved_bytes),
        saved_bytes=saved_bytes,
        events=tuple(state.events),
        saved_by_node=saved_by_node,
    )


def graph_scratch_bytes(gm: fx.GraphModule, *, mode: Realization = Realization.EAGER) -> int:
    """Peak bytes ``gm`` allocates while it runs, beyond its inputs and less
    its outputs, under ``mode``: what a codec's traced compress needs on
    top of the value it reads and the payload it writes (the memory model
    counts those two from the compress on, so the sum is never under the
    graph's peak). In eager mode every op of the codec's aten form writes its
    own buffer (int8_channel on a 16 KiB value: 106 KB more at its peak);
    under Inductor only what its kernels materialise."""
    state = _State()
    outputs = [n for n in _output_nodes(gm) if n is not None]
    storages = _run_graph(
        gm, state, "scratch", keep=set(outputs), is_activation=lambda node: True, workspaces=_workspaces(), mode=mode,
    )
    held = {id(s): s.nbytes for out in outputs for s in _real(storages.get(out, ()))}
    return max(0, state.peak - sum(held.values()))


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    return [n if isinstance(n, fx.Node) else None for n in flat]  # type: ignore[misc]


WorkspaceFn = Callable[[fx.Node], int]


def _workspaces() -> dict[Any, WorkspaceFn]:
    """Op -> the scratch bytes of one of its nodes (see module docstring):
    ATen ops that run eagerly in a compiled graph, then the codec ops."""
    return {torch.ops.aten.native_dropout.default: _eager_dropout_workspace, **_codec_workspaces()}


def _codec_workspaces() -> dict[Any, WorkspaceFn]:
    """Codec op -> the scratch bytes of one of its nodes (see module docstring)."""
    table: dict[Any, WorkspaceFn] = {}
    for name in available_codecs():
        codec = get_codec(name)
        table[codec.compress_op] = lambda node, codec=codec: _compress_workspace(codec, node)
        table[codec.decompress_op] = lambda node, codec=codec: _decompress_workspace(codec, node)
    return table


def _eager_dropout_workspace(node: fx.Node) -> int:
    """ATen's CPU ``native_dropout`` in training multiplies its input by the
    boolean mask converted to the input's dtype: a temporary of the input's
    size, alive beside the mask and the output while the op runs.

    A ``native_dropout`` node reaches a compiled graph only where Inductor
    does not generate its own random kernels (``fallback_random=True``,
    as the benchmarks compile to match eager), and then runs as that ATen
    op. On a 2-layer GPT (d_model 256) the measured step peak was inside
    the attention dropout, this temporary (4 MiB) one of what the
    simulation missed there (profiler allocator trace, 2026-12-05; the
    rest was the dropout's copy of its input, `_input_copies`). CUDA's fused
    dropout kernel has no such temporary."""
    x = tensor_value(node.args[0]) if node.args else None
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    if x is None or x.device.type != "cpu" or train is False:
        return 0
    return _nbytes(x)


def _shape(value: torch.Tensor) -> tuple[int, ...]:
    return tuple(concrete_int(s) for s in value.shape)


def _compress_workspace(codec: Codec, node: fx.Node) -> int:
    x = tensor_value(node.args[0]) if node.args else None
    if x is None:
        return 0
    return codec.compress_workspace_nbytes(_shape(x), x.dtype, x.device.type)


def _decompress_workspace(codec: Codec, node: fx.Node) -> int:
    out = tensor_value(node)
    payload = [t for t in map(tensor_value, node.all_input_nodes) if t is not None]
    if out is None or not payload:
        return 0
    return codec.decompress_workspace_nbytes(_shape(out), out.dtype, payload[0].device.type)


def _run_graph(
    gm: fx.GraphModule,
    state: _State,
    phase: str,
    *,
    keep: set[fx.Node],
    is_activation: Callable[[fx.Node], bool],
    preset: dict[fx.Node, list[_Storage]] | None = None,
    workspaces: dict[Any, WorkspaceFn] | None = None,
    mode: Realization = Realization.EAGER,
) -> dict[fx.Node, list[_Storage]]:
    """Allocates and frees storages in node order; returns node -> storages."""
    nodes = list(gm.graph.nodes)
    memo: dict = {}  # `fusion.inlined_reads` of this graph's nodes
    runs_at = _kernel_positions(nodes, mode, memo)
    last_use: dict[fx.Node, int] = {}
    for index, node in enumerate(nodes):
        for arg in node.all_input_nodes:
            last_use[arg] = max(last_use.get(arg, index), runs_at[node])
    released: dict[int, list[fx.Node]] = {}
    for arg, index in last_use.items():
        released.setdefault(index, []).append(arg)
    # Under Inductor on CPU a kernel group frees what it read when it returns.
    freed_at = kernel_group_ends(nodes) if mode is Realization.INDUCTOR else {}
    freed: dict[int, list[fx.Node]] = {}
    storages: dict[fx.Node, list[_Storage]] = {}
    preset = preset or {}
    for index, node in enumerate(nodes):
        if node.op == "placeholder":
            storages[node] = preset.get(node, [])
            for storage in _real(storages[node]):
                storage.refs += 1
        elif node.op == "call_function":
            if is_view_op(node) or materialised(node, node.users, mode, memo):
                storages[node] = _outputs_of(node, storages, is_activation(node))
                # A value that died earlier in this kernel group is still allocated:
                # a later kernel of the group that reads it may write into it.
                dying = [*freed.get(freed_at.get(index, index), ()), *released.get(index, ())]
                donor = _inplace_donor(node, storages, dying, keep, mode, memo)
                if donor is not None:  # Inductor writes the output into a dying input
                    state.retag(donor, is_activation(node))
                    storages[node] = [donor]
            else:
                storages[node] = []  # fused into its consumers
            for storage in _real(storages[node]):
                if storage.refs == 0:
                    state.alloc(storage)
                storage.refs += 1
        elif node.op == "output":
            state.record(phase, "<output>")
            continue
        else:
            storages[node] = []
        workspace = _workspace_of(node, workspaces) + _input_copies(node, storages, mode)
        state.live += workspace  # scratch of a codec op, a fallback's input copies: live while it runs
        state.record(phase, node.name)
        state.live -= workspace
        # Free what this node's kernel was the last to read (and dead outputs),
        # where its kernel group returns.
        dying = list(released.get(index, ()))
        if node not in last_use and node.op == "call_function":
            dying.append(node)
        freed.setdefault(freed_at.get(index, index), []).extend(dying)
        for dead in freed.pop(index, ()):
            if dead in keep:
                continue
            for storage in _real(storages.get(dead, ())):
                storage.refs -= 1
                if storage.refs == 0:
                    state.free(storage)
    return storages


#: Views that keep an element's position in its storage (an in-place write
#: reads each element where it writes it).
_ORDER_KEEPING_VIEWS = frozenset(
    {"aten.view", "aten._unsafe_view", "aten.reshape", "aten.unsqueeze", "aten.squeeze", "aten.alias"}
)


def _inplace_donor(
    node: fx.Node,
    storages: dict[fx.Node, list[_Storage | None]],
    dying: Iterable[fx.Node],
    keep: set[fx.Node],
    mode: Realization,
    memo: dict,
) -> _Storage | None:
    """The input storage Inductor's kernel for ``node`` writes its output
    into, if any (its scheduler's ``decide_inplace_update``, on by default
    and on under adacc): ``node`` is a pointwise kernel with one output, and
    a storage of the same size and dtype that it reads element for element
    (directly or through order-keeping views and fused producers) dies
    with this kernel, or died earlier in its CPU kernel group (still
    allocated until the group returns: a loss's exponentials are written
    into the logits they are computed from). Backward inputs count when the forward computed them
    (AOTAutograd donates those saved values). On an H200 the cross-entropy
    backward writes the logits' gradient into the logits (250 MiB for a
    32000-word vocabulary and 4096 tokens), which the simulator counted as
    a second buffer before (its @0.8 plans were over-predicted by 16%)."""
    if mode is not Realization.INDUCTOR or not is_pointwise(node):
        return None
    outputs = _real(storages[node])
    value = node.meta.get("val")
    if len(outputs) != 1 or not isinstance(value, torch.Tensor) or not _contiguous(value):
        return None
    dying = [d for d in dying if d not in keep]
    for candidate in dying:
        held = _real(storages.get(candidate, ()))
        if len(held) != 1:
            continue
        storage = held[0]
        other = candidate.meta.get("val")
        holders = sum(1 for d in dying if any(s is storage for s in _real(storages.get(d, ()))))
        if (
            storage.donatable
            and storage.nbytes == outputs[0].nbytes
            and storage.refs == holders
            and isinstance(other, torch.Tensor)
            and other.dtype == value.dtype
            and _contiguous(other)
            and _read_in_order(node, candidate, mode, memo)
        ):
            return storage
    return None


def _contiguous(value: torch.Tensor) -> bool:
    try:
        return bool(value.is_contiguous())
    except Exception:  # noqa: BLE001 - symbolic strides: not provably contiguous
        return False


def _read_in_order(node: fx.Node, source: fx.Node, mode: Realization, memo: dict) -> bool:
    """Does ``node``'s kernel read ``source`` element for element: as an
    argument, or through order-keeping views and fused pointwise producers?"""
    stack, seen = list(node.all_input_nodes), set()
    while stack:
        arg = stack.pop()
        if arg is source:
            return True
        if arg in seen or arg.op != "call_function":
            continue
        seen.add(arg)
        if is_view_op(arg):
            if op_name(arg) in _ORDER_KEEPING_VIEWS:
                stack.extend(arg.all_input_nodes[:1])
        elif is_pointwise(arg) and not materialised(arg, arg.users, mode, memo):
            stack.extend(arg.all_input_nodes)
    return False


def _kernel_positions(nodes: list[fx.Node], mode: Realization, memo: dict) -> dict[fx.Node, int]:
    """Where each node's reads happen: its own position, except under
    Inductor for a value fused into the one op that reads it (through
    views), whose reads happen where that op's kernel runs. Inductor inlines
    such a value into its reader's kernel, so what it reads stays allocated
    until that kernel runs: the SiLU backward's product reads the gate
    projection's gradient where the input gradient's kernel runs, after two
    weight-gradient matmuls, not where the product stands. A fused value
    read by several ops is computed again in each reader's kernel; a
    reader that depends on a matmul run after the value cannot join an
    earlier kernel, so the value's reads happen where the last such reader
    runs: a Llama block's residual sum recomputed in the RMSNorm backward
    (which waits for the MLP's input gradient) keeps the attention
    projection's output allocated until then (measured: the 1 MiB a
    2-layer Llama's step held above this model, before). Readers that wait
    for nothing later may be fused into an earlier kernel and do not
    extend the reads. The values Inductor writes instead
    (`fusion.realised_by_lowering`) are materialised and read where they
    stand. A fallback that gets its own copy of a fused value
    (`fusion.copies_its_input`) reads it where it runs.
    A view reads nothing (its base stays allocated while the view lives)."""
    position = {node: index for index, node in enumerate(nodes)}
    waits_for = _last_kernel_boundary(nodes, position)
    runs_at: dict[fx.Node, int] = {}
    for node in reversed(nodes):
        index = position[node]
        runs_at[node] = index
        if mode is not Realization.INDUCTOR or node.op != "call_function":
            continue
        if not is_view_op(node) and not materialised(node, node.users, mode, memo):
            readers = _readers_through_views(node)
            if len(readers) > 1:  # recomputed where each reader held back by a later matmul runs
                readers = [r for r in readers if waits_for[nodes[runs_at[r]]] > index or copies_its_input(r)]
            runs_at[node] = max([index, *(runs_at[r] for r in readers)])
    return runs_at


def _last_kernel_boundary(nodes: list[fx.Node], position: dict[fx.Node, int]) -> dict[fx.Node, int]:
    """Per node, the position of the latest op it depends on that no
    kernel can absorb (a matmul, attention, a custom op; through fusible
    ops and views), -1 for none: a kernel cannot run before that op, while
    one that depends on nothing later than a value's own kernel may be
    fused into it (Inductor's scheduler moves it up)."""
    latest: dict[fx.Node, int] = {}
    for node in nodes:
        bound = -1
        for arg in node.all_input_nodes:
            if arg.op == "call_function" and not (is_view_op(arg) or absorbs_producer(arg)):
                bound = max(bound, position[arg])  # a boundary itself
            else:
                bound = max(bound, latest.get(arg, -1))  # fusible, or an input: what it waits for
        latest[node] = bound
    return latest


def _input_copies(node: fx.Node, storages: dict[fx.Node, list[_Storage]], mode: Realization) -> int:
    """Bytes of the copies Inductor writes for ``node`` of its unwritten
    pointwise inputs (`fusion.copies_its_input`): counted while ``node``
    runs, where they are at their largest (the copy is written by the kernel
    right before it, and dies with it)."""
    if mode is not Realization.INDUCTOR or not copies_its_input(node):
        return 0
    return sum(
        _nbytes(arg.meta.get("val"))
        for arg in node.all_input_nodes
        if arg.op == "call_function" and not is_view_op(arg) and not storages.get(arg)
    )


def _readers_through_views(node: fx.Node) -> list[fx.Node]:
    readers: list[fx.Node] = []
    for user in node.users:
        if user.op == "call_function" and is_view_op(user):
            readers.extend(_readers_through_views(user))
        else:
            readers.append(user)
    return readers


def _workspace_of(node: fx.Node, workspaces: dict[Any, WorkspaceFn] | None) -> int:
    if not workspaces or node.op != "call_function":
        return 0
    try:
        estimate = workspaces.get(node.target)
    except TypeError:  # an unhashable target
        return 0
    return estimate(node) if estimate is not None else 0


def _nbytes(val: Any) -> int:
    return concrete_int(val.numel()) * val.element_size() if isinstance(val, torch.Tensor) else 0


def _real(storages: Iterable[_Storage | None]) -> list[_Storage]:
    return [s for s in storages if s is not None]


def _outputs_of(
    node: fx.Node, storages: dict[fx.Node, list[_Storage | None]], activation: bool
) -> list[_Storage | None]:
    """The node's storages: one per output position (``None`` where an
    output is not a tensor); a view shares its base's."""
    if is_view_op(node):
        base = node.args[0]
        base_storages = storages.get(base, []) if isinstance(base, fx.Node) else []
        if getattr(node.target, "__name__", "") == "getitem" and isinstance(base, fx.Node) and isinstance(
            base.meta.get("val"), (list, tuple)
        ) and not is_view_op(base):
            index = node.args[1]
            hit = base_storages[index] if isinstance(index, int) and index < len(base_storages) else None
            return [hit] if hit is not None else []
        return _real(base_storages)[:1]
    val = node.meta.get("val")
    values = val if isinstance(val, (list, tuple)) else [val]
    return [
        _Storage(nbytes=concrete_int(v.numel()) * v.element_size(), activation=activation)
        if isinstance(v, torch.Tensor)
        else None
        for v in values
    ]
