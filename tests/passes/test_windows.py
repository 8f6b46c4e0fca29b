"""Communication windows: the cost model, the window finder and the
legality the planner gets, on hand-made graphs with exact answers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from adacc_compile.config import AdaccConfig
from adacc_compile.passes.annotate import annotate
from adacc_compile.passes.comm_model import (
    BUILTIN_LINKS,
    LinkProfile,
    collective_seconds,
    default_link,
    link_by_name,
)
from adacc_compile.passes.device_profile import BUILTIN_PROFILES
from adacc_compile.passes.plan_problem import Candidate, Choice, Decision, PlanProblem, PlanSolution, check_solution
from adacc_compile.passes.windows import attach_windows, fill_windows, find_windows, first_backward_use, needed_by

aten, c10d = torch.ops.aten, torch.ops._c10d_functional
LINK = LinkProfile(name="test", bandwidth_bytes_per_s=1e9, latency_s=10e-6, launch_overhead_s=1e-6)


# --------------------------------------------------------------------------
# cost model
# --------------------------------------------------------------------------


def test_ring_formulas_exact():
    n, p = 8_000_000, 4
    wire = n / 1e9
    assert collective_seconds("all_reduce", n, p, LINK) == pytest.approx(1e-6 + 2 * 3 * 10e-6 + 2 * 3 / 4 * wire)
    assert collective_seconds("all_gather", n, p, LINK) == pytest.approx(1e-6 + 3 * 10e-6 + 3 / 4 * wire)
    assert collective_seconds("reduce_scatter", n, p, LINK) == pytest.approx(1e-6 + 3 * 10e-6 + 3 / 4 * wire)
    assert collective_seconds("broadcast", n, p, LINK) == pytest.approx(1e-6 + 3 * 10e-6 + wire)
    assert collective_seconds("all_reduce", n, 1, LINK) == LINK.launch_overhead_s


def test_all_reduce_costs_twice_a_reduce_scatter_in_volume():
    n = 1 << 30
    big = LinkProfile(name="x", bandwidth_bytes_per_s=1e10, latency_s=0.0, launch_overhead_s=0.0)
    for p in (2, 4, 8):
        assert collective_seconds("all_reduce", n, p, big) == pytest.approx(
            2 * collective_seconds("reduce_scatter", n, p, big)
        )


def test_profiles_and_aliases():
    assert link_by_name("nvlink") is BUILTIN_LINKS["nvlink4"]
    assert link_by_name("PCIe") is BUILTIN_LINKS["pcie4"]
    assert link_by_name("infiniband") is BUILTIN_LINKS["ib_ndr"]
    assert default_link("gloo") is BUILTIN_LINKS["gloo_cpu"]
    assert default_link("nccl") is BUILTIN_LINKS["nvlink4"]
    # Faster links: less time for the same all-reduce.
    times = [collective_seconds("all_reduce", 64 << 20, 8, link_by_name(k)) for k in ("gloo", "pcie", "nvlink")]
    assert times == sorted(times, reverse=True)
    with pytest.raises(ValueError, match="comm_profile='token-ring'"):
        link_by_name("token-ring")
    assert LinkProfile.from_json(LINK.to_json()) == LINK


def test_config_options():
    config = AdaccConfig.from_options({"overlap_recompute": "false", "comm_profile": "nvlink3"})
    assert config.overlap_recompute is False and config.comm_profile == "nvlink3"
    assert AdaccConfig.from_options({}).overlap_recompute is True
    with pytest.raises(ValueError, match="comm_profile"):
        AdaccConfig.from_options({"comm_profile": "carrier-pigeon"})
    with pytest.raises(ValueError, match="must be a bool"):
        AdaccConfig.from_options({"overlap_recompute": "maybe"})


# --------------------------------------------------------------------------
# window finder
# --------------------------------------------------------------------------


def backward_graph() -> fx.GraphModule:
    """A backward with two all-reduces; ``relu``/``sin`` are recomputed
    forward values (their inputs are saved), the rest is backward::

        x, w, tangents_1
        mm      = tangents_1 @ w
        ar1     = all_reduce(mm)             # window 1 opens   (position 1)
        wait1   = wait_tensor(ar1)
        mm2     = mm @ w                     # independent of ar1 (inside window 1)
        add     = wait1 + mm2                # first reader: window 1 closes (4)
        relu    = relu(x)                    # recompute, first use at 6
        mul     = add * relu
        ar2     = all_reduce(mul)            # window 2 opens   (7)
        wait2   = wait_tensor(ar2)
        sin     = sin(x)                     # recompute, first use at 10
        out     = wait2 * sin
    """
    g = fx.Graph()
    x, w, t = g.placeholder("x"), g.placeholder("w"), g.placeholder("tangents_1")

    def call(target, args, name):
        return g.create_node("call_function", target, args, name=name)

    mm = call(aten.mm.default, (t, w), "mm")
    ar1 = call(c10d.all_reduce.default, (mm, "sum", "tp"), "ar1")
    wait1 = call(c10d.wait_tensor.default, (ar1,), "wait1")
    mm2 = call(aten.mm.default, (mm, w), "mm2")
    add = call(aten.add.Tensor, (wait1, mm2), "add")
    relu = call(aten.relu.default, (x,), "relu")
    mul = call(aten.mul.Tensor, (add, relu), "mul")
    ar2 = call(c10d.all_reduce.default, (mul, "sum", "tp"), "ar2")
    wait2 = call(c10d.wait_tensor.default, (ar2,), "wait2")
    sin = call(aten.sin.default, (x,), "sin")
    out = call(aten.mul.Tensor, (wait2, sin), "out")
    g.output((out,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode()
    with mode:
        args = [torch.empty(64, 64), torch.empty(64, 64), torch.empty(64, 64)]
    FakeTensorProp(gm, mode).propagate(*args)
    annotate(gm, BUILTIN_PROFILES["h100"])
    return gm


def test_find_windows_exact():
    gm = backward_graph()
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    names = [n.name for n in order]
    windows = find_windows(order, LINK, group_size=lambda name: {"tp": 4}[name])
    assert [w.name for w in windows] == ["ar1", "ar2"]
    first, second = windows
    assert (first.opens, first.closes, first.waits) == (names.index("ar1"), names.index("add"), ("wait1",))
    assert (second.opens, second.closes) == (names.index("ar2"), names.index("out"))
    assert first.kind == "all_reduce" and first.group_name == "tp" and first.group_size == 4
    assert first.nbytes == 64 * 64 * 4
    assert first.comm_seconds == pytest.approx(collective_seconds("all_reduce", 64 * 64 * 4, 4, LINK))
    # mm2 runs inside window 1 already; sin sits inside window 2.
    mm2 = next(n for n in order if n.name == "mm2").meta["adacc"].runtime_s
    sin = next(n for n in order if n.name == "sin").meta["adacc"].runtime_s
    assert first.independent_seconds == pytest.approx(mm2)
    assert second.independent_seconds == pytest.approx(sin)
    assert first.seconds == pytest.approx(first.comm_seconds - mm2)


def test_all_gather_charges_the_gathered_bytes_and_reads_its_group_size():
    g = fx.Graph()
    x = g.placeholder("x")
    ag = g.create_node("call_function", c10d.all_gather_into_tensor.default, (x, 4, "dp"), name="ag")
    wait = g.create_node("call_function", c10d.wait_tensor.default, (ag,), name="wait")
    g.output((g.create_node("call_function", aten.relu.default, (wait,), name="use"),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode()
    with mode:
        FakeTensorProp(gm, mode).propagate(torch.empty(8, 32))
    annotate(gm, BUILTIN_PROFILES["h100"])
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    (window,) = find_windows(order, LINK, group_size=lambda name: pytest.fail("size is in the op"))
    assert (window.kind, window.group_size, window.nbytes) == ("all_gather", 4, 4 * 8 * 32 * 4)


def test_first_use_and_legal_windows():
    gm = backward_graph()
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    windows = find_windows(order, LINK, group_size=lambda name: 4)
    first = first_backward_use(order, ["relu", "sin", "x", "w"])
    assert first == {"x": 5, "relu": 6, "sin": 10, "w": 0}
    problem = PlanProblem(
        candidates=(
            Candidate(name="relu", keep_bytes=100, recompute_seconds=1e-6, required=True),
            Candidate(name="sin", keep_bytes=100, recompute_seconds=1e-6, required=True),
            Candidate(name="frozen", keep_bytes=100, recompute_seconds=1e-6, can_recompute=False),
        )
    )
    problem = attach_windows(problem, windows, {**first, "frozen": 10})
    legal = {c.name: c.windows for c in problem.candidates}
    # relu is read at 6: only window 1 (opens at 1) precedes it.
    assert legal == {"relu": ("ar1",), "sin": ("ar1", "ar2"), "frozen": ()}
    assert [w.name for w in problem.windows] == ["ar1", "ar2"]


def test_needed_by_follows_recomputable_readers_only():
    problem = PlanProblem(
        candidates=(
            Candidate(name="a", keep_bytes=1, recompute_seconds=1e-6),
            Candidate(name="b", keep_bytes=1, recompute_seconds=1e-6, inputs=("a",)),
            Candidate(name="c", keep_bytes=1, recompute_seconds=1e-6, inputs=("a",), can_recompute=False),
        )
    )
    # b is read at 9 and may be recomputed: a is needed by 9. c (never
    # recomputed) is read at 2 but does not need a in the backward.
    assert needed_by(problem, {"b": 9, "c": 2}) == {"b": 9, "c": 2, "a": 9}


def test_fill_windows_readers_first_and_inputs_placed():
    """u -> v, both recomputed; window late fits one value, window early both."""
    windows_problem = PlanProblem(
        candidates=(
            Candidate(name="u", keep_bytes=8, recompute_seconds=2e-6, windows=("early", "late")),
            Candidate(name="v", keep_bytes=8, recompute_seconds=2e-6, inputs=("u",), windows=("early", "late"), required=True),
        ),
        windows=(
            _window("early", 5e-6, 1),
            _window("late", 3e-6, 5),
        ),
    )
    solution = PlanSolution(
        choices={"u": Choice(decision=Decision.RECOMPUTE), "v": Choice(decision=Decision.RECOMPUTE)},
        status="greedy",
        solver="greedy",
    )
    placed = fill_windows(windows_problem, solution)
    # v takes the late window; u must open no later: early.
    assert placed == {"u": "early", "v": "late"}
    assert check_solution(windows_problem, PlanSolution(**{**_fields(solution), "windows": placed})) == []


def _window(name, seconds, opens):
    from adacc_compile.passes.plan_problem import CommWindow

    return CommWindow(name=name, seconds=seconds, opens=opens)


def _fields(solution):
    return {"choices": solution.choices, "status": solution.status, "solver": solution.solver}
