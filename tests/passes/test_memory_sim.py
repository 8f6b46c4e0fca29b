"""Memory simulator on a hand-made forward/backward pair with exact answers."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile import compat_inductor
from adacc_compile.passes.memory_sim import simulate_step


def forward(x):
    # x: [1024] fp32 -> 4096-byte tensors
    a = x * 2          # A alloc
    b = a + 1          # B alloc, A freed after this node
    v = b.view(32, 32)  # view: no bytes
    c = v.sum()        # 4 bytes, user output
    return c, v        # v saved for backward (keeps B alive)


def backward(v, tangent):
    d = v * tangent    # D alloc; v's storage (B) freed after
    e = d.flatten() * 3  # E alloc; D freed
    return (e,)


def test_exact_peak_and_activation_peak():
    x = torch.randn(1024)
    fw = make_fx(forward, tracing_mode="fake")(x)
    bw = make_fx(backward, tracing_mode="fake")(torch.randn(32, 32), torch.randn(()))
    # make_fx names placeholders x_1, v_1...; rename the backward's saved
    # input to the forward node it receives (as the partitioner would).
    fw_view = [n for n in fw.graph.nodes if n.op == "call_function"][2]
    bw_saved = next(n for n in bw.graph.nodes if n.op == "placeholder")
    bw_saved.name = fw_view.name
    timeline = simulate_step(fw, bw, num_fwd_outputs=1)
    kib4 = 4096
    # forward: A, A+B, (A freed) B, B+4; backward: B+D, (B freed) D+E, E.
    # Activation memory is everything the forward allocates (A and B at once
    # at its peak) and, in the backward, the saved B until it is read.
    assert timeline.saved_bytes == kib4
    assert timeline.peak_bytes == 2 * kib4 + 4
    assert timeline.activation_peak_bytes == 2 * kib4
    assert [e.activation_bytes for e in timeline.events if e.phase == "backward"][0] == kib4
    fw_live = [e.live_bytes for e in timeline.events if e.phase == "forward"]
    assert max(fw_live) == 2 * kib4
    bw_live = [e.live_bytes for e in timeline.events if e.phase == "backward"]
    assert max(bw_live) == 4 + 2 * kib4  # user output c (4 B) stays with the caller


def _codec_step(device: str, codec_name: str = "int8_outlier", shape=(256, 256)):
    """Hand-built fw/bw pair around one codec::

        forward:  x ─► y = x * 2 ─► compress(y) ─► p0..p3 (saved)
        backward: p0..p3 ─► decompress ─► out
    """
    import operator

    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from adacc_compile.kernels import get_codec

    codec = get_codec(codec_name)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x_val = torch.empty(shape, device=device)
        y_val = x_val * 2
        payload_val = codec.compress_op(y_val)
        out_val = codec.decompress_op(payload_val, list(shape), torch.float32)

    fw_graph = fx.Graph()
    x = fw_graph.placeholder("x")
    x.meta["val"] = x_val
    y = fw_graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    y.meta["val"] = y_val
    packed = fw_graph.call_function(codec.compress_op, (y,))
    packed.meta["val"] = payload_val
    parts = []
    for i, val in enumerate(payload_val):
        part = fw_graph.call_function(operator.getitem, (packed, i))
        part.meta["val"] = val
        parts.append(part)
    fw_graph.output(tuple(parts))

    bw_graph = fx.Graph()
    inputs = []
    for part, val in zip(parts, payload_val):
        placeholder = bw_graph.placeholder(part.name)
        placeholder.meta["val"] = val
        inputs.append(placeholder)
    out = bw_graph.call_function(codec.decompress_op, (inputs, list(shape), torch.float32))
    out.meta["val"] = out_val
    bw_graph.output((out,))
    fw, bw = fx.GraphModule({}, fw_graph), fx.GraphModule({}, bw_graph)
    return codec, fw, bw, packed.name, out.name


def test_codec_workspace_raises_peak_at_its_node_only(monkeypatch):
    monkeypatch.setenv("ADACC_KERNELS", "auto")
    shape = (256, 256)
    codec, fw, bw, compress_name, decompress_name = _codec_step("cpu", shape=shape)
    timeline = simulate_step(fw, bw, num_fwd_outputs=0)
    tensor = 256 * 256 * 4
    payload = codec.compressed_nbytes(shape, torch.float32)
    compress_ws = codec.compress_workspace_nbytes(shape, torch.float32, "cpu")
    decompress_ws = codec.decompress_workspace_nbytes(shape, torch.float32, "cpu")
    assert compress_ws > tensor  # the torch reference's float32 copy and masks
    live = {(e.phase, e.node): e.live_bytes for e in timeline.events}
    # y and the payload are live while compress runs, plus its workspace.
    assert live[("forward", compress_name)] == tensor + payload + compress_ws
    # Right after it, the workspace is gone again (and y, read last by it).
    after = [e for e in timeline.events if e.phase == "forward"]
    index = [e.node for e in after].index(compress_name)
    assert after[index + 1].live_bytes == payload
    assert live[("backward", decompress_name)] == payload + tensor + decompress_ws
    assert timeline.peak_bytes == max(tensor + payload + compress_ws, payload + tensor + decompress_ws)
    assert timeline.saved_bytes == payload


def test_codec_workspace_follows_device_of_fake_tensors(monkeypatch):
    """A CUDA graph (fake tensors on cuda) is charged the Triton workspace."""
    monkeypatch.setenv("ADACC_KERNELS", "triton")  # Triton for every device
    shape = (256, 256)
    try:
        codec, fw, bw, compress_name, _ = _codec_step("cuda", shape=shape)
    except (RuntimeError, AssertionError) as error:  # pragma: no cover - depends on the build
        import pytest

        pytest.skip(f"cannot build fake CUDA tensors here: {error}")
    timeline = simulate_step(fw, bw, num_fwd_outputs=0)
    live = {(e.phase, e.node): e.live_bytes for e in timeline.events}
    payload = codec.compressed_nbytes(shape, torch.float32)
    expected = codec.compress_workspace_nbytes(shape, torch.float32, "cuda")
    assert expected == codec.workspace(shape, torch.float32, triton=True).compress
    assert 0 < expected < codec.workspace(shape, torch.float32, triton=False).compress
    assert live[("forward", compress_name)] == 256 * 256 * 4 + payload + expected


def test_decompressed_value_is_activation_memory(monkeypatch):
    """The decompressed tensor is the forward's value brought back for the
    backward: activation memory until its last use, like a recomputation.
    (The simulator once counted only the payload.)"""
    from adacc_compile.passes.compress_rewrite import DECOMPRESSED

    monkeypatch.setenv("ADACC_KERNELS", "auto")
    shape = (256, 256)
    codec, fw, bw, _, decompress_name = _codec_step("cpu", shape=shape)
    node = next(n for n in bw.graph.nodes if n.name == decompress_name)
    node.meta[DECOMPRESSED] = codec.name  # as compress_rewrite tags it
    timeline = simulate_step(fw, bw, num_fwd_outputs=0)
    payload = codec.compressed_nbytes(shape, torch.float32)
    events = {(e.phase, e.node): e for e in timeline.events}
    assert events[("backward", decompress_name)].activation_bytes == payload + 256 * 256 * 4
    assert timeline.activation_peak_bytes == payload + 256 * 256 * 4


def test_getitem_of_an_output_after_none_outputs():
    """``convolution_backward`` returns ``(None, grad_w, grad_b)`` when its
    input needs no gradient: ``getitem(cb, 1)`` is grad_w, not grad_b."""
    import operator

    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        grad_out = torch.empty(8, 16, 30, 30)
        x = torch.empty(8, 3, 32, 32)
        w = torch.empty(16, 3, 3, 3)
        values = torch.ops.aten.convolution_backward.default(
            grad_out, x, w, [16], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True]
        )
    assert values[0] is None
    g = fx.Graph()
    nodes = {}
    for name, val in (("tangent", grad_out), ("x", x), ("w", w)):
        nodes[name] = g.placeholder(name)
        nodes[name].meta["val"] = val
    cb = g.call_function(
        torch.ops.aten.convolution_backward.default,
        (nodes["tangent"], nodes["x"], nodes["w"], [16], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True]),
        name="cb",
    )
    cb.meta["val"] = values
    grad_w = g.call_function(operator.getitem, (cb, 1), name="grad_w")
    grad_w.meta["val"] = values[1]
    grad_b = g.call_function(operator.getitem, (cb, 2), name="grad_b")
    grad_b.meta["val"] = values[2]
    # grad_b is used (and freed) right away; grad_w is held to the end.
    scaled = g.call_function(torch.ops.aten.mul.Tensor, (grad_b, 2.0), name="scaled")
    scaled.meta["val"] = torch.empty(16, device="meta")
    g.output((grad_w, scaled))
    fw = fx.Graph()
    fw.output(())
    timeline = simulate_step(fx.GraphModule({}, fw), fx.GraphModule({}, g), num_fwd_outputs=0)
    live = {e.node: e.live_bytes for e in timeline.events if e.phase == "backward"}
    w_bytes, b_bytes = 16 * 3 * 3 * 3 * 4, 16 * 4
    assert live["cb"] == w_bytes + b_bytes
    assert live["scaled"] == w_bytes + 2 * b_bytes  # grad_w, grad_b (read here), scaled
    assert live["<output>"] == w_bytes + b_bytes  # grad_w and scaled stay: outputs


def _backward_with_fused_reader(v, g):
    p = v * g  # pointwise, fused into the add: reads v where the add runs
    m = g @ g  # a matmul between the product and its consumer
    return (p + m,)


def test_value_read_by_a_fused_op_lives_until_the_kernel_it_joins():
    from adacc_compile.passes.fusion import Realization

    x = torch.randn(1024)
    fw = make_fx(forward, tracing_mode="fake")(x)
    bw = make_fx(_backward_with_fused_reader, tracing_mode="fake")(torch.randn(32, 32), torch.randn(32, 32))
    fw_view = [n for n in fw.graph.nodes if n.op == "call_function"][2]
    next(n for n in bw.graph.nodes if n.op == "placeholder").name = fw_view.name
    kib4 = 4096
    live = {}
    for mode in Realization:
        timeline = simulate_step(fw, bw, num_fwd_outputs=1, mode=mode)
        live[mode] = {e.node: e.live_bytes for e in timeline.events if e.phase == "backward"}
    # Inductor computes v * g inside the add's kernel, after the matmul:
    # nothing is allocated at the product, and the saved v (4 KiB) is still
    # allocated beside the matmul's output (c, 4 bytes, stays with the caller).
    assert live[Realization.INDUCTOR]["mul"] == 4 + kib4
    assert live[Realization.INDUCTOR]["mm"] == 4 + kib4 + kib4
    # Eagerly the product is a buffer of its own and v dies once it is made.
    assert live[Realization.EAGER]["mul"] == 4 + kib4 + kib4
    assert live[Realization.EAGER]["mm"] == 4 + kib4 + kib4


def _sum_read_on_both_sides_of_a_matmul(a, w, w2):
    # s reads two buffers and has two readers, one feeding a matmul and one
    # after it: Inductor inlines s into both kernels, so the matmul output m
    # stays allocated until the second one runs.
    m = a @ w
    s = a + m
    p = (s * 2) @ w2
    return (s * 3 + p,)


def _simulated_and_measured_under_inductor(fn, inputs, patches: dict) -> tuple[int, int]:
    """The simulated (Inductor rules) and the allocator-measured peak of
    forward-only ``fn`` compiled by Inductor with ``patches``."""
    import torch._inductor.config as inductor_config

    from adacc_compile.measure import measure_peak_bytes
    from adacc_compile.passes.fusion import Realization

    fw = make_fx(fn, tracing_mode="fake")(*inputs)
    bw = make_fx(lambda: ())()
    simulated = simulate_step(fw, bw, num_fwd_outputs=1, mode=Realization.INDUCTOR).peak_bytes
    torch._dynamo.reset()
    with inductor_config.patch({"allow_buffer_reuse": False, "fx_graph_cache": False, **patches}):
        compiled = torch.compile(fn, backend="inductor")
        compiled(*inputs)
        measured = measure_peak_bytes(lambda: compiled(*inputs))
    return simulated, measured


def test_a_fused_value_read_by_several_kernels_keeps_its_inputs_until_the_last():
    inputs = [torch.randn(256, 256) for _ in range(3)]
    simulated, measured = _simulated_and_measured_under_inductor(
        _sum_read_on_both_sides_of_a_matmul, inputs, {"inplace_buffers": False}
    )
    buffer = 256 * 256 * 4
    assert measured == 3 * buffer  # m, p and the result at the last kernel
    assert simulated == measured


def _kernel_position_of_s(fn) -> tuple[int, int, dict]:
    from adacc_compile.passes.fusion import Realization
    from adacc_compile.passes.memory_sim import _kernel_positions

    gm = make_fx(fn, tracing_mode="fake")(*[torch.randn(256, 256) for _ in range(3)])
    nodes = list(gm.graph.nodes)
    s = next(n for n in nodes if n.target == torch.ops.aten.add.Tensor)
    return nodes.index(s), _kernel_positions(nodes, Realization.INDUCTOR, {})[s], {n.name: i for i, n in enumerate(nodes)}


def test_a_fused_values_reads_extend_only_to_readers_that_wait_for_a_later_matmul():
    def late(a, w, w2):  # the second reader's kernel needs p
        m = a @ w
        s = a + m
        p = (s * 2) @ w2
        return (s * 3 + p,)

    def early(a, w, w2):  # the second reader needs nothing after s: Inductor fuses it with the first
        m = a @ w
        s = a + m
        p = (s * 2) @ w2
        return (s * 3, p)

    own, runs, position = _kernel_position_of_s(late)
    assert runs == position["add_1"] > own  # where s * 3 + p is computed
    own, runs, _ = _kernel_position_of_s(early)
    assert runs == own


def _forward_saving_a_product(x, w):
    a = x @ w  # 64 x 64 fp32: 16 KiB, saved for the backward
    return a.sum(), a


def _gradient_in_place(a, tangent, w):
    g = a * tangent - 1.0  # same size and dtype as a, a's last reader: written into a
    return (g @ w,)


def _gradient_transposed(a, tangent, w):
    g = a.t() * tangent - 1.0  # reads a transposed: no in-place write
    return (g @ w,)


def _step(backward):
    fw = make_fx(_forward_saving_a_product, tracing_mode="fake")(torch.randn(64, 32), torch.randn(32, 64))
    bw = make_fx(backward, tracing_mode="fake")(torch.randn(64, 64), torch.randn(()), torch.randn(64, 64))
    saved = next(n for n in fw.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default)
    next(n for n in bw.graph.nodes if n.op == "placeholder").name = saved.name
    return fw, bw


def _backward_live(backward, mode) -> dict[str, int]:
    fw, bw = _step(backward)
    timeline = simulate_step(fw, bw, num_fwd_outputs=1, mode=mode)
    return {e.node: e.live_bytes for e in timeline.events if e.phase == "backward"}


def test_a_pointwise_kernel_writes_into_a_dying_saved_value_of_its_size():
    """Inductor's in-place update: the gradient kernel reads the saved value
    element for element as its last reader and writes its output there
    (a donated backward input), so no buffer is allocated for it; eagerly,
    or when the read is transposed, the output is a buffer of its own."""
    from adacc_compile.passes.fusion import Realization

    kib16 = 64 * 64 * 4
    inductor = _backward_live(_gradient_in_place, Realization.INDUCTOR)
    eager = _backward_live(_gradient_in_place, Realization.EAGER)
    transposed = _backward_live(_gradient_transposed, Realization.INDUCTOR)
    assert inductor["sub"] == 4 + kib16  # the loss (4 B) and one 16 KiB buffer: a, then g in it
    assert inductor["mm"] == 4 + 2 * kib16  # g and the product
    assert eager["sub"] == 4 + 2 * kib16  # the product and the difference, each a buffer
    assert transposed["sub"] == 4 + 2 * kib16


def _dropout_forward(x):
    out, mask = torch.ops.aten.native_dropout.default(x, 0.1, True)
    return out.sum(), mask


def test_an_eager_dropout_holds_a_float_copy_of_its_mask_while_it_runs():
    """ATen's CPU ``native_dropout`` (what a graph compiled with
    ``fallback_random=True`` runs) multiplies by its mask converted to the
    input's dtype: the simulated peak is the allocator's, that copy
    included (without it the simulation is one input size short)."""
    from adacc_compile.measure import measure_peak_bytes

    x = torch.randn(64, 1024)
    fw = make_fx(_dropout_forward, tracing_mode="fake")(x)
    bw = make_fx(lambda: ())()
    simulated = simulate_step(fw, bw, num_fwd_outputs=2).peak_bytes
    measured = measure_peak_bytes(lambda: _dropout_forward(x))
    nbytes = x.numel() * 4
    assert measured >= 2 * nbytes + x.numel()  # output, its float mask copy and the bool mask, together
    assert simulated == measured


def test_an_evaluation_dropout_has_no_workspace():
    x = torch.randn(64, 1024)
    fw = make_fx(lambda x: torch.ops.aten.native_dropout.default(x, 0.1, False), tracing_mode="fake")(x)
    timeline = simulate_step(fw, make_fx(lambda: ())(), num_fwd_outputs=2)
    assert timeline.peak_bytes == x.numel() * 4 + x.numel()  # the output (a copy) and the mask, no more


def _softmax_then_fallback_dropout(s, v):
    # As a GPT attention under ``fallback_random``: the probabilities are
    # read by the (fallback) dropout and by the product with its mask.
    e = (s - s.amax(-1, keepdim=True)).exp()
    p = e / e.sum(-1, keepdim=True)
    _, mask = torch.ops.aten.native_dropout.default(p, 0.1, True)
    return ((p * mask) @ v,)


def test_a_fallback_dropout_gets_a_copy_of_a_fused_input_and_its_other_reader_recomputes_it():
    """Inductor copies the unwritten probabilities for the dropout alone
    and recomputes them in the product after it, from the exponentials,
    which stay written until then: the simulated peak is the allocator's
    (without the copy rule the simulation was an input size short)."""
    inputs = [torch.randn(64, 1024), torch.randn(1024, 64)]
    simulated, measured = _simulated_and_measured_under_inductor(
        _softmax_then_fallback_dropout, inputs, {"fallback_random": True}
    )
    nbytes = inputs[0].numel() * 4
    # the exponentials, the dropout's copy, output and float mask, and the bool mask
    assert measured >= 4 * nbytes + inputs[0].numel()
    assert simulated == measured


def _fallback_dropout_then_two_written_values(s, v):
    # The dropout's output is unused (its mask is what a GPT keeps); the
    # kernel group after it writes two values for the matmuls.
    _, mask = torch.ops.aten.native_dropout.default(s, 0.1, True)
    y = s * mask * 1.11
    z = torch.sin(s)
    return ((y @ v).sum() + (z @ v).sum(),)


def test_an_extern_calls_unused_output_is_freed_before_the_next_kernel_group():
    """The wrapper frees a fallback's outputs that no ``getitem`` takes right
    after the call, not when the next C++ kernel group returns."""
    inputs = [torch.randn(64, 1024), torch.randn(1024, 64)]
    simulated, measured = _simulated_and_measured_under_inductor(
        _fallback_dropout_then_two_written_values, inputs, {"fallback_random": True}
    )
    nbytes = inputs[0].numel() * 4
    assert measured < 3 * nbytes + inputs[0].numel()  # never the output, y and z at once
    assert simulated == measured


def _inductor_dropout_mask(x, w, *, read_after_the_matmul: bool):
    # As a dropout without ``fallback_random``: Inductor's own random numbers
    # compared into a mask, which is written (an output here, a saved value
    # in a GPT) and read by a product before a matmul; or, as a backward that
    # recomputes the mask, inlined into products before and after it.
    import torch._inductor.inductor_prims  # noqa: F401  (registers the prims)

    seeds = torch.ops.prims.inductor_seeds.default(1, x.device)
    seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
    rows, cols = x.shape
    keep = torch.ops.prims.inductor_random.default([rows, 2 * cols], seed, "rand") > 0.1
    keep = keep[:, :cols]  # a product of another size, so no buffer is reused for it
    y = (x * keep) @ w
    if read_after_the_matmul:
        return ((y.sum() * x * keep).sum(),)
    return (y.sum(), keep)


def test_inductors_random_numbers_are_written_only_where_a_kernel_past_a_matmul_reads_them():
    """``prims.inductor_random`` is realised by its lowering, and the
    scheduler drops that buffer when its readers fuse into its kernel."""
    import functools

    inputs = [torch.randn(64, 512), torch.randn(512, 16)]
    random_bytes = 2 * inputs[0].numel() * 4
    for late_reader in (False, True):
        fn = functools.partial(_inductor_dropout_mask, read_after_the_matmul=late_reader)
        simulated, measured = _simulated_and_measured_under_inductor(fn, inputs, {"fallback_random": False})
        assert simulated == measured, late_reader
        # the mask (one byte an element) and the product, with the random numbers or not
        assert (measured >= random_bytes) == late_reader, measured


def _random_mask_read_by_a_row_sum_and_a_product(x, w, *, after_a_matmul: bool):
    # As a backward that recomputes a dropout mask in the softmax gradient:
    # the masked value is inlined into a row sum and into the product with
    # it, which (as there) may also read a matmul's output computed after
    # the mask in the graph.
    import torch._inductor.inductor_prims  # noqa: F401

    seeds = torch.ops.prims.inductor_seeds.default(1, x.device)
    seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
    masked = x * (torch.ops.prims.inductor_random.default(list(x.shape), seed, "rand") > 0.1)
    other = (x @ w) @ w.t() if after_a_matmul else x
    return (((masked - masked.sum(-1, keepdim=True) * other) @ w).sum(),)


def test_random_numbers_read_after_a_later_matmul_are_written():
    """Inductor computes the random numbers where they stand: readers that
    wait for a matmul placed after them cannot share their kernel, and the
    numbers are written (once the row sum and the product fuse with them)."""
    import functools

    inputs = [torch.randn(64, 1024), torch.randn(1024, 16)]
    nbytes = inputs[0].numel() * 4
    for after_a_matmul in (False, True):
        fn = functools.partial(_random_mask_read_by_a_row_sum_and_a_product, after_a_matmul=after_a_matmul)
        simulated, measured = _simulated_and_measured_under_inductor(fn, inputs, {"fallback_random": False})
        assert (measured >= 2 * nbytes) == after_a_matmul, measured  # the random numbers and another value
        assert 0 <= simulated - measured <= 8, after_a_matmul  # the model writes the looked-up seed (8 bytes)


def _random_numbers_broadcast_into_a_larger_product(x, w):
    import torch._inductor.inductor_prims  # noqa: F401

    seeds = torch.ops.prims.inductor_seeds.default(1, x.device)
    seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
    keep = torch.ops.prims.inductor_random.default(list(x.shape[1:]), seed, "rand") > 0.1
    return (((x * keep) @ w).sum(),)


def test_random_numbers_read_by_a_kernel_of_another_size_are_written():
    """A kernel over more elements (the mask broadcast over a batch) does
    not fuse with the random numbers' kernel: they keep their buffer."""
    inputs = [torch.randn(4, 64, 1024), torch.randn(1024, 16)]
    simulated, measured = _simulated_and_measured_under_inductor(
        _random_numbers_broadcast_into_a_larger_product, inputs, {"fallback_random": False}
    )
    assert measured >= inputs[0].numel() * 4 * 5 // 4  # the product and the random numbers
    assert 0 <= simulated - measured <= 8  # the model writes the looked-up seed (8 bytes), Inductor inlines it


_REALIZE = compat_inductor.realize_op()


def _two_values_written_and_compressed_in_one_kernel_group(x, w, w2):
    # As two codecs' compress chains between two matmuls: each value is
    # written (`compat_inductor.realize_op`), reduced to a row scale and coded.
    realize, convert = _REALIZE, torch.ops.prims.convert_element_type.default
    m = x @ w
    a = realize(torch.sin(m), [m.shape[1], 1])
    q = convert(a / a.abs().amax(1, keepdim=True) * 127, torch.int8)
    b = realize(torch.cos(m), [m.shape[1], 1])
    r = convert(b / b.abs().amax(1, keepdim=True) * 127, torch.int8)
    y = (convert(q, torch.float32) - convert(r, torch.float32)) @ w2
    return (y.sum(), q, r, m)


def test_a_cpu_kernel_group_frees_what_it_read_when_it_returns(monkeypatch):
    """Inductor's C++ backend runs the kernels between two matmuls as one
    function: both written values are allocated before it runs and freed
    after, so they are alive together (graph order would free the first
    before writing the second): the simulated peak is the allocator's."""
    import adacc_compile.passes.memory_sim as memory_sim

    inputs = [torch.randn(256, 256), torch.randn(256, 1024), torch.randn(1024, 64)]
    simulated, measured = _simulated_and_measured_under_inductor(
        _two_values_written_and_compressed_in_one_kernel_group, inputs, {}
    )
    value = 256 * 1024 * 4
    assert measured >= 4 * value  # m, a, b and the difference the last matmul reads
    assert simulated == measured
    monkeypatch.setattr(memory_sim, "kernel_group_ends", lambda nodes: {})
    ungrouped, _ = _simulated_and_measured_under_inductor(
        _two_values_written_and_compressed_in_one_kernel_group, inputs, {}
    )
    assert ungrouped < measured - value // 2


def _decoded_then_outliers_scattered_in(codes, scale, idx, outliers, w):
    # As an outlier codec's decompress: decode, then scatter the outlier
    # channels into the decoded values, then a matmul reads the result.
    decoded = torch.where(codes == 127, torch.inf, codes * scale)
    restored = torch.ops.aten.index_put.default(decoded, [None, idx], outliers)
    return ((restored @ w).sum(),)


def test_a_value_scattered_into_is_computed_in_the_scatters_copy():
    """Inductor lowers a functional scatter as a copy of its first input
    and a scatter into it; the copy's kernel computes a pointwise first
    input itself, so only the scattered result is written."""
    from adacc_compile.passes.fusion import Realization, materialised

    inputs = [
        torch.randint(-127, 128, (1024, 256)).float(), torch.rand(1024, 1), torch.tensor([3, 70]),
        torch.randn(1024, 2), torch.randn(256, 64),
    ]
    gm = make_fx(_decoded_then_outliers_scattered_in, tracing_mode="fake")(*inputs)
    decoded = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.where.self)
    assert not materialised(decoded, decoded.users, Realization.INDUCTOR)
    simulated, measured = _simulated_and_measured_under_inductor(_decoded_then_outliers_scattered_in, inputs, {})
    assert simulated == measured


def test_a_bitcast_to_another_width_is_a_fallback_call_that_ends_a_kernel_group():
    from adacc_compile.passes.fusion import kernel_group_ends, runs_as_extern_kernel

    def f(payload, x):
        header = payload.view(torch.int32)  # 4 bytes read as one int32: a fallback call
        y = x * 2
        return (y + header.float().sum(), y.view(torch.int32))  # same width: a view

    gm = make_fx(f, tracing_mode="fake")(torch.zeros(64, dtype=torch.int8), torch.randn(16))
    nodes = list(gm.graph.nodes)
    bitcasts = [n for n in nodes if n.target == torch.ops.aten.view.dtype]
    assert [runs_as_extern_kernel(n) for n in bitcasts] == [True, False]
    ends = kernel_group_ends(nodes)
    assert ends[nodes.index(bitcasts[0])] == nodes.index(bitcasts[0])


def test_graph_scratch_counts_what_a_graph_holds_beyond_its_inputs_and_outputs():
    """(x * 2 + 1).sum(): in eager both pointwise results exist at once
    (the add's input and output), 2 x 4 KiB at the peak; the 4-byte output
    is taken off (whoever holds it counts it from the start: a payload
    counted with the scratch is then never less than the graph's peak).
    Under Inductor the pointwise ops fuse into the sum: nothing."""
    from adacc_compile.passes.fusion import Realization
    import torch.fx as fx

    from adacc_compile.passes.memory_sim import graph_scratch_bytes

    g = fx.Graph()
    x = g.placeholder("x")
    doubled = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    shifted = g.call_function(torch.ops.aten.add.Tensor, (doubled, 1))
    g.output((g.call_function(torch.ops.aten.sum.default, (shifted,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm).propagate(torch.randn(1024))
    from adacc_compile.passes.annotate import annotate
    from adacc_compile.passes.device_profile import profile_by_name

    annotate(gm, profile_by_name("h100"), frozenset())
    assert graph_scratch_bytes(gm, mode=Realization.EAGER) == 2 * 4096 - 4
    assert graph_scratch_bytes(gm, mode=Realization.INDUCTOR) == 0


def test_tangents_live_to_their_last_reader_and_other_graphs_bytes_are_constants():
    """After a graph break a tangent is as large as an activation (the
    gradient of what the next graph read); under a step budget, bytes other
    graphs hold through this one's forward or backward are constants."""
    x = torch.randn(1024)
    fw = make_fx(forward, tracing_mode="fake")(x)
    bw = make_fx(backward, tracing_mode="fake")(torch.randn(32, 32), torch.randn(32, 32))
    fw_view = [n for n in fw.graph.nodes if n.op == "call_function"][2]
    saved, tangent = [n for n in bw.graph.nodes if n.op == "placeholder"]
    saved.name, tangent.name, tangent.target = fw_view.name, "tangents_1", "tangents_1"  # as AOTAutograd names it
    kib4 = 4096
    timeline = simulate_step(fw, bw, num_fwd_outputs=1, forward_extra_bytes=100, backward_extra_bytes=50)
    fw_live = [e.live_bytes for e in timeline.events if e.phase == "forward" and e.node != "<boundary>"]
    bw_live = [e.live_bytes for e in timeline.events if e.phase == "backward"]
    assert max(fw_live) == 2 * kib4 + 100
    # At d: B (saved), the tangent and D, plus c (4 B) and the constant;
    # at e the tangent is gone: D and E.
    assert max(bw_live) == 3 * kib4 + 4 + 50
    assert bw_live[-1] == kib4 + 4 + 50  # E and c at the output
