"""A compressed value is written once under Inductor, as a kept one is.

Inductor's CPU lowering inlines an unrealised pointwise value into each of
its readers unless it holds an op Inductor deems heavy (``erf`` is not
one). A kept value is a forward output and is written at once; a
compressed one is not, so the codec's loops (statistics, then codes) each
recomputed the value's producer: a GPT step's GELU (``erf``) ran three
times in the forward. `compress_rewrite` now routes the value through
`compat_inductor.realize_op` (``realize=True``, the Inductor path).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental.proxy_tensor import make_fx

import torch._inductor.config as inductor_config

from adacc_compile import compat_inductor
from adacc_compile.kernels import get_codec
from adacc_compile.passes.compress_rewrite import _splice_compress, _written_once
from adacc_compile.passes.fusion import Realization, materialised
from adacc_compile.passes.op_class import is_realize_op, is_view_op
from adacc_test_utils import build, compile_with_reports

ERF = re.compile(r"\berf\(")


def _forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = F.gelu(x @ w).view(-1, w.shape[1])  # as in a GPT block: the saved value is the 2-d view the matmul reads
    return h @ w.t(), h  # the output, and h saved for the backward


def _compressed_forward() -> fx.GraphModule:
    """`_forward` with its saved value written once and compressed (int8_channel)."""
    gm = make_fx(_forward)(torch.randn(2, 64, 64), torch.randn(64, 64))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    value = output.args[0][1]
    written = _written_once(gm.graph, value)
    payload = _splice_compress(gm.graph, written, get_codec("int8_channel"), value_name=value.name)
    output.args = ((output.args[0][0], *payload),)
    gm.graph.lint()
    gm.recompile()
    return gm


def _forward_erf_calls(monkeypatch, realize: bool) -> int:
    if not realize:
        monkeypatch.setattr(compat_inductor, "realize_op", lambda: None)
    torch._dynamo.reset()
    model, batch = build("gpt")
    options = {"memory_budget": 0.3, "accuracy": "aggressive", "device_profile": "h100", "allow_recompute": False}
    with inductor_config.patch(fx_graph_cache=False):
        compiled, partitioner = compile_with_reports(model, "adacc", options)
        _, codes = run_and_get_code(lambda: compiled(*batch).backward())
    monkeypatch.undo()
    assert any(r["decision"] == "compress" for r in partitioner.reports[-1]["plan"])
    return len(ERF.findall(codes[0]))


@pytest.mark.slow  # two GPT compiles with 30-odd codecs each: 35 s on this CPU
def test_a_compressed_gelu_output_is_computed_once(monkeypatch):
    """Both layers' GELUs share one kernel (erf once in the forward code)
    when their outputs are written once; without the op, the codecs' loops
    each carry their own copy of the GELU."""
    assert _forward_erf_calls(monkeypatch, realize=True) == 1
    assert _forward_erf_calls(monkeypatch, realize=False) > 1


def test_the_written_value_is_read_by_every_forward_reader_and_counted_once():
    gm = _compressed_forward()
    written = next(n for n in gm.graph.nodes if n.name.endswith("_written"))
    value = written.args[0]
    assert list(value.users) == [written]
    assert len(written.users) >= 2  # the matmul reader and the codec
    # The memory model counts one buffer: the value's, materialised because
    # the op writes it (the codec's loops alone would have absorbed it);
    # the op itself aliases it.
    assert is_view_op(written)
    assert not materialised(written, written.users, Realization.INDUCTOR)
    gelu = value.args[0]  # the saved value is the 2-d view of the GELU's output
    assert materialised(gelu, gelu.users, Realization.INDUCTOR)


def test_a_value_only_codec_loops_read_is_materialised_once_written():
    """A pointwise value read only by pointwise ops and reductions is fused
    into them (never materialised) unless the realize op reads it."""
    gm = make_fx(lambda x: (x.exp() * 2).amax(dim=-1))(torch.randn(8, 16))
    exp = next(n for n in gm.graph.nodes if n.op == "call_function" and "exp" in str(n.target))
    assert not materialised(exp, exp.users, Realization.INDUCTOR)
    _written_once(gm.graph, exp)
    assert materialised(exp, exp.users, Realization.INDUCTOR)


def test_a_value_with_symbolic_strides_is_left_as_it_is():
    """Dynamic shapes: the op's stride list would hold symbols the graph
    does not carry as nodes, so the value is read directly (as before)."""
    gm = make_fx(lambda x: x.exp() * 2, tracing_mode="symbolic")(torch.randn(8, 16))
    exp = next(n for n in gm.graph.nodes if n.op == "call_function" and "exp" in str(n.target))
    assert _written_once(gm.graph, exp) is exp
    assert not any(is_realize_op(n) for n in gm.graph.nodes)
