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


def _big_buffers(fn, inputs, numel: int) -> int:
    """Buffers of at least ``numel`` elements Inductor's code allocates for ``fn``."""
    import re

    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with inductor_config.patch({"allow_buffer_reuse": False, "inplace_buffers": False, "fx_graph_cache": False}):
        _, codes = run_and_get_code(torch.compile(fn, backend="inductor"), *inputs)
    count = 0
    for code in codes:
        for shape in re.findall(r"empty_strided_cpu\(\(([^)]*)\)", code):
            size = 1
            for dim in filter(None, (d.strip() for d in shape.split(","))):
                size *= int(dim)
            count += size >= numel
    return count


def _log_probabilities_gathered(logits, targets):
    z = logits.float()
    shifted = z - z.amax(-1, keepdim=True)
    log_p = shifted - shifted.exp().sum(-1, keepdim=True).log()
    return -log_p.gather(1, targets).mean()


def test_a_pointwise_value_read_by_a_gather_is_inlined_as_inductor_inlines_it():
    """The cross-entropy's log-probabilities, read only by the gather of the
    targets: Inductor's gather lowering loads them through their loader, so
    no [tokens, vocabulary] buffer exists; the model counted one (500 MiB for
    a 32000-word vocabulary and 4096 tokens, measured on an H200)."""
    inputs = [torch.randn(64, 300), torch.randint(0, 300, (64, 1))]
    assert _big_buffers(_log_probabilities_gathered, inputs, 64 * 300) == 0
    gm = make_fx(_log_probabilities_gathered, tracing_mode="fake")(*inputs)
    gather = _node(gm, torch.ops.aten.gather.default)
    log_p = gather.args[0]
    assert not materialised(log_p, log_p.users, Realization.INDUCTOR, {})
    assert materialised(log_p, log_p.users, Realization.EAGER)


def _scatter_into_zeros(values, index):
    table = torch.zeros(300, 16)
    return table.index_put((index,), values, accumulate=True) * 2


def test_a_zero_fill_copied_by_a_scatter_is_one_buffer():
    """The embedding backward's index_put into zeros: Inductor copies the
    fill into the scatter's own output, one buffer; the model counted the
    fill as a second one."""
    inputs = [torch.randn(64, 16), torch.randint(0, 300, (64,))]
    assert _big_buffers(_scatter_into_zeros, inputs, 300 * 16) == 2  # the scatter's output and the product
    gm = make_fx(_scatter_into_zeros, tracing_mode="fake")(*inputs)
    index_put = _node(gm, torch.ops.aten.index_put.default)
    fill = index_put.args[0]
    assert not materialised(fill, fill.users, Realization.INDUCTOR, {})
    assert materialised(index_put, index_put.users, Realization.INDUCTOR, {})
    assert materialised(fill, fill.users, Realization.EAGER)


def test_a_fill_read_by_a_matmul_is_materialised():
    gm = make_fx(lambda w: torch.full((8, 8), 2.0) @ w, tracing_mode="fake")(torch.randn(8, 8))
    fill = _node(gm, torch.ops.aten.full.default)
    assert materialised(fill, fill.users, Realization.INDUCTOR, {})


def _halves_scattered(even, odd):
    zeros = torch.zeros(64, 32)
    scatter = torch.ops.aten.slice_scatter
    full = scatter(zeros, even, 1, 0, None, 2) + scatter(zeros, odd, 1, 1, None, 2)
    return (full * 3).sum(0)


def test_slice_scatters_into_zeros_are_fused_as_inductor_fuses_them():
    """The RoPE backward scatters the even and odd halves into zeros and
    adds them: Inductor lowers slice_scatter to a select, one kernel, no
    buffer of the full size."""
    inputs = [torch.randn(64, 16), torch.randn(64, 16)]
    assert _big_buffers(_halves_scattered, inputs, 64 * 32) == 0
    gm = make_fx(_halves_scattered, tracing_mode="fake")(*inputs)
    for node in gm.graph.nodes:
        scatters_or_fills = (torch.ops.aten.slice_scatter.default, torch.ops.aten.zeros.default)
        if node.op == "call_function" and node.target in scatters_or_fills:
            assert not materialised(node, node.users, Realization.INDUCTOR, {}), node


def _masked_accumulate(values, index, mask):
    table = torch.zeros(300, 16)
    return torch.ops.aten._unsafe_masked_index_put_accumulate(table, mask, [index], values) * 2


def test_the_cpu_embedding_backward_scatter_is_one_buffer_too():
    inputs = [torch.randn(64, 16), torch.randint(0, 300, (64,)), torch.rand(64, 1) > 0.1]
    assert _big_buffers(_masked_accumulate, inputs, 300 * 16) == 2
    gm = make_fx(_masked_accumulate, tracing_mode="fake")(*inputs)
    scatter = _node(gm, torch.ops.aten._unsafe_masked_index_put_accumulate.default)
    assert not materialised(scatter.args[0], scatter.args[0].users, Realization.INDUCTOR, {})
