"""`storage_order`: a permuted saved value is compressed in memory order
and permuted back after decompression, with no copy; the planner's
options and the calibration see the same storage-ordered shape."""

from __future__ import annotations

import torch

from adacc_compile.passes.storage_order import (
    in_storage_order,
    inverse,
    physical_order,
    storage_permutation,
    storage_shape,
)

aten = torch.ops.aten


def test_physical_order_of_dense_layouts():
    x = torch.empty(2, 3, 4, 5)
    assert physical_order(x) == [0, 1, 2, 3]
    assert physical_order(x.transpose(1, 2)) == [0, 2, 1, 3]
    assert physical_order(x.permute(3, 0, 2, 1)) == [1, 3, 2, 0]
    assert physical_order(torch.empty(4, 1).expand(4, 6)) is None  # stride 0: not dense
    assert physical_order(x[:, :, :, ::2]) is None  # strided slice: gaps


def test_a_permuted_value_is_viewed_contiguously_and_a_contiguous_or_strided_one_is_left_alone():
    x = torch.randn(2, 8, 4, 16)  # (b, h, t, d) memory
    logical = x.transpose(1, 2)  # (b, t, h, d)
    assert storage_permutation(logical) == [0, 2, 1, 3]
    assert storage_shape(logical) == (2, 8, 4, 16)
    viewed = in_storage_order(logical)
    assert viewed.is_contiguous() and viewed.data_ptr() == x.data_ptr()
    assert torch.equal(viewed.permute(inverse([0, 2, 1, 3])), logical)
    assert storage_permutation(x) is None and in_storage_order(x) is x
    strided = x[..., ::2]  # gaps: no permutation makes it contiguous
    assert storage_permutation(strided) is None and storage_shape(strided) == (2, 8, 4, 8)


def test_calibration_measures_a_permuted_value_in_storage_order():
    """int8_smooth's parameters are one factor per channel: measured on the
    storage-ordered view they count its innermost dim (32), which is what
    the compiled graph's compress reads, not the logical last dim (8)."""
    from adacc_compile.passes.calibrate import _measure

    logical = torch.randn(4, 32, 8).transpose(1, 2)  # logical (4, 8, 32), memory (4, 32, 8)
    option = _measure("v", "int8_smooth", logical)
    assert option.accepted, option.reason
    assert option.parameters is not None and option.parameters.shape == (8,)
    contiguous = _measure("v", "int8_smooth", logical.contiguous())
    assert contiguous.parameters is not None and contiguous.parameters.shape == (32,)


def test_a_permuted_attention_output_is_compressed_in_storage_order_and_restored_without_a_copy(monkeypatch):
    """GPT attention output, saved in (b, h, t, d) memory as (b, t, h, d):
    the compress reads a contiguous ``permute`` of it, the backward permutes
    the decompressed value back (a view) to the saved value's strides, and
    no layout copy is left in the backward. The attention output is the
    GPT's one permuted value, and `lossy_uses` offers it lossless codecs
    only (none applies): the rule is lifted here, where the layout is what
    is tested."""
    from adacc_compile.passes import lossy_uses
    from adacc_compile.passes.compress_rewrite import CODEC_NODE, DECOMPRESSED

    monkeypatch.setattr(lossy_uses, "_BY_OP", {})
    from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
    from adacc_test_utils import compile_capturing, loss_and_grads

    torch._dynamo.reset()
    cfg = GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=16, vocab_size=64, dropout=0.0)
    model = init_weights(GPT(cfg))
    batch = gpt_batch(cfg, 2, torch.Generator().manual_seed(0))
    options = {"memory_budget": 0.3, "accuracy": "balanced", "allow_recompute": False, "device_profile": "h100"}
    compiled, states = compile_capturing(model, options, eager=True)
    loss_and_grads(model, compiled, *batch)
    fw, bw = states[0].fw_module, states[0].bw_module
    viewed = [n for n in fw.graph.nodes if n.name.endswith("_storage_order")]
    assert viewed, "no permuted value was compressed"
    saved_strides = {}
    for node in viewed:
        assert node.target is aten.permute.default and node.meta["val"].is_contiguous()
        assert node.users and all(CODEC_NODE in u.meta for u in node.users)
        saved_strides[node.args[0].name] = tuple(node.args[0].meta["val"].stride())
    restored = [n for n in bw.graph.nodes if n.name.endswith("_layout") and DECOMPRESSED in n.meta]
    assert len(restored) == len(viewed)
    for node in restored:
        assert node.target is aten.permute.default
        assert tuple(node.meta["val"].stride()) in saved_strides.values()
    decompressed = [n for n in bw.graph.nodes if DECOMPRESSED in n.meta]
    assert not any(n.target is aten.clone.default for n in decompressed)
