"""The private PyTorch APIs of partitioning and compiling, in one place.

adacc supports torch 2.11 through 2.15. The partitioner helpers in
``torch._functorch.partitioners`` and the logging/compile entry points are
private and their signatures drift between releases; the rest of the code base
calls only the functions below, so a torch upgrade is a change to this file
and its two siblings: `compat_memory` (allocator and profiler events) and
`compat_distributed` (process groups).
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._functorch import partitioners as _partitioners
from torch._functorch.compile_utils import raise_getitems as _raise_getitems
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.experimental.proxy_tensor import is_sym_node as _is_sym_node

from adacc_compile.graph_splice import splice_graph

TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


# --------------------------------------------------------------------------
# joint-graph classification
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JointGraphInfo:
    """Which joint-graph nodes belong to the forward and to the backward.

    ``forward_nodes`` includes the primal placeholders and every node that
    does not depend on a tangent; ``backward_nodes`` the rest.
    ``forward_needed`` are the forward nodes the forward outputs need; the
    other forward nodes ("unclaimed" in PyTorch's partitioner) compute only
    what the backward reads, and run in the forward only when saved."""

    forward_nodes: frozenset[fx.Node]
    backward_nodes: frozenset[fx.Node]
    static_lifetime_input_nodes: Any  # OrderedSet[fx.Node], passed back to torch
    forward_needed: frozenset[fx.Node] = frozenset()
    node_info: Any = None
    """PyTorch's own classification (``partitioners.NodeInfo``), reused by
    `default_saved_values`."""


def is_sym_node(node: fx.Node) -> bool:
    return bool(_is_sym_node(node))


def is_primal(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" not in str(node.target) and not str(
        node.target
    ).startswith(("bwd_seed", "bwd_base_offset"))


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def prepare_joint_graph(joint_module: fx.GraphModule) -> fx.GraphModule:
    """The clean-ups PyTorch's own partitioner runs before deciding.

    Dead code is removed, user recompute tags are cleaned, and collectives,
    effectful ops and backward-mutation sources are tagged "must save" (the
    planner honours those tags: `must_save`).

    The joint graph is planned and split, never run: it becomes a lazy
    GraphModule, so the passes that edit it (this one, dropout replay, the
    early placement) do not each regenerate its Python code (a quarter of
    a second each at 32 GPT-2 layers).
    """
    joint_module = _LazyGraphModule.from_graphmodule(joint_module)
    joint_module.graph.eliminate_dead_code()
    joint_module.recompile()
    if _partitioners.has_recomputable_ops(joint_module):
        joint_module = _call(
            _partitioners.cleanup_recompute_tags, joint_module, is_default_partition=False
        )
    if not torch._functorch.config.unsafe_allow_optimization_of_collectives:
        _partitioners.force_save_collectives(joint_module)
    _partitioners.force_save_effectful_ops(joint_module)
    if hasattr(_partitioners, "force_save_bw_mutation_src"):
        _partitioners.force_save_bw_mutation_src(joint_module)
    return joint_module


def must_save(node: fx.Node) -> bool:
    """True when PyTorch tagged the node as one that may never be recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy

    return node.meta.get("recompute") in (
        CheckpointPolicy.MUST_SAVE,
        CheckpointPolicy.PREFER_SAVE,
    )


def classify_joint_graph(
    joint_module: fx.GraphModule,
    static_lifetime_input_indices: Sequence[int] | None,
    num_fwd_outputs: int,
) -> JointGraphInfo:
    info = _partitioners.classify_nodes(
        joint_module, list(static_lifetime_input_indices or []), num_fwd_outputs
    )
    # Backward = what depends on the tangents or must run in the backward;
    # everything else (including "unclaimed" nodes such as a layer norm's
    # mean/rstd outputs) is a forward value that may be saved.
    backward = frozenset(info.required_bw_nodes)
    forward = frozenset(
        n for n in joint_module.graph.nodes if n not in backward and n.op != "output"
    )
    needed = frozenset(info.required_fw_nodes)
    return JointGraphInfo(forward, backward, info.static_lifetime_input_nodes, needed, info)


def default_saved_values(
    joint_module: fx.GraphModule, graph_info: JointGraphInfo, memory_budget: float = 1.0
) -> list[fx.Node]:
    """The values PyTorch's default partitioner for Inductor (the min-cut
    rematerialisation partitioner, at no memory budget) saves for this joint
    graph: the anchor of adacc's ratio budgets. Only its choice is computed,
    not its forward/backward split; the graph is not changed (the min cut
    reads a ``dist_from_bw`` attribute it expects on every node).

    ``memory_budget`` below 1 is PyTorch's own memory-budget partitioner
    (``torch._functorch.config.activation_memory_budget``; its ratio is of
    the saved bytes above what saving only the inputs holds), the baseline
    ``adacc plan`` compares with."""
    info = graph_info.node_info
    if not info.required_bw_nodes:
        return []
    for node in reversed(joint_module.graph.nodes):
        if node.op == "output" or info.is_required_fw(node):
            node.dist_from_bw = int(1e9)
            if node.op != "output":
                for user in node.users:
                    node.dist_from_bw = min(node.dist_from_bw, user.dist_from_bw + 1)
        else:
            node.dist_from_bw = 0
    return list(_partitioners.choose_saved_values_set(joint_module.graph, info, memory_budget=memory_budget))


def forward_output_nodes(joint_module: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    outputs = _partitioners._extract_fwd_bwd_outputs(joint_module, num_fwd_outputs=num_fwd_outputs)
    return [n for n in outputs[0] if isinstance(n, fx.Node)]


def extract_forward_backward(
    joint_module: fx.GraphModule,
    saved_values: list[fx.Node],
    *,
    num_fwd_outputs: int,
    static_lifetime_input_nodes: Any,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Splits the joint graph given the nodes saved for the backward.

    Everything the backward needs that is neither saved nor a backward input
    is recomputed inside the backward graph (that is how PyTorch's extractor
    works, and what makes a "recompute" decision real). The backward is then
    reordered to mimic the autograd engine, which places each recomputation
    right before its first use.
    """
    saved_sym_nodes = [n for n in saved_values if is_sym_node(n)]
    saved_tensors = [n for n in saved_values if not is_sym_node(n)]
    kwargs: dict[str, Any] = {
        "num_fwd_outputs": num_fwd_outputs,
        "static_lifetime_input_nodes": static_lifetime_input_nodes,
    }
    fw_module, bw_module = _call(
        _partitioners._extract_fwd_bwd_modules,
        joint_module,
        saved_tensors,
        saved_sym_nodes=saved_sym_nodes,
        **kwargs,
    )
    if _partitioners.has_recomputable_ops(joint_module) and _partitioners.has_recomputable_rng_ops(
        joint_module
    ):
        fw_module, bw_module = _partitioners.functionalize_rng_ops(
            joint_module, fw_module, bw_module, len(saved_sym_nodes)
        )
    bw_module = reorder_like_autograd(bw_module)
    # PyTorch's `raise_getitems` regenerates the Python code of both graphs;
    # the same reordering on lazy modules leaves that to the first call.
    fw_module = _raise_getitems(_LazyGraphModule.from_graphmodule(fw_module))
    bw_module = _raise_getitems(_LazyGraphModule.from_graphmodule(bw_module))
    if hasattr(_partitioners, "thread_graphsafe_rng_from_hops"):
        fw_module = _partitioners.thread_graphsafe_rng_from_hops(fw_module, is_backward=False)
        bw_module = _partitioners.thread_graphsafe_rng_from_hops(bw_module, is_backward=True)
    return fw_module, bw_module


def reorder_like_autograd(gm: fx.GraphModule) -> fx.GraphModule:
    """PyTorch's ``reordering_to_mimic_autograd_engine`` (each backward node
    in order, preceded by the recomputed nodes it needs, in graph order),
    building a lazy GraphModule: PyTorch's builds an eager one, whose
    Python code generation was a third of a 32-layer Llama's split (0.45 s
    of 1.35 s, profiled), for a module the split replaces at once.
    `tests/adacc_compile/test_compat_reorder.py` checks the order against
    PyTorch's."""
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        env[node] = new_graph.node_copy(node, lambda x: env[x])
    order = {node: idx for idx, node in enumerate(gm.graph.nodes)}

    def insert(node: fx.Node) -> None:
        pending, needed = [node], set()
        while pending:
            node = pending.pop()
            if node in needed or node in env:
                continue
            needed.add(node)
            pending += node.all_input_nodes
        for node in sorted(needed, key=order.__getitem__):
            env[node] = new_graph.node_copy(node, lambda x: env[x])

    first = min(
        (user for tangent in gm.graph.nodes if is_tangent(tangent) for user in tangent.users),
        key=order.__getitem__, default=None,
    )
    if first is None:  # no backward node reads a tangent
        return gm
    nodes = list(gm.graph.nodes)
    for node in nodes[: order[first]]:  # a copy_ need not read a tangent
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            insert(node)
    for node in nodes[order[first]:]:
        insert(node)
    return _LazyGraphModule(gm, new_graph)


def lazy_graph_modules() -> Any:
    """Context in which new GraphModules generate their Python code on first
    call instead of on construction (``torch.fx._lazy_graph_module``).

    Inductor compiles under the same context; the pipeline uses it so that
    the split, the codec rewrite and every re-plan attempt do not each pay
    for FX code generation (about half of a 32-layer split's time)."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(True)


# --------------------------------------------------------------------------
# symbolic sizes
# --------------------------------------------------------------------------


def concrete_int(value: Any, fallback: int = 8192) -> int:
    """A plain int for a possibly symbolic size, without adding guards."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        from torch.fx.experimental import symbolic_shapes as sym

        if hasattr(sym, "optimization_hint"):
            return int(sym.optimization_hint(value, fallback=fallback))
        node = value.node
        if getattr(node, "_hint", None) is not None:
            return int(node._hint)
        return int(node.shape_env.size_hint(node.expr, fallback=fallback))
    return int(value)


# --------------------------------------------------------------------------
# compilation entry points
# --------------------------------------------------------------------------


def inductor_compile(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    config_patches: dict[str, Any],
    *,
    pinned_meta_key: str | None = None,
    whole_ops: Sequence[Any] = (),
) -> Callable[..., Any]:
    """Inductor behind AOTAutograd with ``config_patches``.

    ``whole_ops``: aten ops the joint graph keeps whole (Inductor's
    decompositions less these): the activation backwards a few-bit codec
    replaces (`Codec.replaced_op`), which Inductor's table decomposes into
    erf and exp products that no rewrite could recognise. Inductor has no
    lowering for them, so whatever the plan leaves of them must be
    decomposed before its graphs reach Inductor (`decompose_whole_ops`).

    With ``pinned_meta_key``, a scheduler node built from a graph node whose
    ``meta`` holds that key is fused with another kernel only if the two
    are neighbours in the graph's order. A fusion of far kernels runs them
    in one place, so it moves work the plan placed, with its buffers: on a
    2-layer Llama, Inductor ran layer 0's recomputed RoPE with layer 1's (a
    layer early), and a recomputed SwiGLU product (through the recomputed
    SiLU it shares with the SiLU backward) past two matmuls; with the guard
    the measured step peak of that recompute-only plan fell from 26.8 to
    24.8 MiB (bench/RESULTS.md). The backward is compiled now, not at its
    first call, so that both graphs are compiled under the guard on this
    thread (Inductor's choices handler is thread-local)."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    decompositions = None
    if whole_ops:
        whole = set(whole_ops)
        decompositions = {op: fn for op, fn in select_decomp_table().items() if op not in whole}
    import torch._functorch.config as functorch_config

    # AOTAutograd's cache stores the partitioned graphs and, on a hit, never
    # calls the partitioner: no plan report, warnings, dumps, step-ledger
    # share or adaptation. It stays off for these graphs so the partitioner
    # runs on every compile; Inductor's FX graph cache, keyed on each split
    # graph (the plan's rewrite included), still serves their code.
    with functorch_config.patch(enable_autograd_cache=False):
        if pinned_meta_key is None:
            return compile_fx(gm, example_inputs, config_patches=config_patches, decompositions=decompositions)
        from torch._inductor.virtualized import V

        with functorch_config.patch(force_non_lazy_backward_lowering=True), V.set_choices_handler(
            _PinnedNodesStay(V.choices, pinned_meta_key)
        ):
            return compile_fx(gm, example_inputs, config_patches=config_patches, decompositions=decompositions)


def decompose_whole_ops(gm: fx.GraphModule, ops: Sequence[Any]) -> int:
    """Every call of one of ``ops`` in ``gm`` replaced by its decomposition
    in Inductor's table, traced on the call's fake values (`trace_aten`), in
    place; returns how many calls it replaced. See `inductor_compile`'s
    ``whole_ops``."""
    from torch._inductor.decomposition import select_decomp_table

    table, wanted = select_decomp_table(), set(ops)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in wanted and n.target in table]
    for node in calls:
        tensors = [a for a in node.args if isinstance(a, fx.Node)]
        if len(tensors) != len(node.args) or not all(isinstance(a.meta.get("val"), torch.Tensor) for a in tensors):
            raise ValueError(f"{node.format_node()}: only tensor arguments can be decomposed here")
        target, kwargs = node.target, dict(node.kwargs)
        traced = trace_aten(lambda *args: (target(*args, **kwargs),), [a.meta["val"] for a in tensors])
        meta = {k: node.meta[k] for k in ("stack_trace", "seq_nr") if k in node.meta}
        (result,) = splice_graph(gm.graph, traced, tensors, node, name=lambda i: f"{node.name}_d{i}", meta=meta)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
    if calls:
        gm.recompile()
    return len(calls)


class _PinnedNodesStay:
    """Inductor's choices handler (``torch._inductor.choices.InductorChoices``)
    with one more rule on fusion (`inductor_compile`); everything else is
    delegated to the handler it wraps."""

    def __init__(self, inner: Any, meta_key: str) -> None:
        self._inner = inner
        self._meta_key = meta_key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        apart = max(abs(node1.min_order - node2.max_order), abs(node2.min_order - node1.max_order))
        if apart > 1 and (self._pinned(node1) or self._pinned(node2)):
            return False
        return self._inner.can_fuse(scheduler, node1, node2, shared_data_score)

    def _pinned(self, snode: Any) -> bool:
        for sub in snode.get_nodes():
            ir_node = getattr(sub, "node", None)
            for origin in getattr(ir_node, "origins", ()) or ():
                if self._meta_key in getattr(origin, "meta", {}):
                    return True
        return False


def eager_aot_compile(
    gm: fx.GraphModule, example_inputs: Sequence[Any], partition_fn: Callable[..., Any]
) -> Callable[..., Any]:
    """AOTAutograd with ``partition_fn``; the fw/bw graphs run eagerly.

    They run through ``torch.fx.Interpreter.boxed_run``: inputs (saved
    activations included) and intermediates are freed right after their last
    use, as Inductor's generated code does. FX's generated Python keeps some
    inputs alive to the end of the graph, which would make measured memory
    disagree with the plan.
    """
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=_interpreted,
        bw_compiler=_interpreted,
        partition_fn=partition_fn,
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs)


def _interpreted(gm: fx.GraphModule, _example_inputs: Sequence[Any]) -> Callable[..., Any]:
    def run(args: list[Any]) -> Any:
        return fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def custom_partitioner_base() -> type:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


# --------------------------------------------------------------------------
# tracing a model without running it (``adacc plan``)
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CapturedJoint:
    """A joint forward+backward graph as AOTAutograd hands it to a
    partitioner, with the arguments it passes; plans are made from it
    without compiling or running anything."""

    gm: fx.GraphModule
    joint_inputs: Any
    kwargs: dict[str, Any]


class _JointCaptured(Exception):
    """Raised by the capturing partitioner: nothing after it is needed."""


def fake_tensors() -> Any:
    """Context manager: tensors made inside are fake (shape, dtype, no
    storage), so a model of any size can be built and traced."""
    from torch._subclasses import FakeTensorMode

    return FakeTensorMode()


def capture_joint_graph(
    model: torch.nn.Module, inputs: Sequence[Any], *, whole_ops: Sequence[Any] = ()
) -> CapturedJoint:
    """Traces ``model(*inputs)`` with Dynamo and AOTAutograd (the graph
    ``torch.compile`` would partition) and stops at the partitioner, so
    nothing is compiled or run. ``model`` and ``inputs`` are normally fake
    (`fake_tensors`). Only Dynamo's first graph is traced: a model that
    returns its loss from one graph (no graph break before it) is planned
    whole; `joint_outputs_scalar` tells the caller whether that held.
    ``whole_ops``: as in `inductor_compile` (the options' few-bit codecs)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    captured: list[CapturedJoint] = []
    whole = set(whole_ops)

    def partition(gm: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        captured.append(CapturedJoint(inductor_joint_graph_passes(gm, joint_inputs), joint_inputs, kwargs))
        raise _JointCaptured

    def never_called(gm: fx.GraphModule, example_inputs: Any) -> Any:
        raise AssertionError("capture_joint_graph compiles nothing")

    def stop(*args: Any) -> Any:
        raise _JointCaptured

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        aot = aot_autograd(
            fw_compiler=never_called, bw_compiler=never_called, partition_fn=partition,
            decompositions={op: fn for op, fn in select_decomp_table().items() if op not in whole},
        )  # as Inductor traces it
        # The partitioner raises out of the backend, so Dynamo stops before
        # it builds the frame's guards (a second or more on a 7B model).
        aot(gm, example_inputs)
        return stop  # a graph without a backward: nothing captured

    from torch._dynamo.exc import BackendCompilerFailed

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend)(*inputs)
    except _JointCaptured:
        pass
    except BackendCompilerFailed as error:
        if not isinstance(error.inner_exception, _JointCaptured):
            raise
    finally:
        torch._dynamo.reset()
    if not captured:
        raise RuntimeError("no joint graph was captured: the model's first graph computes no gradient")
    return captured[0]


def inductor_joint_graph_passes(gm: fx.GraphModule, joint_inputs: Sequence[Any]) -> fx.GraphModule:
    """The joint graph after Inductor's joint-graph passes, which its
    ``partition_fn`` runs before any partitioner (adacc's backend included):
    the graph a compiled step plans. They rewrite what Inductor compiles
    differently, for instance the cross-entropy backward's scatter into a
    zero-filled ``[tokens, vocabulary]`` tensor into a pointwise select
    (a 500 MiB float32 buffer for a 32000-word vocabulary and 4096 tokens
    that a plan of the unrewritten graph counted and a GPU never held)."""
    import contextlib

    from torch._guards import detect_fake_mode
    from torch._inductor import compile_fx as _compile_fx
    from torch._inductor.virtualized import V

    passes = _compile_fx._recursive_joint_graph_passes
    fake_mode = detect_fake_mode(list(joint_inputs))
    # Inductor's compile sets the fake mode its passes build new values in.
    in_fake_mode = V.set_fake_mode(fake_mode) if fake_mode is not None else contextlib.nullcontext()
    with in_fake_mode, _compile_fx.get_cuda_device_context(gm):
        if "input_device" in inspect.signature(passes).parameters:
            devices = _compile_fx.get_inputs_devices(joint_inputs, gm)
            return passes(gm, skip_invoke_subgraph=True, input_device=next(iter(devices), None))
        return passes(gm, skip_invoke_subgraph=True)


def joint_outputs_scalar(captured: CapturedJoint) -> bool:
    """The traced graph's forward returns a 0-dim value (the loss) first,
    beside which it may return others (the logits): the backward starts in
    this graph, so no graph break came before the loss."""
    outputs = forward_output_nodes(captured.gm, int(captured.kwargs["num_fwd_outputs"]))
    values = [n.meta.get("val") for n in outputs]
    return bool(values) and isinstance(values[0], torch.Tensor) and values[0].dim() == 0


# --------------------------------------------------------------------------
# structured logging
# --------------------------------------------------------------------------


def log_artifact(name: str, payload: str, encoding: str = "string") -> None:
    """Emits an artifact through ``torch._logging.trace_structured`` so that
    TORCH_TRACE / tlparse show adacc's plan next to PyTorch's graphs."""
    from torch._logging import trace_structured

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": name, "encoding": encoding},
        payload_fn=lambda: payload,
    )


def log_json_artifact(name: str, data: Any) -> None:
    log_artifact(name, json.dumps(data, indent=1, sort_keys=True, default=str), "json")


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls ``fn`` with only the keyword arguments its signature accepts."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


# --------------------------------------------------------------------------
# making Inductor write a value once
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RealizeThresholds:
    """When Inductor's lowering writes a pointwise value to a buffer rather
    than inlining it into its readers (`GraphLowering.run_node`,
    `StorageBox.should_realize_on_reuse` / `has_exceeded_max_reads`)."""

    reuse_reads: int
    """A value with more than one reader is realised when its inlined
    computation reads more than this many buffers."""
    accumulated_reads: int
    """Any value is realised when its inlined computation reads more than
    this many buffers."""
    heavy_ops: frozenset[str]
    """On this device, a value with more than one reader whose inlined
    computation holds one of these ops is realised (CPU only)."""


def realize_thresholds(device_type: str) -> RealizeThresholds:
    """Inductor's realisation thresholds for ``device_type``, read from its
    config (the torch 2.13 values where a name is missing)."""
    try:
        from torch._inductor import config
    except ImportError:  # pragma: no cover - torch without Inductor
        config = None
    reuse = getattr(config, "realize_reads_threshold", 4)
    accumulated = getattr(config, "realize_acc_reads_threshold", None)
    if accumulated is None:
        name = "realize_cpu_acc_reads_threshold" if device_type == "cpu" else "_realize_acc_reads_threshold_default"
        accumulated = getattr(config, name, 12 if device_type == "cpu" else 8)
    heavy = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"}) if device_type == "cpu" else frozenset()
    return RealizeThresholds(reuse_reads=int(reuse), accumulated_reads=int(accumulated), heavy_ops=heavy)


@functools.lru_cache(maxsize=None)
def realize_op() -> Any:
    """The op that makes Inductor write its input to a buffer of the given
    strides, once, that every reader then loads (``prims.inductor_force_stride_order``;
    in eager it returns its input when the strides already match), or None
    where this torch lacks it.

    Why: Inductor's CPU lowering inlines an unrealised pointwise value into
    each of its readers unless the value holds an op it deems heavy (``exp``,
    ``log``, ``tanh``, ...; not ``erf``). A value the forward saves is an
    output and is written at once; once a codec replaces it among the saved
    outputs, the codec's two loops (statistics, then codes) each recompute
    the value's producer, a GELU's ``erf`` among them.
    """
    try:
        import torch._inductor.inductor_prims  # noqa: F401  (registers torch.ops.prims.inductor_*)
    except ImportError:  # pragma: no cover - torch without Inductor
        return None
    packet = getattr(torch.ops.prims, "inductor_force_stride_order", None)
    return None if packet is None else packet.default


def tensor_constant(gm: fx.GraphModule, name: str, tensor: torch.Tensor, before: fx.Node) -> fx.Node:
    """``tensor`` as buffer ``name`` of ``gm``, read into the graph right
    before ``before`` as AOTAutograd reads a tensor constant: a ``get_attr``
    node lifted by ``aten.lift_fresh_copy``, the one op through which the
    fake-tensor passes Inductor runs on a partitioned graph accept a real
    tensor (any other op on it fails under their fake mode). Returns the
    lifted node; both nodes get a fake value of ``before``'s fake mode."""
    gm.register_buffer(name, tensor)
    with gm.graph.inserting_before(before):
        constant = gm.graph.get_attr(name)
        lifted = gm.graph.call_function(torch.ops.aten.lift_fresh_copy.default, (constant,))
    lifted.name = f"{name}_lifted"
    mode = ambient_fake_mode([before.meta.get("val")])
    for node in (constant, lifted):
        node.meta["val"] = mode.from_tensor(tensor, static_shapes=True) if mode is not None else tensor
    return lifted


# --------------------------------------------------------------------------
# order pinning and process groups (recompute inside communication windows)
# --------------------------------------------------------------------------


def pin_order(gm: fx.GraphModule, deps: dict[fx.Node, list[fx.Node]]) -> bool:
    """Makes each key node run after its listed nodes, in a way Inductor's
    scheduler honours: the node is wrapped in the ``control_deps`` higher-order
    op (``torch._inductor.fx_passes.control_dependencies``), whose lowering
    realises the dependencies and adds them as scheduler edges. The wrapped
    node keeps its name and meta; eager execution runs it unchanged.

    Returns False (graph untouched) where this torch lacks the mechanism.
    """
    if not deps:
        return False
    try:
        from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    except ImportError:  # pragma: no cover - older torch
        return False
    preserve_node_ordering(gm.graph, {node: list(after) for node, after in deps.items()})
    gm.graph.lint()
    gm.recompile()
    return True


def pinned_target(node: fx.Node) -> Any:
    """The op a `pin_order` wrapper runs, or None when ``node`` is not one."""
    try:
        from torch._inductor.fx_passes.control_dependencies import control_deps
    except ImportError:  # pragma: no cover - older torch
        return None
    if node.op != "call_function" or node.target is not control_deps:
        return None
    subgraph = node.args[1]
    if isinstance(subgraph, fx.Node) and subgraph.op == "get_attr":
        owner = node.graph.owning_module
        subgraph = getattr(owner, str(subgraph.target), None) if owner is not None else None
    if not isinstance(subgraph, fx.GraphModule):
        return None
    calls = [n for n in subgraph.graph.nodes if n.op == "call_function"]
    return calls[0].target if len(calls) == 1 else None


def is_fake(tensor: torch.Tensor) -> bool:
    """A FakeTensor (shape and dtype only, no data)."""
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return bool(_is_fake(tensor))


def is_mutating(node: fx.Node) -> bool:
    """The node's operator writes to one of its inputs (schema-declared)."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def real_tensors() -> Any:
    """Context manager: real tensors even where a FakeTensorMode is active
    (the partitioner runs under AOTAutograd's fake mode, so a calibration
    run from it would otherwise time fake ops)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


# --------------------------------------------------------------------------
# codec graphs: a codec's torch reference as plain aten ops, and compiled
# --------------------------------------------------------------------------


def trace_aten(fn: Callable[..., Any], example_args: Sequence[Any]) -> fx.GraphModule:
    """``fn`` traced into a graph of functional aten ops, the form AOTAutograd
    hands to a partitioner: in-place ops become out-of-place
    (``torch.func.functionalize``) and Inductor's decompositions are applied,
    so that Inductor can lower and fuse every node.

    Traced on fake tensors: where ``example_args`` are fake (the partitioner
    runs under AOTAutograd's fake mode) that mode is reused, so the nodes'
    ``meta["val"]`` belong to it; real example arguments are faked afresh
    (nothing is computed either way).
    """
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    functional = torch.func.functionalize(fn, remove="mutations")
    return make_fx(functional, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example_args)


def ambient_fake_mode(values: Sequence[Any]) -> Any:
    """The FakeTensorMode that ``values`` (or the current context) belong
    to; None when they are real tensors outside any fake mode."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(values))


def inductor_compile_inference(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """``gm`` (an inference graph of aten ops, ``(*inputs) -> tuple``)
    compiled by Inductor as it compiles a partitioned forward: C++ on CPU,
    Triton on CUDA; its FX graph cache off. Returns ``fn(*inputs) -> tuple``.
    Call it through `run_isolated` from inside another compilation."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    with inductor_config.patch(fx_graph_cache=False, custom_partitioner_fn=None):
        return compile_fx(gm, list(example_inputs))


def generated_code(fn: Callable[[], Any]) -> list[str]:
    """The source of every module Inductor generates while ``fn()`` runs
    (``torch._inductor.utils.run_and_get_code``)."""
    from torch._inductor.utils import run_and_get_code

    return list(run_and_get_code(fn)[1])


def run_isolated(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a fresh thread, so that none of the caller's thread-local
    compile state leaks into it: the partitioner runs inside a compilation
    whose fake mode and tracing context (with its shape environment) a
    nested trace would otherwise pick up, adding symbols the outer graph's
    guards then cannot place."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


# --------------------------------------------------------------------------
# pipeline stages: AOTAutograd with wrapped forward/backward runners
# --------------------------------------------------------------------------


def aot_compile_with(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fw_compiler: Callable[..., Any],
    bw_compiler: Callable[..., Any],
    partition_fn: Callable[..., Any],
) -> Callable[..., Any]:
    """AOTAutograd with ``partition_fn`` and the caller's forward and
    backward compilers (inference graphs run interpreted, as in
    `eager_aot_compile`). Used by `adacc_compile.pipelining.recompute_ahead`,
    which wraps the split graphs to run the backward's recomputation early.
    The backward is compiled with the forward, not at its first call
    (AOTAutograd's lazy default), so the forward runner already knows the
    backward's inputs."""
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=fw_compiler,
        bw_compiler=bw_compiler,
        inference_compiler=_interpreted,
        partition_fn=partition_fn,
        keep_inference_input_mutations=True,
    )
    with functorch_config.patch(force_non_lazy_backward_lowering=True):
        return backend(gm, example_inputs)


def interpret(gm: fx.GraphModule) -> Callable[[list[Any]], Any]:
    """A boxed runner of ``gm`` (``fn(args_list)``; the list is consumed:
    inputs are freed after their last use), as `eager_aot_compile` runs
    the split graphs."""
    return _interpreted(gm, ())
