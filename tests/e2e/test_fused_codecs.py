"""Compressed plans under Inductor: every codec reaches it as aten ops it can
fuse, and the gradients stay right.

The H100 cost model is used where a plan must compress (it makes codecs
worth choosing); the generated code is captured with
``torch._inductor.utils.run_and_get_code``.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx as fx
from torch._inductor.utils import run_and_get_code

from adacc_compile.kernels import get_codec
from adacc_examples.models import GPT, GPTConfig, gpt_batch, init_weights
from adacc_compile.passes import codec_form, compress_rewrite, profile_cache
from adacc_compile.passes.candidates import CandidateSet
from adacc_compile.passes.compress_rewrite import CODEC_NODE, DECOMPRESSED, CodecNode
from adacc_compile.passes.plan_problem import PlanProblem, PlanSolution
from adacc_compile.passes.verify import PlanVerificationError, verify_split
from adacc_test_utils import (
    EAGER_REL,
    INDUCTOR_REL,
    assert_same,
    build,
    compile_capturing,
    compile_with_reports,
    loss_and_grads,
)

#: Gradient error allowed for lossy plans, in multiples of the largest
#: declared bound of the codecs used (as in test_gradient_safety).
GRADIENT_ERROR_MULTIPLE = 2.0
CODEC_OP_CALL = re.compile(r"torch\.ops\.adacc\.\w+")


def _gpt() -> tuple[torch.nn.Module, tuple]:
    cfg = GPTConfig(n_layer=2, d_model=128, n_head=4, seq_len=16, vocab_size=64, dropout=0.1)
    return init_weights(GPT(cfg)), gpt_batch(cfg, 2, torch.Generator().manual_seed(0))


def _codecs_used(partitioner) -> set[str]:
    return {r["codec"] for r in partitioner.reports[-1]["plan"] if r["decision"] == "compress"}


def _compile_and_capture(model, batch, options):
    compiled, partitioner = compile_with_reports(model, "adacc", options)
    result, codes = run_and_get_code(lambda: loss_and_grads(model, compiled, *batch))
    return result, codes, partitioner


def _lossy_bound(codecs: set[str]) -> float:
    return max((get_codec(c).error_bound for c in codecs), default=0.0)


#: Each compressed value adds Inductor kernels to compile (seconds each on
#: this CPU): the MLP's few values by default, GPT's dozens under ``-m slow``.
MODELS = ["mlp", pytest.param("gpt", marks=pytest.mark.slow)]


def _model(name: str):
    return build("mlp") if name == "mlp" else _gpt()


@pytest.mark.parametrize("name", MODELS)
def test_generated_code_has_no_extern_codec_call(name):
    """Compress-only planning at a tight budget uses several codecs (GPT:
    masks and linear or GELU inputs); none may appear in the
    generated code as a call to an adacc op: all are Inductor kernels."""
    model, batch = _model(name)
    expected = loss_and_grads(model, model, *batch)
    options = {"memory_budget": 0.3, "accuracy": "aggressive", "allow_recompute": False, "device_profile": "h100"}
    actual, codes, partitioner = _compile_and_capture(model, batch, options)
    used = _codecs_used(partitioner)
    # GPT: dropout masks and at least one other codec (this plan saves no
    # softmax output, so softmax_u8 is not among them; the normalised
    # LayerNorm inputs, computed for the backward alone, get lossless
    # codecs only, so fp8 is not either).
    assert used and (name == "mlp" or ("bitmask" in used and len(used) >= 2)), used
    assert len(codes) == 2, "a forward and a backward"
    calls = {call for code in codes for call in CODEC_OP_CALL.findall(code)}
    assert not calls, calls
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * _lossy_bound(used) + INDUCTOR_REL)


@pytest.mark.parametrize("codec,accuracy", [("int8_channel", "balanced"), ("int4_channel", "aggressive")])
def test_channel_codec_plan_is_fused_and_within_its_bound(codec, accuracy):
    """A plan restricted to one per-channel codec compresses with it, and the
    codec reaches the generated code as Inductor kernels, not as adacc ops."""
    model, batch = _model("mlp")
    expected = loss_and_grads(model, model, *batch)
    options = {
        "memory_budget": 0.3, "accuracy": accuracy, "codecs": (codec,),
        "allow_recompute": False, "device_profile": "h100",
    }  # fmt: skip
    actual, codes, partitioner = _compile_and_capture(model, batch, options)
    assert _codecs_used(partitioner) == {codec}
    assert not any(CODEC_OP_CALL.search(code) for code in codes)
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * get_codec(codec).error_bound + INDUCTOR_REL)


@pytest.mark.slow  # the check's negative control; the positive check runs by default
def test_the_code_check_sees_custom_op_codecs(monkeypatch):
    """The check above can fail: with the custom-op form forced (the path of
    ``ADACC_KERNELS=triton``; here running the torch reference on CPU) the
    generated code calls the adacc ops as extern kernels."""
    monkeypatch.setattr(compress_rewrite, "graph_form", lambda *args: codec_form.GraphForm.CUSTOM_OP)
    monkeypatch.setenv("ADACC_KERNELS", "torch")
    model, batch = build("gpt")
    _, codes, partitioner = _compile_and_capture(
        model, batch, {"memory_budget": 0.2, "accuracy": "lossless", "device_profile": "h100"}
    )
    assert _codecs_used(partitioner) == {"bitmask"}
    calls = {call for code in codes for call in CODEC_OP_CALL.findall(code)}
    assert calls == {"torch.ops.adacc.bitmask_compress", "torch.ops.adacc.bitmask_decompress"}


# Slow (23-40 s): Inductor's gradients with codecs spliced in are checked in
# the default run by the balanced-plan test below; bitmask's, eagerly, by
# tests/e2e/test_compression.py.
@pytest.mark.slow
def test_bitmask_plan_under_inductor_gives_eager_gradients():
    model, batch = build("gpt")  # dropout masks: bitmask applies
    expected = loss_and_grads(model, model, *batch)
    actual, codes, partitioner = _compile_and_capture(
        model, batch, {"memory_budget": 0.2, "accuracy": "lossless", "device_profile": "h100"}
    )
    assert _codecs_used(partitioner) == {"bitmask"}
    assert not any(CODEC_OP_CALL.search(code) for code in codes)
    assert_same(expected, actual, rel=INDUCTOR_REL)


@pytest.mark.parametrize("name", MODELS)
def test_balanced_plan_under_inductor_within_the_declared_bound(name):
    model, batch = _model(name)
    expected = loss_and_grads(model, model, *batch)
    actual, _, partitioner = _compile_and_capture(
        model, batch, {"memory_budget": 0.3, "accuracy": "balanced", "allow_recompute": False, "device_profile": "h100"}
    )
    used = _codecs_used(partitioner)
    assert "int8_outlier" in used, used
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * _lossy_bound(used) + INDUCTOR_REL)


def test_spliced_nodes_are_named_after_their_value_and_tagged():
    """Backward nodes spliced in must not take forward names (a backward
    node with a forward name counts as a recomputation); each compressed
    value has one node making its decompressed value; saved payloads are
    the compress graph's own outputs."""
    model, batch = _gpt()
    options = {"memory_budget": 0.3, "accuracy": "aggressive", "allow_recompute": False, "device_profile": "h100"}
    compiled, states = compile_capturing(model, options)
    loss_and_grads(model, compiled, *batch)
    state = states[-1]
    compressed = {n for n, c in state.solution.choices.items() if c.decision.value == "compress"}
    assert compressed
    forward_names = state.forward_names
    tags = [(n, n.meta[CODEC_NODE]) for n in state.bw_module.graph.nodes if CODEC_NODE in n.meta]
    assert tags and all(n.name not in forward_names for n, _ in tags)
    assert all(n.name.startswith(f"{tag.value}_{tag.codec}_d") for n, tag in tags)
    made = {}
    for node in state.bw_module.graph.nodes:
        tag = node.meta.get(CODEC_NODE)
        if DECOMPRESSED in node.meta and tag is not None:
            made.setdefault(tag.value, []).append(node)
    assert set(made) <= compressed and all(len(nodes) == 1 for nodes in made.values())
    saved = list(next(n for n in state.fw_module.graph.nodes if n.op == "output").args[0])[state.num_fwd_outputs:]
    payload = [n for n in saved if isinstance(n, fx.Node) and CODEC_NODE in n.meta]
    assert payload and all(n.meta[CODEC_NODE].role == "compress" for n in payload)


def test_simulator_charges_spliced_codecs_as_ordinary_nodes(monkeypatch):
    """Codec workspaces are declared for the custom ops only; a spliced aten
    form is simulated node by node, so no workspace may be added on top
    (it would count the same scratch twice): the timeline is the same with
    the workspace table emptied."""
    from adacc_compile.passes import memory_sim

    model, batch = _gpt()
    options = {"memory_budget": 0.3, "accuracy": "aggressive", "allow_recompute": False, "device_profile": "h100"}
    compiled, states = compile_capturing(model, options)
    loss_and_grads(model, compiled, *batch)
    state = states[-1]
    args = dict(num_fwd_outputs=state.num_fwd_outputs, forward_names=state.forward_names)
    with_table = memory_sim.simulate_step(state.fw_module, state.bw_module, **args)
    monkeypatch.setattr(memory_sim, "_codec_workspaces", lambda: {})
    without = memory_sim.simulate_step(state.fw_module, state.bw_module, **args)
    assert with_table.events == without.events and with_table.peak_bytes == without.peak_bytes
    spliced = [n for n in state.fw_module.graph.nodes if CODEC_NODE in n.meta]
    assert spliced, "the plan compresses: spliced nodes exist"


def test_verify_rejects_a_spliced_payload_never_decompressed():
    fw = fx.Graph()
    x = fw.placeholder("x")
    mask = fw.call_function(torch.ops.aten.gt.Scalar, (x, 0.0), name="mask")
    packed = fw.call_function(torch.ops.aten.sum.dim_IntList, (mask, [0]), name="mask_bitmask_c0")
    packed.meta[CODEC_NODE] = CodecNode("bitmask", "mask", "compress")
    total = fw.call_function(torch.ops.aten.sum.default, (x,), name="total")
    fw.output((total, packed))
    bw = fx.Graph()
    bw.placeholder("mask_bitmask_c0")
    tangent = bw.placeholder("tangents_1")
    bw.output((bw.call_function(torch.ops.aten.mul.Tensor, (tangent, 2.0)),))
    empty = CandidateSet(problem=PlanProblem(candidates=()), nodes={})
    with pytest.raises(PlanVerificationError, match="mask_bitmask_c0 is saved but never decompressed"):
        verify_split(
            fx.GraphModule({}, fw), fx.GraphModule({}, bw), candidates=empty,
            solution=PlanSolution(choices={}, status="optimal", solver="test"),
            forward_names={"x", "mask", "total"}, num_fwd_outputs=1,
        )


@pytest.mark.slow  # 24 s: keeps the default run under 15 minutes
def test_a_lossless_plan_times_only_lossless_codecs(monkeypatch, tmp_path):
    """With the measured CPU profile, codecs are compiled and timed when a
    plan first offers them: lossless planning never pays for the lossy
    ones; a balanced plan then adds its codec's timing to the same cache."""
    monkeypatch.setenv("ADACC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ADACC_REMEASURE", raising=False)
    monkeypatch.setattr(profile_cache, "_IN_PROCESS", {})
    model, batch = build("gpt")
    expected = loss_and_grads(model, model, *batch)
    compiled, _ = compile_with_reports(model, "adacc_eager", {"memory_budget": 0.3, "device_profile": "cpu"})
    assert_same(expected, loss_and_grads(model, compiled, *batch), rel=EAGER_REL)
    timed = set(profile_cache.loaded_profile("cpu").codec_seconds_per_element)
    assert timed and all(key.startswith("bitmask/") for key in timed), timed
    torch._dynamo.reset()
    compiled, _ = compile_with_reports(
        model, "adacc_eager", {"memory_budget": 0.3, "accuracy": "balanced", "device_profile": "cpu"}
    )
    loss_and_grads(model, compiled, *batch)
    timed = set(profile_cache.loaded_profile("cpu").codec_seconds_per_element)
    assert any(k.partition("@")[0] in ("int8_outlier/float32", "int8_outlier/float32/unaligned") for k in timed)
    assert not any(k.startswith(("fp8", "int4", "fewbit")) for k in timed)
