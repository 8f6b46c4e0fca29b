"""The private PyTorch APIs of compiling with Inductor, in one place:
its compile entry points (behind AOTAutograd, with adacc's partitioner, or
eager), making its lowering write a value once, pinning the order its
scheduler keeps, compiling a codec's aten graph, and AOTAutograd with
wrapped forward/backward runners for the pipeline stages.

Split from `compat` (the partitioner's shims), as every private API adacc
touches lives in a `compat*` module: Inductor's entry points, config names
and scheduler hooks drift between torch releases like the partitioner's,
and a torch upgrade is a change to these modules only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from adacc_compile.graph_splice import splice_graph


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
# order pinning (recompute inside communication windows)
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
