"""Fusion: which values Inductor materialises, and what recomputing or
keeping a value really costs once it fuses.

Reads: ``node.meta["adacc"]`` (annotate pass), the nodes' users. Writes
nothing.

Why: Inductor fuses chains of pointwise ops into one kernel, so most
intermediate values of such a chain never exist in memory, and recomputing
one in the backward costs its consumer a few more input reads, not a kernel
of its own. A cost model that charges every recomputed op a full roofline
time plus a launch (and every temporary its bytes) holds far more than
Inductor's own partitioner, which exploits exactly this: at budget 0.7 adacc
once held 1.30x the default's memory on a Llama, and on a GPT-2 loss graph
the unfused simulation counted 720 MB of ``sub``/``exp`` values that
Inductor never materialises.

The rules (`Realization`):

* ``eager`` (the ``adacc_eager`` backend): every op runs on its own and
  materialises its output.
* ``inductor``: a pointwise op (``torch.Tag.pointwise``, or a
  ``slice_scatter``) whose consumers are all pointwise ops, reductions or
  indexing loads (``gather``, ``index``, ``embedding``; looking through
  views) is fused into them and never materialised, and so is a constant
  fill read only by such ops or copied by a functional scatter into its
  output; anything else (matmuls, attention, reductions, norms, random
  ops, collectives, custom ops, scatters, an indexing load's own output) produces a buffer,
  and a pointwise value read by such an op, directly or through a view, must
  be materialised too, except for a fallback that copies it
  (``native_dropout`` under ``fallback_random``: `copies_its_input`), while
  its other readers still inline it, and for a functional scatter's first
  input, which the scatter's copy computes. Inductor's own random numbers
  (``prims.inductor_random``) are written only where a kernel that cannot
  be fused with theirs reads them (`_REALISED_BY_THEIR_LOWERING`; in the
  plan's linear model, always). Views never allocate. A value fused into the one op
  that reads it reads its own inputs where that op's kernel runs
  (`memory_sim`). Inductor's lowering also writes a fusible value with
  several readers whose inlined computation reads more than a few buffers
  or (CPU) holds an exponential, and keeps that buffer where a reader (or
  a kernel a reader is inlined into) runs past a matmul or another op that
  cannot share the kernel (`realised_by_lowering`). This is a static approximation of Inductor's
  scheduler; two Inductor
  behaviours it cannot follow, buffer reuse and fusing the backward's
  recomputations with far kernels, are turned off for adacc's graphs
  (`compat_inductor.inductor_compile`, `mark_placed`). A third is left on because it
  only lowers the real peak: Inductor's ``reorder_for_peak_memory`` runs a
  kernel earlier where that frees its input (a GPT attention's copy of V
  runs with those of Q and K when the QKV projection is not saved, 2 MiB
  below the model at d_model 256, measured), so the model may over-predict.
  Following it in the graph was tried: in another plan Inductor wrote V's
  copy after the attention's dropout instead (Q's and K's kernel there
  also computed the causal mask), 2 MiB over such a model (bench/RESULTS.md,
  2026-12-06).
  On CPU the generated kernels between two external calls form one C++
  function whose outputs are all allocated before it runs and whose dead
  inputs are freed after it (`kernel_group_ends`). The reorder may move a
  compress chain that stands at the forward's end (a value only the
  backward reads) next to its producer; the model keeps it in that last
  group and over-predicts. Views only the backward reads are therefore
  taken early (`early_placement`; a GPT's compress-only plans were
  predicted up to 15.5 MiB over, now exactly).

Costs (seconds, on a `DeviceProfile`): keeping a value costs writing it in
the forward (unless it is materialised there anyway) and reading it back in
the backward; recomputing a fused value costs reading its inputs; recomputing
anything else costs its roofline time plus a launch. Values the forward
computes only for the backward (PyTorch's "unclaimed" nodes) run once either
way: computing them in the backward instead adds nothing.
"""

from __future__ import annotations

import enum
from typing import Iterable

import torch
import torch.fx as fx

from adacc_compile import compat, compat_inductor

from .annotate import META_KEY, annotation, input_bytes
from .compress_rewrite import DECOMPRESSED
from .device_profile import DeviceProfile
from .op_class import OpClass, classify, is_realize_op, is_view_op, op_name


class Realization(str, enum.Enum):
    EAGER = "eager"
    INDUCTOR = "inductor"


_FUSIBLE_CLASSES = (OpClass.ELEMENTWISE, OpClass.ACTIVATION, OpClass.MASK, OpClass.VIEW)
#: Ops that Inductor lowers to a pointwise kernel loading the tensor they
#: index through its loader (``torch/_inductor/lowering.py``: ``gather``,
#: ``index``, ``_unsafe_index``, ``embedding``), so an unmaterialised
#: pointwise producer is inlined into them rather than written: the
#: cross-entropy's log-probabilities, read by the gather of the targets,
#: never exist in memory (measured on an H200 and on this CPU; counting
#: them put a 32000-word vocabulary's 500 MiB into the forward's peak).
_INLINING_INDEXERS = frozenset({"aten.gather", "aten.index", "aten._unsafe_index", "aten.embedding"})
#: Constant fills: an index expression in the kernels that read them.
_CONSTANT_FILLS = frozenset({"aten.full", "aten.zeros", "aten.ones", "aten.scalar_tensor"})
#: Functional scatters that Inductor lowers as a copy of their first input
#: into their own output buffer, then written in place: a constant first
#: input is that copy's fill, not a buffer of its own (the embedding
#: backward's zeros, 250 MiB for a 32000 x 2048 float32 table, counted
#: twice before).
_SCATTERS_INTO_A_COPY = frozenset({
    "aten.index_put", "aten._unsafe_index_put", "aten._unsafe_masked_index_put_accumulate",
    "aten.scatter", "aten.scatter_add", "aten.scatter_reduce", "aten.as_strided_scatter",
})
#: Ops without the pointwise tag that Inductor lowers to a pointwise kernel
#: (a select between their two inputs): fused like any pointwise op (the
#: RoPE backward's scatters of the even and odd halves into zeros).
_POINTWISE_LOWERINGS = frozenset({"aten.slice_scatter", "aten.select_scatter"})
#: Ops whose lowering writes their pointwise result to a buffer at once
#: (``realize()``), which Inductor's scheduler then drops where every
#: kernel reading it is fused into the one that writes it: Inductor's own
#: random numbers (``prims.inductor_random``, what dropout becomes without
#: ``fallback_random``). A GPT's forward compares them into its dropout
#: mask in that kernel (no buffer: modelled as one, a compress-only step
#: was predicted 4.3 MiB over the allocator's peak at d_model 256); a
#: backward that recomputes the mask for the softmax gradient, which runs
#: after the recomputed scores' matmul, writes them (4 MiB, measured).
_REALISED_BY_THEIR_LOWERING = frozenset({"prims.inductor_random"})
#: Fallback ops whose lowering constrains an input to the FX graph's strides
#: (``constrain_to_fx_strides``): a pointwise input that is not yet written
#: is *copied* into a buffer for the op alone (``ExternKernel.copy_input``),
#: and the value's other readers still inline it. ``native_dropout`` runs as
#: a fallback only under ``fallback_random`` (the benchmarks' setting); a GPT
#: attention's probabilities, read by it and by the dropout's product, are
#: then written once for the dropout and recomputed from the softmax's
#: exponentials after it, which keeps those exponentials written until then
#: (measured: the 4 MiB a GPT d256 step held above this model in the second
#: block's dropout, before).
_INPUT_COPYING_FALLBACKS = frozenset({"aten.native_dropout"})


def _op_class(node: fx.Node) -> OpClass:
    ann = node.meta.get(META_KEY)
    return ann.op_class if ann is not None else classify(node)  # nodes a rewrite added


def is_pointwise(node: fx.Node) -> bool:
    """A pointwise op Inductor can fuse (views are handled separately)."""
    if node.op != "call_function":
        return False
    if op_name(node) in _POINTWISE_LOWERINGS:
        return True
    return torch.Tag.pointwise in getattr(node.target, "tags", ()) and _op_class(node) in _FUSIBLE_CLASSES


def absorbs_producer(node: fx.Node) -> bool:
    """True when ``node`` can take a pointwise producer into its own kernel
    (pointwise ops and reductions). A view passes the producer on to its
    own consumers, so it absorbs it only if all of them do: a pointwise
    value viewed and then read by a matmul is materialised (Inductor's
    ``mm`` reads a buffer), as the SiLU backward's product feeding the
    gate projection's weight gradient is."""
    if node.op != "call_function" or is_realize_op(node):
        return False  # `compat_inductor.realize_op` writes its input to a buffer
    if is_view_op(node):
        return all(c.op != "output" and absorbs_producer(c) for c in node.users)
    tags = getattr(node.target, "tags", ())
    name = op_name(node)
    return (
        torch.Tag.pointwise in tags
        or _op_class(node) is OpClass.REDUCTION
        or name in _INLINING_INDEXERS
        or name in _POINTWISE_LOWERINGS
    )


def copies_its_input(node: fx.Node) -> bool:
    """Does Inductor give ``node`` a copy of an unwritten pointwise input
    (see ``_INPUT_COPYING_FALLBACKS``) rather than writing that input once
    for all its readers?"""
    return node.op == "call_function" and op_name(node) in _INPUT_COPYING_FALLBACKS


#: Op classes Inductor runs as calls to an external kernel (a BLAS matmul,
#: an attention library, a collective) rather than as generated code.
_EXTERN_CLASSES = (OpClass.MATMUL, OpClass.ATTENTION, OpClass.COLLECTIVE)


def runs_as_extern_kernel(node: fx.Node) -> bool:
    """Does Inductor call ``node`` as an external kernel (a matmul,
    attention, a collective, a fallback such as ``native_dropout`` under
    ``fallback_random``, a custom op) rather than generate its code? On
    CPU the generated kernels between two such calls form one C++ function
    (`kernel_group_ends`)."""
    if node.op != "call_function":
        return False
    if is_view_op(node):
        return _bitcast_to_another_width(node)
    if _op_class(node) in _EXTERN_CLASSES or copies_its_input(node):
        return True
    return op_name(node).split(".", 1)[0] not in ("aten", "prims", "_operator")


def _bitcast_to_another_width(node: fx.Node) -> bool:
    """A ``view(dtype)`` to a dtype of another width (a codec's int8 bytes
    read as int32): Inductor runs it as a fallback call
    (``to_dtype_bitcast``), which ends a C++ kernel group."""
    if node.target is not torch.ops.aten.view.dtype:
        return False
    source, result = (tensor_value(n) for n in (node.args[0], node))
    return source is not None and result is not None and source.dtype.itemsize != result.dtype.itemsize


def tensor_value(node: object) -> torch.Tensor | None:
    """The tensor a node's fake value holds, if it is one (None for other
    arguments and non-tensor values)."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def kernel_group_ends(nodes: list[fx.Node]) -> dict[int, int]:
    """Per position, where the buffers its kernel is the last to read are
    freed under Inductor on CPU: Inductor's C++ backend emits the generated
    kernels between two external calls as one function, allocating every
    output of the group before calling it and freeing what the group was
    the last to read after it returns (the scheduler frees at each flush,
    and the C++ backend flushes only at an external call), so values that
    graph order would free one by one are alive together. An external call
    frees its dead inputs right after it runs. On a GPT whose forward
    computed and compressed a GELU's derivative next to the GELU
    (`early_placement`), the two written 4 MiB values and their codes were
    alive at once (measured), where freeing each after its compress put
    the step 2.5 MiB under the allocator's peak; a Llama's compress-only
    plans were 0.15 MiB under it and are now predicted exactly. On GPU each
    generated kernel is its own launch: positions map to themselves.

    A ``getitem`` of an external call's outputs is part of that call: the
    wrapper takes the outputs it needs and frees the call's other outputs
    at once (``del buf132`` right after ``native_dropout`` under
    ``fallback_random``), not when the next group returns; freeing the
    unused dropout output there put a GPT's forward 1 MiB over the
    allocator's trace at the attention."""
    ends: dict[int, int] = {}
    group: list[int] = []
    for index, node in enumerate(nodes):
        if _takes_an_extern_output(node):
            ends[index] = index
        elif runs_as_extern_kernel(node):
            for member in group:
                ends[member] = group[-1]
            group = []
            ends[index] = index
        elif node.op == "call_function" and _device_type(node) == "cpu":
            group.append(index)
        else:
            ends[index] = index
    for member in group:
        ends[member] = group[-1]
    return ends


def _takes_an_extern_output(node: fx.Node) -> bool:
    """A ``getitem`` of an external call's outputs (`kernel_group_ends`)."""
    source = node.args[0] if node.op == "call_function" and node.args else None
    return (
        getattr(node.target, "__name__", "") == "getitem"
        and isinstance(source, fx.Node)
        and runs_as_extern_kernel(source)
    )


def _fill_needs_no_buffer(node: fx.Node, consumers: list[fx.Node]) -> bool:
    """A constant fill whose every reader inlines it (a fusible op) or
    copies it into its own output (a functional scatter's first input)."""
    if node.op != "call_function" or op_name(node) not in _CONSTANT_FILLS or not consumers:
        return False
    return all(_computes_it_in_its_kernel(c, node) for c in consumers)


def _computes_it_in_its_kernel(consumer: fx.Node, value: fx.Node) -> bool:
    """Does ``consumer``'s kernel compute ``value`` itself: a fusible op
    (`absorbs_producer`), or a functional scatter whose first input it is
    (Inductor lowers it as a copy of that input, which the copy's kernel
    computes, then the scatter into it: an outlier codec's decoded values,
    scattered into by the outliers, are one buffer); through views."""
    if consumer.op != "call_function" or is_realize_op(consumer):
        return False  # `compat_inductor.realize_op` writes its input to a buffer
    if is_view_op(consumer):
        return bool(consumer.users) and all(_computes_it_in_its_kernel(c, consumer) for c in consumer.users)
    if op_name(consumer) in _SCATTERS_INTO_A_COPY and consumer.args and consumer.args[0] is value:
        return True
    return absorbs_producer(consumer)


def materialised(
    node: fx.Node, consumers: Iterable[fx.Node], mode: Realization, memo: dict | None = None
) -> bool:
    """Does computing ``node`` (for ``consumers``) allocate its output?

    With ``memo`` (a dict kept for one unchanged graph: `inlined_reads`,
    these answers and the graph's node positions are cached there) the lowering's own rules apply too
    (`realised_by_lowering`): the memory simulator uses them on the split
    graphs Inductor compiles. The plan's linear model does not: on the
    joint graph they realise a residual stream's sums every few layers
    (reads accumulate along the stream until one is written), which would
    make identical blocks cost differently; the plan search's fit to the
    simulated peak corrects what that leaves out."""
    if node.op != "call_function" or is_view_op(node):
        return False
    consumers = list(consumers)
    if mode is Realization.INDUCTOR and _fill_needs_no_buffer(node, consumers):
        return False
    if mode is Realization.INDUCTOR and memo is not None and op_name(node) in _REALISED_BY_THEIR_LOWERING:
        return _kept_by_the_scheduler(node, consumers, memo)
    if mode is Realization.EAGER or not is_pointwise(node):
        return True
    if any(c.op == "output" for c in consumers):
        return True
    inlining = [c for c in consumers if not copies_its_input(c)]  # the others get a copy
    if not inlining or not all(_computes_it_in_its_kernel(c, node) for c in inlining):
        return True
    if memo is None:
        return False
    key = ("realised", node, frozenset(consumers))
    if key not in memo:
        memo[key] = realised_by_lowering(node, consumers, mode, memo)
    return memo[key]


def _kept_by_the_scheduler(node: fx.Node, consumers: list[fx.Node], memo: dict) -> bool:
    """A value its lowering realised (`_REALISED_BY_THEIR_LOWERING`) keeps
    its buffer unless its readers' kernels fuse with its own where it
    stands: none waits for a matmul or another op that cannot share a
    kernel placed after it in the graph (a backward's recomputed dropout
    mask, read by the softmax gradient after the recomputed scores' matmul:
    written by a kernel of its own before that matmul, 4 MiB at d_model
    256, measured), and each loops over as many elements (a mask broadcast
    over a batch is read by a larger kernel, which Inductor does not fuse
    with the smaller one). Readers of one row sum and one product with it
    fuse: no buffer."""
    if not consumers or any(c.op == "output" for c in consumers):
        return True
    readers = [r for r in _reading_kernels(consumers) if r.op == "call_function" and not is_view_op(r)]
    size = _loop_size(node)
    if any(_loop_size(r) != size for r in readers):
        return True
    if "positions" not in memo:
        memo["positions"] = {n: i for i, n in enumerate(node.graph.nodes)}
    position = memo["positions"]
    return any(_waits_for_a_boundary_after(r, position[node], position) for r in readers)


def _waits_for_a_boundary_after(reader: fx.Node, start: int, position: dict[fx.Node, int]) -> bool:
    """Does ``reader`` depend on an op no kernel can absorb (a matmul, a
    custom op) that stands after position ``start``?"""
    stack, seen = list(reader.all_input_nodes), set()
    while stack:
        arg = stack.pop()
        if arg in seen or position.get(arg, -1) <= start:
            continue
        seen.add(arg)
        if arg.op == "call_function" and not (is_view_op(arg) or absorbs_producer(arg)):
            return True
        stack.extend(arg.all_input_nodes)
    return False


def _loop_size(node: fx.Node) -> int | None:
    """Elements ``node``'s kernel loops over: its output's, or for a
    reduction its largest input's."""
    inputs = node.all_input_nodes if _op_class(node) is OpClass.REDUCTION else [node]
    sizes = [compat.concrete_int(value.numel()) for value in map(tensor_value, inputs) if value is not None]
    return max(sizes, default=None)


def realised_by_lowering(node: fx.Node, consumers: list[fx.Node], mode: Realization, memo: dict) -> bool:
    """Inductor's lowering writes a fusible pointwise value to a buffer
    anyway where inlining it would repeat too much (`compat_inductor.realize_thresholds`):
    with more than one reader, when its inlined computation reads more
    than a few buffers or (CPU) holds an exponential, logarithm, sigmoid or
    tanh; with any number, when it reads very many. A LayerNorm backward's
    input gradient, read by the dropout backward and by the residual
    stream's next gradient, reads seven buffers through its inlined
    producers: Inductor writes it (measured: the 1 MiB a 2-layer GPT's
    step held above this model, before the rule)."""
    reads, ops = inlined_reads(node, mode, memo)
    limits = compat_inductor.realize_thresholds(_device_type(node))
    readers = set(consumers)
    realised = (len(readers) > 1 and (len(reads) > limits.reuse_reads or bool(ops & limits.heavy_ops))) or (
        len(reads) > limits.accumulated_reads
    )
    if not realised:
        return False
    if "positions" not in memo:
        memo["positions"] = {n: i for i, n in enumerate(node.graph.nodes)}
    return _read_past_a_kernel_boundary(node, _reading_kernels(readers), memo["positions"])


def _reading_kernels(readers: Iterable[fx.Node]) -> set[fx.Node]:
    """The ops whose kernels read a value that ``readers`` read: each
    reader, and for a reader fused into its own consumers (by the
    structural rule of `materialised`; through views) those consumers, since
    Inductor inlines the reader, and its reads, into their kernels."""
    kernels: set[fx.Node] = set()
    stack = list(readers)
    while stack:
        reader = stack.pop()
        if reader in kernels:
            continue
        kernels.add(reader)
        if reader.op == "call_function" and (
            is_view_op(reader)
            or (is_pointwise(reader) and not materialised(reader, reader.users, Realization.INDUCTOR))
        ):
            stack.extend(reader.users)
    return kernels


def _read_past_a_kernel_boundary(node: fx.Node, readers: set[fx.Node], position: dict[fx.Node, int]) -> bool:
    """Whether one of ``readers`` (the kernels reading ``node``, `_reading_kernels`)
    runs after an op that cannot share ``node``'s kernel (a matmul, a
    custom op) and depends on ``node``: only then does a realised value
    keep its buffer. Inductor's scheduler drops a realised buffer whose
    readers all fused into the kernel that writes it (a SiLU backward's
    sigmoid, read twice in one kernel, is realised and never allocated).
    A reader inlined into a later kernel reads the buffer there: the
    softmax's exponentials, read by its division, which a dropout's product
    after the (fallback) dropout recomputes."""
    last = max((position.get(r, -1) for r in readers), default=-1)
    frontier = [(user, False) for user in node.users]
    seen: set[tuple[fx.Node, bool]] = set()
    while frontier:
        current, past = frontier.pop()
        if (current, past) in seen or position.get(current, last + 1) > last:
            continue
        seen.add((current, past))
        if past and current in readers:
            return True
        boundary = current.op != "call_function" or not absorbs_producer(current)
        frontier.extend((user, past or boundary) for user in current.users)
    return False


def inlined_reads(node: fx.Node, mode: Realization, memo: dict) -> tuple[frozenset[fx.Node], frozenset[str]]:
    """The buffers a fused pointwise ``node`` reads where it is inlined (its
    inputs, and through views and unmaterialised pointwise producers
    theirs) and the names of the ops it inlines (``exp``, ``mul``, ...)."""
    if node in memo:
        return memo[node]
    reads: set[fx.Node] = set()
    ops = {op_name(node).rsplit(".", 1)[-1]}  # aten.exp -> exp
    for arg in node.all_input_nodes:
        source = arg
        while source.op == "call_function" and is_view_op(source) and source.all_input_nodes:
            source = source.all_input_nodes[0]
        if source.op == "call_function" and is_pointwise(source) and not materialised(
            source, source.users, mode, memo
        ):
            more, their_ops = inlined_reads(source, mode, memo)
            reads |= more
            ops |= their_ops
        elif source.op == "placeholder" or source.all_input_nodes:
            reads.add(source)
        # else: a constant (``full``, ``iota``, ``scalar_tensor``): an
        # index expression in the kernel, no buffer
    memo[node] = (frozenset(reads), frozenset(ops))
    return memo[node]


def _device_type(node: fx.Node) -> str:
    value = node.meta.get("val")
    device = getattr(value, "device", None)
    return device.type if device is not None else "cpu"


PLACED = "adacc_placed"
"""Meta key on the backward nodes the plan placed (`mark_placed`): Inductor
fuses them only with their neighbours (`compat_inductor.inductor_compile`)."""


def mark_placed(bw_module: fx.GraphModule, forward_names: set[str]) -> None:
    """Tags the backward nodes the plan placed: recomputations (a forward
    node's name in the backward) and decompressions. The memory model runs
    them where they stand; Inductor fusing one with a far kernel that merely
    shares an input would run it elsewhere, with its buffers."""
    for node in bw_module.graph.nodes:
        if node.op == "call_function" and (node.name in forward_names or DECOMPRESSED in node.meta):
            node.meta[PLACED] = True


def keep_seconds(node: fx.Node, *, realised_in_forward: bool, profile: DeviceProfile, mode: Realization) -> float:
    """Time keeping ``node`` adds: the forward writes it (if it would
    otherwise stay fused) and the backward reads it back."""
    if mode is Realization.EAGER or is_view_op(node):
        return 0.0
    nbytes = annotation(node).storage_bytes
    written = 0 if realised_in_forward else nbytes
    return (written + nbytes) / profile.memory_bytes_per_s


def recompute_seconds(
    node: fx.Node, *, forward_needed: bool, realised_in_backward: bool, profile: DeviceProfile, mode: Realization
) -> float:
    """Time recomputing ``node`` in the backward adds (see module docstring)."""
    ann = annotation(node)
    if is_view_op(node) or not forward_needed:
        return 0.0
    if mode is Realization.INDUCTOR and is_pointwise(node) and not realised_in_backward:
        return input_bytes(node) / profile.memory_bytes_per_s
    return ann.runtime_s
