"""Mutation safety on hand-built graphs with exact answers.

    x, buf ─► add = x + buf ─► tanh ─► ... ; copy_(buf, buf * 1.5)   (end)

``add`` reads ``buf`` before the forward overwrites it: recomputing it later
would read the new contents. ``tanh`` only reads ``add``: recomputable once
``add`` is kept. A view of ``buf`` taken before the write is stale too, and
a node reading ``buf`` after the write is not (it saw the new contents the
first time as well).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from adacc_compile.passes.mutation import mutated_inputs, stale_reading, stale_recomputations, written_args

aten = torch.ops.aten


def _graph():
    g = fx.Graph()
    x = g.placeholder("x")
    buf = g.placeholder("buf")
    add = g.call_function(aten.add.Tensor, (x, buf), name="add")
    tanh = g.call_function(aten.tanh.default, (add,), name="tanh")
    view = g.call_function(aten.view.default, (buf, [4, 8]), name="view")
    scaled = g.call_function(aten.mul.Tensor, (buf, 1.5), name="scaled")
    copy = g.call_function(aten.copy_.default, (buf, scaled), name="copy_")
    after = g.call_function(aten.mul.Tensor, (buf, 2.0), name="after")
    g.output((tanh, view, after, copy))
    return g


def test_stale_reading_finds_readers_before_the_write():
    g = _graph()
    stale = {n.name for n in stale_reading(list(g.nodes))}
    assert stale == {"add", "view", "scaled"}
    # scaled reads buf before copy_ writes it: recomputing it after the copy
    # would scale the new contents.


def test_written_args_follow_the_schema():
    g = _graph()
    copy = next(n for n in g.nodes if n.name == "copy_")
    assert [a.name for a in written_args(copy)] == ["buf"]
    assert written_args(next(n for n in g.nodes if n.name == "add")) == []


def test_no_writes_nothing_stale():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(aten.relu.default, (x,)),))
    assert stale_reading(list(g.nodes)) == set()


def _batch_norm_graph():
    """BatchNorm in training mode, then the running statistics written back."""
    g = fx.Graph()
    x, w, b, mean, var = (g.placeholder(n) for n in ("x", "w", "b", "running_mean", "running_var"))
    bn = g.call_function(
        aten._native_batch_norm_legit_functional.default, (x, w, b, mean, var, True, 0.1, 1e-5), name="bn"
    )
    outs = [g.call_function(operator.getitem, (bn, i), name=f"bn_{i}") for i in range(5)]
    g.call_function(aten.copy_.default, (mean, outs[3]), name="copy_mean")
    g.call_function(aten.copy_.default, (var, outs[4]), name="copy_var")
    g.output((outs[0],))
    return g


def test_batchnorm_output_stays_recomputable_but_new_statistics_do_not():
    """The normalised output and batch statistics do not depend on the old
    running statistics in training mode; outputs 3 and 4 do."""
    g = _batch_norm_graph()
    stale = {n.name for n in stale_reading(list(g.nodes))}
    assert stale == {"bn_3", "bn_4"}


def test_batchnorm_in_eval_mode_depends_on_running_statistics():
    g = _batch_norm_graph()
    bn = next(n for n in g.nodes if n.name == "bn")
    bn.args = (*bn.args[:5], False, *bn.args[6:])
    assert "bn" in {n.name for n in stale_reading(list(g.nodes))}


def test_split_check_names_the_stale_recomputation():
    fw = fx.GraphModule({}, _graph())
    assert mutated_inputs(fw) == {"buf"}
    bw = fx.Graph()
    x, buf = bw.placeholder("x"), bw.placeholder("buf")
    add = bw.call_function(aten.add.Tensor, (x, buf), name="add")
    bw.output((bw.call_function(aten.mul.Tensor, (add, 2.0), name="grad"),))
    bw_module = fx.GraphModule({}, bw)
    errors = stale_recomputations(bw_module, {"buf"}, lambda n: n.name == "add")
    assert len(errors) == 1 and errors[0].startswith("add is recomputed") and "['buf']" in errors[0]
    assert stale_recomputations(bw_module, {"buf"}, lambda n: False) == []
    assert stale_recomputations(bw_module, set(), lambda n: True) == []
