"""Compress rewrite: insert each chosen codec into the fw/bw graphs.

Reads: the plan (COMPRESS decisions with their codec) and the forward and
backward graphs the split produced with every compressed value *saved*.
Writes: the forward and backward graphs in place. They are the fresh
modules the split made for this plan attempt (nothing else refers to them),
so copying them first only cost time: a deep copy of a 32-layer graph took
longer than planning it.

For a compressed value ``v`` (codec ``c``):

* forward: compress right after ``v``; its payload tensors replace ``v``
  among the saved outputs, so the full-precision ``v`` is freed after its
  last forward use. For Inductor (``realize=True``) ``v`` first passes
  through `compat_inductor.realize_op`, which every forward reader then reads:
  Inductor writes ``v`` once, as it does for a saved ``v``, instead of
  recomputing its producer inside each of the codec's loops (measured: a
  GPT forward kernel ran a GELU's ``erf`` in three loops, the codec's
  statistics, its codes and the store the next matmul reads);
* backward: the saved input ``v`` becomes the payload inputs, and the
  decompress is placed right before the first backward node that reads
  ``v``; every reader (including recomputations that start from ``v``)
  reads the decompressed ``v_hat`` instead;
* a codec with calibrated parameters (`Codec.calibration_parameters`:
  int8_smooth's channel factors, measured on the real value by
  `calibrate`) gets them as a constant of the forward graph (a buffer of
  the module, read by a ``get_attr`` node named ``v_<codec>_parameters``),
  so its compress need not measure them on every step; without
  calibration it measures them itself;
* few-bit activation codecs decompress to the activation's derivative, so
  each ``gelu_backward(grad, v)`` / ``silu_backward(grad, v)`` becomes
  ``grad * v_hat``;
* a value saved in a permuted layout is compressed in storage order (a
  ``permute`` view, named ``v_storage_order``) and its decompressed form
  permuted back (``v_c_layout``), which gives the original layout without
  a copy (`storage_order`).

Compress and decompress take one of two forms (`codec_form.graph_form`):
by default the codec's torch reference traced into aten ops
(`adacc_compile.kernels.aten_graphs`) and spliced in, node by node, so that
Inductor fuses compress into the value's producer and decompress into its
reader; or the codec's two custom ops (``torch.ops.adacc.c_compress``,
opaque to Inductor; the Triton kernels on CUDA).

Names and tags other passes rely on: every spliced node is named after its
value (``v_c_c0``, ``v_c_c1``, ... in the forward, ``v_c_d0``, ... in the
backward; generated names could collide with forward node names, and a
backward node with a forward name is taken for a recomputation) and
carries ``meta[CODEC_NODE]`` (`CodecNode`: codec, value, role), which
`verify` uses to pair compress and decompress; the node that makes the
decompressed value (and any that restores its layout) carries
``meta[DECOMPRESSED]``.

Saved payloads keep their positions among the saved tensors in both graphs,
which is all AOTAutograd's runtime relies on.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

import torch
import torch.fx as fx

from adacc_compile import compat, compat_inductor
from adacc_compile.kernels import Codec, DecompressKind, available_codecs, get_codec
from adacc_compile.graph_splice import splice_graph
from adacc_compile.kernels.aten_graphs import codec_graphs

from .codec_form import GraphForm, graph_form
from .device_profile import DeviceProfile
from .plan_problem import Decision, PlanSolution
from .storage_order import inverse, storage_permutation


DECOMPRESSED = "adacc_decompressed"
"""Meta key on every backward node that makes (or restores the layout of) a
decompressed value; its value is the codec name. The memory simulator counts
these as activation memory and `verify` checks what reads them."""

CODEC_NODE = "adacc_codec_node"
"""Meta key on every node spliced in from a codec's aten graph (`CodecNode`)."""


@dataclass(frozen=True, slots=True)
class CodecNode:
    """What a spliced node belongs to."""

    codec: str
    value: str
    """Name of the compressed value (the forward node; in the backward, the
    saved placeholder it replaced)."""
    role: Literal["compress", "decompress"]


def apply_compression(
    fw_module: fx.GraphModule,
    bw_module: fx.GraphModule,
    solution: PlanSolution,
    *,
    num_fwd_outputs: int,
    realize: bool = False,
    parameters: Mapping[tuple[str, str], torch.Tensor] | None = None,
    profile: DeviceProfile | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Inserts the plan's codecs (see the module docstring); ``parameters``:
    (value, codec) -> calibrated parameters (`Calibration.codec_parameters`);
    ``profile``: the plan's cost model, which may say which form of a codec
    is faster on the GPU (`codec_form.graph_form`)."""
    compressed = {n: c.codec for n, c in solution.choices.items() if c.decision is Decision.COMPRESS}
    if not compressed:
        return fw_module, bw_module
    fw, bw = fw_module, bw_module
    fw_nodes = {n.name: n for n in fw.graph.nodes}
    bw_inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    output = next(n for n in fw.graph.nodes if n.op == "output")
    outputs = list(output.args[0])
    for name, codec_name in compressed.items():
        if name not in fw_nodes or name not in bw_inputs:
            continue  # not saved after all (e.g. dead in the backward)
        codec = get_codec(codec_name)
        value = fw_nodes[name]
        fake = value.meta["val"]
        form = graph_form(codec, fake.dtype, fake.device.type, profile)
        if form is GraphForm.ATEN:
            read = _in_storage_order(fw.graph, _written_once(fw.graph, value) if realize else value)
            measured = (parameters or {}).get((name, codec_name))
            constant = None if measured is None else _parameters_constant(fw, read, measured, codec, value_name=value.name)
            payload = _splice_compress(fw.graph, read, codec, value_name=value.name, parameters=constant)
        else:
            payload = _insert_compress(fw.graph, _in_storage_order(fw.graph, value), codec)
        index = next(i for i, o in enumerate(outputs) if i >= num_fwd_outputs and o is value)
        outputs[index : index + 1] = payload
        _insert_decompress(bw.graph, bw_inputs[name], payload, codec, form)
    output.args = (tuple(outputs),)
    for gm in (fw, bw):
        gm.graph.lint()
        gm.recompile()
    return fw, bw


def _splice_codec(
    graph: fx.Graph, traced: fx.GraphModule, inputs: list[fx.Node], before: fx.Node, *, prefix: str, tag: CodecNode
) -> list[fx.Node]:
    """A codec's traced graph spliced in before ``before`` (`splice_graph`),
    its nodes named ``prefix0``, ``prefix1``, ... and tagged ``tag``."""
    try:
        return splice_graph(graph, traced, inputs, before, name=lambda i: f"{prefix}{i}", meta={CODEC_NODE: tag})
    except ValueError as error:
        raise ValueError(f"{tag.codec}: {error}") from error


def _written_once(graph: fx.Graph, value: fx.Node) -> fx.Node:
    """``value`` through `compat_inductor.realize_op`, right after it, read by every
    forward reader of ``value`` but the graph output (outputs keep their
    aliasing as AOTAutograd recorded it); ``value`` itself where the op is
    missing or the strides are symbolic."""
    op = compat_inductor.realize_op()
    fake = value.meta["val"]
    stride = list(fake.stride())
    if op is None or not all(isinstance(s, int) for s in stride):
        return value
    with graph.inserting_after(value):
        written = graph.create_node("call_function", op, (value, stride), name=f"{value.name}_written")
    written.meta["val"] = fake
    value.replace_all_uses_with(written, delete_user_cb=lambda user: user is not written and user.op != "output")
    return written


def _in_storage_order(graph: fx.Graph, value: fx.Node) -> fx.Node:
    """``value`` permuted into memory order right after it (a view the
    codec reads contiguously, `storage_order`), or ``value`` itself when
    it is contiguous."""
    fake = value.meta["val"]
    order = storage_permutation(fake)
    if order is None:
        return value
    with graph.inserting_after(value):
        node = graph.create_node(
            "call_function", torch.ops.aten.permute.default, (value, order), name=f"{value.name}_storage_order"
        )
    node.meta["val"] = fake.permute(order)
    return node


def _splice_compress(
    graph: fx.Graph, value: fx.Node, codec: Codec, *, value_name: str, parameters: fx.Node | None = None
) -> list[fx.Node]:
    """The codec's traced compress spliced in right after ``value``; it
    also reads ``parameters`` (a constant node) when given."""
    if parameters is None:
        traced = codec_graphs(codec, value.meta["val"]).compress
        inputs = [value]
    else:
        traced = codec_graphs(codec, value.meta["val"], parameters.meta["val"]).compress
        inputs = [value, parameters]
    tag = CodecNode(codec.name, value_name, "compress")
    return _splice_codec(graph, traced, inputs, value.next, prefix=f"{value_name}_{codec.name}_c", tag=tag)


def _parameters_constant(
    gm: fx.GraphModule, value: fx.Node, measured: torch.Tensor, codec: Codec, *, value_name: str
) -> fx.Node:
    """``measured`` as a constant of ``gm`` on ``value``'s device, read
    right before ``value`` (`compat_inductor.tensor_constant`); returns the node
    that holds it."""
    with compat.real_tensors():  # the partitioner runs under AOTAutograd's fake mode
        tensor = measured.detach().to(value.meta["val"].device).contiguous()
    node = compat_inductor.tensor_constant(gm, f"{value_name}_{codec.name}_parameters", tensor, before=value)
    for n in (node, *node.all_input_nodes):
        n.meta[CODEC_NODE] = CodecNode(codec.name, value_name, "compress")
    return node


def _insert_compress(graph: fx.Graph, value: fx.Node, codec: Codec) -> list[fx.Node]:
    fake = value.meta["val"]
    with graph.inserting_after(value):
        packed = graph.create_node(
            "call_function", codec.compress_op, (value,), name=f"{value.name}_{codec.name}_packed"
        )
    packed.meta["val"] = codec.compress_op(fake)
    payload = []
    anchor = packed
    for j, item in enumerate(packed.meta["val"]):
        with graph.inserting_after(anchor):
            node = graph.create_node(
                "call_function", operator.getitem, (packed, j), name=f"{value.name}_payload_{j}"
            )
        node.meta["val"] = item
        payload.append(node)
        anchor = node
    return payload


def _decompress_nodes(
    graph: fx.Graph, saved: fx.Node, fake: torch.Tensor, inputs: list[fx.Node], before: fx.Node, codec: Codec,
    form: GraphForm,
) -> fx.Node:
    """Inserts the decompress of ``saved`` from its payload ``inputs``
    before ``before``; ``fake`` is the value the compress read (``saved``
    in storage order, `_in_storage_order`). Returns the node holding the
    decompressed value."""
    if form is GraphForm.ATEN:
        traced = codec_graphs(codec, fake).decompress
        tag = CodecNode(codec.name, saved.name, "decompress")
        (restored,) = _splice_codec(graph, traced, inputs, before, prefix=f"{saved.name}_{codec.name}_d", tag=tag)
        return restored
    shape = [int(s) for s in fake.shape]
    with graph.inserting_before(before):
        restored = graph.create_node(
            "call_function", codec.decompress_op, (inputs, shape, fake.dtype), name=f"{saved.name}_{codec.name}_restored"
        )
    restored.meta["val"] = codec.decompress_op([p.meta["val"] for p in inputs], shape, fake.dtype)
    return restored


def _insert_decompress(
    graph: fx.Graph, saved: fx.Node, payload: list[fx.Node], codec: Codec, form: GraphForm
) -> None:
    fake = saved.meta["val"]
    inputs = []
    for node in payload:
        with graph.inserting_before(saved):
            placeholder = graph.placeholder(node.name)
        placeholder.meta["val"] = node.meta["val"]
        inputs.append(placeholder)
    readers = list(saved.users)
    before = min(readers, key=_position(graph)) if readers else _first_non_placeholder(graph)
    order = storage_permutation(fake)
    compressed = fake if order is None else fake.permute(order)
    restored = _decompress_nodes(graph, saved, compressed, inputs, before, codec, form)
    restored.meta[DECOMPRESSED] = codec.name
    if order is not None:  # decompressed in storage order: permuted back, a view
        with graph.inserting_after(restored):
            layout = graph.create_node(
                "call_function", torch.ops.aten.permute.default, (restored, inverse(order)),
                name=f"{restored.name}_layout",
            )
        layout.meta["val"] = restored.meta["val"].permute(inverse(order))
        layout.meta[DECOMPRESSED] = codec.name
        restored = layout
    if codec.decompress_kind is DecompressKind.DERIVATIVE:
        for reader in readers:
            _replace_activation_backward(graph, reader, restored)
    else:
        saved.replace_all_uses_with(restored)
    graph.erase_node(saved)


def replaced_ops(codecs: Iterable[Codec] | None = None) -> tuple[Any, ...]:
    """The aten activation backwards that ``codecs`` (default: every
    registered codec) replace (`Codec.replaced_op`), without repeats."""
    pool = [get_codec(name) for name in available_codecs()] if codecs is None else codecs
    return tuple(dict.fromkeys(op for op in (codec.replaced_op for codec in pool) if op is not None))


def _first_non_placeholder(graph: fx.Graph) -> fx.Node:
    return next(n for n in graph.nodes if n.op != "placeholder")


def _replace_activation_backward(graph: fx.Graph, node: fx.Node, derivative: fx.Node) -> None:
    allowed = replaced_ops()
    if node.target not in allowed:
        raise ValueError(f"few-bit codec output read by {node.target}; only {allowed} may read it")
    with graph.inserting_before(node):
        product = graph.create_node(
            "call_function", torch.ops.aten.mul.Tensor, (node.args[0], derivative),
            name=f"{derivative.name}_times_grad",
        )
    product.meta["val"] = node.meta.get("val")
    node.replace_all_uses_with(product)
    graph.erase_node(node)


def _position(graph: fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__
