"""A codec's compress and decompress as graphs of plain aten ops.

Why: a codec inserted as ``torch.ops.adacc.*`` custom ops reaches Inductor
as an opaque extern call running the eager torch reference (many passes
over memory). Traced into aten ops instead, the same reference is just more
graph: Inductor fuses compress into the kernel that produces the value and
decompress into the kernel that reads it, generating C++ on CPU and Triton
on GPU. The graph rewrite (`adacc_compile.passes.compress_rewrite`) splices
these graphs into the forward and backward.

The graphs come from `Codec.aten_compress` / `Codec.aten_decompress`
traced on fake tensors (`compat.trace_aten`), so they depend on the value's
shape, strides, dtype and device only: one trace serves every value alike
(identical transformer blocks share it), and it is kept per fake mode (a
graph's fake tensors belong to the mode it was traced under).

A traced graph holds no tensor constants (every codec builds its constants
from ops such as ``arange``), so splicing it needs nothing but its nodes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from adacc_compile import compat

from .codec import Codec


@dataclass(frozen=True, slots=True)
class CodecGraphs:
    """The two traced graphs of one codec on one kind of value.

    ``compress``: ``(x) -> payload`` (a tuple of tensors);
    ``decompress``: ``(*payload) -> (x_hat,)`` (for a DERIVATIVE codec, the
    derivative).
    """

    codec: str
    compress: fx.GraphModule
    decompress: fx.GraphModule


_Key = tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype, str]
_TRACED: "weakref.WeakKeyDictionary[Any, dict[_Key, CodecGraphs]]" = weakref.WeakKeyDictionary()
"""Fake mode -> traces made under it (dropped with the mode)."""


def codec_graphs(codec: Codec, example: torch.Tensor) -> CodecGraphs:
    """The aten graphs of ``codec`` for values like ``example`` (a fake or
    real tensor; only its metadata is read).

    Raises:
        ValueError: the codec's reference produced a graph that cannot be
            spliced (it holds tensor constants).
    """
    key: _Key = (
        codec.name,
        tuple(int(s) for s in example.shape),
        tuple(int(s) for s in example.stride()),
        example.dtype,
        str(example.device),
    )
    mode = compat.ambient_fake_mode([example])
    cache = _TRACED.setdefault(mode, {}) if mode is not None else {}
    if key not in cache:
        cache[key] = _trace(codec, example)
    return cache[key]


def _trace(codec: Codec, example: torch.Tensor) -> CodecGraphs:
    shape, dtype = [int(s) for s in example.shape], example.dtype

    def compress(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(codec.aten_compress(x))

    compress_gm = compat.trace_aten(compress, [example])
    payload = [node.meta["val"] for node in graph_outputs(compress_gm)]

    def decompress(*parts: torch.Tensor) -> tuple[torch.Tensor]:
        return (codec.aten_decompress(list(parts), shape, dtype),)

    decompress_gm = compat.trace_aten(decompress, payload)
    for gm in (compress_gm, decompress_gm):
        constants = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
        if constants:
            raise ValueError(f"{codec.name}: traced graph holds tensor constants {constants}; build them from ops")
    return CodecGraphs(codec=codec.name, compress=compress_gm, decompress=decompress_gm)


def graph_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes a traced graph returns, in order."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out.args[0]
    return list(flat) if isinstance(flat, (list, tuple)) else [flat]
