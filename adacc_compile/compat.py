"""The private PyTorch APIs of AOTAutograd's joint graph and its
partitioner, in one place.

adacc supports torch 2.11 through 2.15. The partitioner helpers in
``torch._functorch.partitioners`` and the logging entry points are private
and their signatures drift between releases; the rest of the code base
calls only the functions below and those of its siblings, so a torch
upgrade is a change to this file and its four siblings: `compat_inductor`
(Inductor's compile entry points, realisation, order pinning, codec graphs
and pipeline stages), `compat_tracing` (tracing a model without running it,
for ``adacc plan``), `compat_memory` (allocator and profiler events) and
`compat_distributed` (process groups).
"""

from __future__ import annotations

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
# fake and real tensors, mutating ops (the partitioner runs under a fake mode)
# --------------------------------------------------------------------------


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


def checkpoint_side_effects_not_replayed() -> Any:
    """Context manager: Dynamo compiles a checkpointed region whose forward
    writes state outside it (Hugging Face's hub-kernel wrapper sets a
    module-level variable around every attention forward) instead of
    breaking the graph and running the region eagerly; the write is then
    not replayed when the backward recomputes the region."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True)
