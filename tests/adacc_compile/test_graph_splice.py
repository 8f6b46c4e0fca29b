"""`graph_splice.splice_graph`: a traced graph's calls copied in place."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from adacc_compile import compat_inductor
from adacc_compile.graph_splice import splice_graph, traced_outputs


def _host() -> tuple[fx.GraphModule, fx.Node, fx.Node]:
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4)
    neg = graph.call_function(torch.ops.aten.neg.default, (x,))
    graph.output((neg,))
    return fx.GraphModule(torch.nn.Module(), graph), x, neg


def test_calls_are_copied_before_the_node_bound_to_the_inputs_named_and_tagged():
    gm, x, neg = _host()
    traced = compat_inductor.trace_aten(lambda v: (v * 2 + 1, v.exp()), [torch.randn(4)])
    out = splice_graph(gm.graph, traced, [x], neg, name=lambda i: f"s{i}", meta={"tag": "t"})
    names = [n.name for n in gm.graph.nodes]
    assert names.index("s0") < names.index(neg.name)  # before ``before``
    assert [n.name for n in out] == [n.name for n in gm.graph.nodes if n.name.startswith("s")][1:]
    assert all(n.meta["tag"] == "t" and isinstance(n.meta["val"], torch.Tensor) for n in out)
    neg.replace_all_uses_with(out[0])
    gm.graph.erase_node(neg)
    gm.recompile()
    v = torch.randn(4)
    assert torch.equal(gm(v)[0], v * 2 + 1)
    assert len(traced_outputs(traced)) == 2


def test_a_count_of_inputs_other_than_the_placeholders_is_refused():
    gm, x, neg = _host()
    traced = compat_inductor.trace_aten(lambda a, b: (a + b,), [torch.randn(4), torch.randn(4)])
    with pytest.raises(ValueError, match="takes 2 inputs, given 1"):
        splice_graph(gm.graph, traced, [x], neg, name=str)
