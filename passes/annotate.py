"""Annotate pass: memory, FLOPs, bytes moved, runtime, side, layer, op class.

Reads: ``node.meta["val"]`` (FakeTensor values from AOTAutograd tracing),
``node.meta["nn_module_stack"]``. Writes: ``node.meta["adacc"]``, one
`NodeAnnotation` per node.

Everything downstream (candidates, planner, simulator, dumps) reads these
numbers, so they are computed once, from fake values only: annotating a
Llama-7B-shaped graph allocates nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.fx as fx
from torch.utils.flop_counter import flop_registry

from adacc_compile.compat import concrete_int

from .device_profile import DeviceProfile
from .op_class import OpClass, classify, is_view_op, op_name

META_KEY = "adacc"


@dataclass(slots=True, kw_only=True)
class NodeAnnotation:
    """What adacc knows about one node of the joint graph."""

    op: str
    """Op name, e.g. "aten.mm"."""
    op_class: OpClass
    side: str
    """"forward", "backward" or "input"."""
    nbytes: int
    """Bytes of newly allocated output storage (0 for views and aliases)."""
    storage_bytes: int
    """Bytes kept alive if this value is saved (a view keeps its base)."""
    flops: int
    bytes_moved: int
    runtime_s: float
    layer: str
    """Owning repeated block, e.g. "layers.3" (empty when outside blocks)."""
    module_path: str
    """Innermost owning module, e.g. "layers.3.attn.q_proj"."""
    dtype: torch.dtype | None = None

    def row(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "op_class": self.op_class.value,
            "side": self.side,
            "nbytes": self.nbytes,
            "storage_bytes": self.storage_bytes,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "runtime_s": self.runtime_s,
            "layer": self.layer,
            "module_path": self.module_path,
            "dtype": str(self.dtype).removeprefix("torch.") if self.dtype else "",
        }


def annotation(node: fx.Node) -> NodeAnnotation:
    """The node's annotation; KeyError with a hint if the pass has not run."""
    try:
        return node.meta[META_KEY]
    except KeyError:
        raise KeyError(f"node {node.name} has no adacc annotation; run annotate() first") from None


def tensor_bytes(val: Any) -> int:
    """Bytes of every tensor in a (possibly nested) value, sizes hinted."""
    total = 0
    for t in _tensors(val):
        total += concrete_int(t.numel()) * t.element_size()
    return total


def annotate(
    gm: fx.GraphModule, profile: DeviceProfile, backward_nodes: Iterable[fx.Node] = ()
) -> fx.GraphModule:
    """Writes a `NodeAnnotation` on every node of ``gm`` (in place; returns gm)."""
    backward = set(backward_nodes)
    for node in gm.graph.nodes:
        op_class = classify(node)
        val = node.meta.get("val")
        out_bytes = tensor_bytes(val)
        view = is_view_op(node)
        nbytes = 0 if view or node.op != "call_function" else out_bytes
        flops = _flops(node) if node.op == "call_function" else 0
        moved = 0 if view or node.op != "call_function" else out_bytes + input_bytes(node)
        dtype = val.dtype if isinstance(val, torch.Tensor) else None
        if node.op != "call_function" or view:
            runtime = 0.0
        else:
            runtime = profile.runtime_s(
                flops=flops,
                bytes_moved=moved,
                is_matmul=op_class in (OpClass.MATMUL, OpClass.ATTENTION),
                dtype=dtype,
            )
        if node.op == "placeholder":
            side = "input"
        else:
            side = "backward" if node in backward else "forward"
        module_path = _module_path(node)
        node.meta[META_KEY] = NodeAnnotation(
            op=op_name(node) if node.op == "call_function" else node.op,
            op_class=op_class,
            side=side,
            nbytes=nbytes,
            storage_bytes=out_bytes,
            flops=flops,
            bytes_moved=moved,
            runtime_s=runtime,
            layer=_layer_of(module_path),
            module_path=module_path,
            dtype=dtype,
        )
    _propagate_view_storage(gm)
    return gm


def _propagate_view_storage(gm: fx.GraphModule) -> None:
    """A saved view keeps its base's whole storage alive: charge that. The
    outputs of a multi-output view op (``split``) are views of its input; a
    ``getitem`` of an op that allocates several outputs owns its own."""
    for node in gm.graph.nodes:
        ann = node.meta[META_KEY]
        if node.op == "call_function" and is_view_op(node) and node.args:
            base = node.args[0]
            if not isinstance(base, fx.Node) or META_KEY not in base.meta:
                continue
            if not isinstance(base.meta.get("val"), (tuple, list)):
                ann.storage_bytes = max(ann.storage_bytes, base.meta[META_KEY].storage_bytes)
            elif is_view_op(base) and base.args and isinstance(base.args[0], fx.Node) and META_KEY in base.args[0].meta:
                ann.storage_bytes = max(ann.storage_bytes, base.args[0].meta[META_KEY].storage_bytes)


def _flops(node: fx.Node) -> int:
    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is None:
        val = node.meta.get("val")
        # Non-matmul ops: about one FLOP per output element.
        return sum(concrete_int(t.numel()) for t in _tensors(val))
    args, kwargs = _meta_args(node)
    try:
        return concrete_int(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # a formula that rejects fake/meta inputs: count zero
        return 0


def _meta_args(node: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def value(arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            return arg.meta.get("val")
        if isinstance(arg, (list, tuple)):
            return type(arg)(value(a) for a in arg)
        return arg

    return tuple(value(a) for a in node.args), {k: value(v) for k, v in node.kwargs.items()}


def input_bytes(node: fx.Node) -> int:
    """Bytes ``node`` reads: each distinct input tensor once
    (``all_input_nodes`` is already deduplicated)."""
    return sum(tensor_bytes(arg.meta.get("val")) for arg in node.all_input_nodes)


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


_INDEX = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return ""
    paths = [str(path) for path, _type in stack.values()]
    # A module that is not an attribute of the model (a module-level
    # instance, as transformers >= 5.25 wraps functions such as
    # `apply_rotary_pos_emb` for its kernel hub) enters Dynamo's stack as a
    # global, ``G['...']``: its ops belong to the model module that calls it.
    owned = [p for p in paths if not p.startswith("G[")]
    return _clean_path(owned[-1] if owned else paths[-1])


_ROOT = re.compile(
    r"^L(?:\[['\"](?:self|fn|mod|model)['\"]\]"  # L['self']
    r"|\[['\"]args['\"]\]\[\d+\]"  # L['args'][0]: a model called through a wrapper (transformers >= 5)
    r"|\[['\"]kwargs['\"]\]\[['\"]\w+['\"]\]"  # L['kwargs']['model']
    r"|\.(?:self|fn|mod|model)|\.args\.\d+)\.?"
)


def _clean_path(path: str) -> str:
    """"L['self'].layers[3].attn" / "L['args'][0].layers[3].attn" /
    "L__self___layers_3_attn" -> "layers.3.attn". The root is the module
    Dynamo traced, however it was reached: as ``self``, or as the first
    argument of a function that wraps the model's forward (transformers 5
    calls ``forward`` through such a wrapper, and without this every
    node of an HF Llama had the block ``args.0``)."""
    path = _ROOT.sub("", path)
    path = re.sub(r"\[['\"]?([\w]+)['\"]?\]", r".\1", path)
    path = re.sub(r"\._modules\.", ".", path)
    return path.strip(".")


def _layer_of(module_path: str) -> str:
    """The prefix up to the first numeric component: "layers.3.attn" -> "layers.3"."""
    match = _INDEX.search(module_path)
    return module_path[: match.end()] if match else ""
