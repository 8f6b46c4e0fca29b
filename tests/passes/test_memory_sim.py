"""Memory simulator on a hand-made forward/backward pair with exact answers."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

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
    assert timeline.saved_bytes == kib4
    assert timeline.peak_bytes == 2 * kib4 + 4
    assert timeline.activation_peak_bytes == kib4
    fw_live = [e.live_bytes for e in timeline.events if e.phase == "forward"]
    assert max(fw_live) == 2 * kib4
    bw_live = [e.live_bytes for e in timeline.events if e.phase == "backward"]
    assert max(bw_live) == 4 + 2 * kib4  # user output c (4 B) stays with the caller
