"""Which values the Inductor realization counts as materialised."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile.passes.fusion import Realization, materialised


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target == target)


def _product_then(reader):
    def fn(x, y, w):
        h = x * y  # pointwise
        return reader(h.view(64, 32), w)

    return make_fx(fn, tracing_mode="fake")(torch.randn(32, 64), torch.randn(32, 64), torch.randn(32, 8))


def test_pointwise_read_by_a_matmul_through_a_view_is_materialised():
    # Inductor's mm reads a buffer: the product is written out even though
    # the matmul sees it only through a view (the SiLU backward's product
    # feeding a weight gradient in a Llama MLP).
    gm = _product_then(lambda v, w: v.t() @ v)
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert materialised(mul, mul.users, Realization.INDUCTOR)


def test_pointwise_read_by_pointwise_through_a_view_stays_fused():
    gm = _product_then(lambda v, w: (v * 2).sum())
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert not materialised(mul, mul.users, Realization.INDUCTOR)
    assert materialised(mul, mul.users, Realization.EAGER)


def test_pointwise_returned_through_a_view_is_materialised():
    gm = _product_then(lambda v, w: v.t())
    mul = _node(gm, torch.ops.aten.mul.Tensor)
    assert materialised(mul, mul.users, Realization.INDUCTOR)


# A value ``v`` read by two ops: the product before a matmul, and the
# product with the matmul's output (past the matmul, so not in the kernel
# that computes ``v``), or both readers in one kernel. Inductor realises a value with more than one
# reader whose inlined computation reads more than 4 buffers
# (``realize_reads_threshold``), and keeps its buffer only when a reader
# lies past a kernel boundary.
def _five_reads(a, b, c, d, e):
    return a * b + c * d + e


def _four_reads(a, b, c, d, e):
    return a * b + c * d


def _read_past_a_matmul(make):
    def fn(a, b, c, d, e, w):
        v = make(a, b, c, d, e)
        return ((v * 2) @ w).abs() * v  # not `mm + v`: Inductor would make that an addmm reading v

    return fn


def _read_in_one_kernel(make):
    def fn(a, b, c, d, e, w):
        v = make(a, b, c, d, e)
        return (v * 2 + v.neg()) @ w

    return fn


def _inputs():
    return [torch.randn(64, 64) for _ in range(6)]


def _allocations(fn) -> int:
    """Buffers Inductor's generated code allocates for ``fn`` (no buffer reuse)."""
    import re

    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with inductor_config.patch({"allow_buffer_reuse": False, "inplace_buffers": False, "fx_graph_cache": False}):
        _, codes = run_and_get_code(torch.compile(fn, backend="inductor"), *_inputs())
    return sum(len(re.findall(r"empty_strided_cpu\(", code)) for code in codes)


def _simulated(v) -> bool:
    """Materialised as the memory simulator counts it (the lowering's rules on)."""
    return materialised(v, v.users, Realization.INDUCTOR, {})


def _v(fn):
    gm = make_fx(fn, tracing_mode="fake")(*_inputs())
    mm = _node(gm, torch.ops.aten.mm.default)
    # v is the first pointwise node with two readers
    return next(n for n in gm.graph.nodes if n.op == "call_function" and len(n.users) == 2 and n is not mm)


def test_a_value_read_past_a_matmul_with_many_reads_is_written_as_inductor_writes_it():
    """Five reads: Inductor writes ``v`` once (one buffer more than with
    four reads, where it recomputes ``v`` in both kernels); the model counts
    it as materialised exactly then."""
    many, few = _read_past_a_matmul(_five_reads), _read_past_a_matmul(_four_reads)
    assert _allocations(many) == _allocations(few) + 1
    assert _simulated(_v(many))
    assert not _simulated(_v(few))
    # The plan's linear model leaves the lowering's rules to the simulator.
    assert not materialised(_v(many), _v(many).users, Realization.INDUCTOR)


def test_a_realised_value_whose_readers_share_its_kernel_allocates_nothing():
    """Both readers in the kernel that computes ``v``: Inductor realises it
    and its scheduler drops the buffer again; the model counts nothing."""
    many, few = _read_in_one_kernel(_five_reads), _read_in_one_kernel(_four_reads)
    assert _allocations(many) == _allocations(few)
    assert not _simulated(_v(many))


def test_constants_are_not_reads():
    """A ``full``/``iota`` input is an index expression in the kernel, not a
    buffer read: five reads with one of them a constant stay under the limit."""

    def fn(a, b, c, d, e, w):
        v = a * b + c * d + torch.full((64, 64), 3.0)
        return ((v * 2) @ w).abs() * v

    v = _v(fn)
    assert not _simulated(v)


def test_a_reused_exponential_read_past_a_matmul_is_written_on_cpu():
    """Two reads only, but an ``exp``: Inductor's CPU lowering writes a
    reused value that holds an op it deems heavy, where a ``neg`` is
    recomputed in each reader; the model follows."""
    heavy = _read_past_a_matmul(lambda a, b, c, d, e: (a * b).exp())
    light = _read_past_a_matmul(lambda a, b, c, d, e: (a * b).neg())
    assert _allocations(heavy) == _allocations(light) + 1
    assert _simulated(_v(heavy))
    assert not _simulated(_v(light))
