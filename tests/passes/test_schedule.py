"""The schedule pass on a hand-made backward graph: exact order, pins, skips,
and the same numbers as the unscheduled graph when run."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
import torch.fx as fx

from adacc_compile import compat_inductor
from adacc_compile.passes.schedule import recomputes_in_windows, schedule_recompute

aten, c10d = torch.ops.aten, torch.ops._c10d_functional
FORWARD = {"relu", "wt", "mm_r"}


def backward_graph(group: str = "tp") -> fx.GraphModule:
    """As the partitioner leaves it: recomputation right before first use,
    the wait right after its collective::

        x, w, tangents_1                   (saved, saved, tangent)
        mm   = tangents_1 @ w
        ar   = all_reduce(mm)
        wait = wait_tensor(ar)
        relu = relu(x)                     recomputed
        wt   = t(w)                        recomputed (a view)
        mm_r = relu @ wt                   recomputed
        out  = wait * mm_r
    """
    g = fx.Graph()
    x, w, t = g.placeholder("x"), g.placeholder("w"), g.placeholder("tangents_1")

    def call(target, args, name):
        return g.create_node("call_function", target, args, name=name)

    mm = call(aten.mm.default, (t, w), "mm")
    ar = call(c10d.all_reduce.default, (mm, "sum", group), "ar")
    wait = call(c10d.wait_tensor.default, (ar,), "wait")
    relu = call(aten.relu.default, (x,), "relu")
    wt = call(aten.t.default, (w,), "wt")
    mm_r = call(aten.mm.default, (relu, wt), "mm_r")
    out = call(aten.mul.Tensor, (wait, mm_r), "out")
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def names(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr")]


def test_moves_recompute_into_the_window_and_pins_it():
    gm = backward_graph()
    before = names(gm)
    result = schedule_recompute(gm, {"mm_r": "ar"})
    assert names(gm) == before, "the input graph is not modified"
    assert names(result.module) == ["mm", "ar", "relu", "wt", "mm_r", "wait", "out", "output"]
    assert result.placed == {"mm_r": "ar"} and result.skipped == {}
    # relu (first compute after the issue) waits for ar; the wait for mm_r.
    assert result.pins == 2
    nodes = {n.name: n for n in result.module.graph.nodes}
    assert compat_inductor.pinned_target(nodes["relu"]) is aten.relu.default
    assert compat_inductor.pinned_target(nodes["wait"]) is c10d.wait_tensor.default
    assert nodes["relu"].args[0] == (nodes["ar"],)
    assert nodes["wait"].args[0] == (nodes["mm_r"],)
    assert compat_inductor.pinned_target(nodes["wt"]) is None, "views are free: not pinned"
    assert recomputes_in_windows(result.module, FORWARD) == {"ar": ["relu", "wt", "mm_r"]}
    assert recomputes_in_windows(gm, FORWARD) == {}


def test_unpinned_schedule_is_a_plain_reorder_and_sinks_the_wait():
    """Only relu is placed; the wait still moves to right before its reader,
    so the on-demand wt and mm_r end up inside the window as well."""
    result = schedule_recompute(backward_graph(), {"relu": "ar"}, pin=False)
    assert names(result.module) == ["mm", "ar", "relu", "wt", "mm_r", "wait", "out", "output"]
    assert result.placed == {"relu": "ar"}
    assert result.pins == 0
    assert all(compat_inductor.pinned_target(n) is None for n in result.module.graph.nodes)


def test_illegal_placements_are_skipped_with_a_reason():
    result = schedule_recompute(backward_graph(), {"mm": "ar", "out": "ar", "relu": "nope"}, pin=False)
    assert set(result.skipped) == {"mm", "out", "relu"}
    assert "before the window" in result.skipped["mm"]
    assert "needs wait" in result.skipped["out"]
    assert "not in the backward graph" in result.skipped["relu"]
    assert result.placed == {}
    assert names(result.module) == names(backward_graph())


@pytest.fixture
def single_rank_group():
    """A one-rank gloo group, so the collectives really run."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def test_scheduled_and_pinned_graph_computes_the_same(single_rank_group):
    gm = backward_graph(single_rank_group)
    scheduled = schedule_recompute(gm, {"mm_r": "ar"}).module
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(8, 8, generator=gen) for _ in range(3)]
    expected = fx.Interpreter(gm).run(*args)
    actual = fx.Interpreter(scheduled).run(*args)
    torch.testing.assert_close(actual, expected)
