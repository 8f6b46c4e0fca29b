"""Few-bit activation codecs on the Inductor path.

Inductor's decomposition table splits ``gelu_backward``/``silu_backward``
into erf, exp and products before a partitioner sees the joint graph, so a
few-bit codec, which replaces that backward, had no reader to replace: it
was never offered under ``backend="adacc"``. The joint graph now keeps
``gelu_backward`` whole while the config may plan ``fewbit_gelu``
(`partitioner.whole_ops`; ``silu_backward`` waits for the memory model,
`partitioner.MODELLED_WHOLE_OPS`), and the split graphs decompose what the
plan left of it (`compat_inductor.decompose_whole_ops`) before Inductor lowers them.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.fx as fx
from torch._inductor.utils import run_and_get_code

from adacc_compile import compat_inductor, compat_tracing
from adacc_compile.config import AdaccConfig
from adacc_compile.kernels import get_codec
from adacc_compile.partitioner import AdaccPartitioner
from adacc_test_utils import INDUCTOR_REL, assert_same, build, compile_with_reports, loss_and_grads

#: As in test_fused_codecs: gradient error allowed, in multiples of the codec's bound.
GRADIENT_ERROR_MULTIPLE = 2.0
CODEC_OP_CALL = re.compile(r"torch\.ops\.adacc\.\w+")
ACTIVATION_BACKWARD_CALL = re.compile(r"aten\.(gelu|silu)_backward")


def _compile_and_capture(model, batch, options):
    compiled, partitioner = compile_with_reports(model, "adacc", options)
    result, codes = run_and_get_code(lambda: loss_and_grads(model, compiled, *batch))
    return result, codes, partitioner


def _unit_scale(model: torch.nn.Module) -> torch.nn.Module:
    """Linear weights at std ``1 / sqrt(fan_in)`` (kaiming-like), so the
    activations' inputs have about unit std, where the few-bit codes are
    accepted (`fewbit.MIN_INPUT_STD`); the GPT-2 init (std 0.02) of these
    tiny models leaves them at 0.01-0.1."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                fan_in = module.weight.shape[1]
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) / fan_in**0.5)
    return model


def _codecs_used(partitioner) -> set[str]:
    return {r["codec"] for r in partitioner.reports[-1]["plan"] if r["decision"] == "compress"}


def test_the_joint_graph_keeps_the_backwards_a_planned_codec_replaces():
    aten = torch.ops.aten
    assert AdaccPartitioner(AdaccConfig()).whole_ops() == ()  # lossless: as Inductor decomposes
    assert AdaccPartitioner(AdaccConfig(accuracy="balanced")).whole_ops() == ()
    aggressive = AdaccPartitioner(AdaccConfig(accuracy="aggressive")).whole_ops()
    # silu_backward: not until the memory model follows it whole (MODELLED_WHOLE_OPS)
    assert aggressive == (aten.gelu_backward.default,)
    silu_only = AdaccConfig(accuracy="aggressive", codecs=("fewbit_silu",))
    assert AdaccPartitioner(silu_only).whole_ops() == ()
    only_int8 = AdaccConfig(accuracy="aggressive", codecs=("int8_channel",))
    assert AdaccPartitioner(only_int8).whole_ops() == ()
    gelu_only = AdaccConfig(accuracy="aggressive", codecs=("fewbit_gelu",))
    assert AdaccPartitioner(gelu_only).whole_ops() == (aten.gelu_backward.default,)


@pytest.mark.parametrize("op", ["gelu_backward", "silu_backward"])
def test_a_whole_op_is_decomposed_in_place_with_the_same_values(op):
    target = getattr(torch.ops.aten, op).default
    gen = torch.Generator().manual_seed(0)
    grad, x = torch.randn(4, 33, generator=gen), torch.randn(4, 33, generator=gen) * 3
    graph = fx.Graph()
    g_node, x_node = graph.placeholder("grad"), graph.placeholder("x")
    g_node.meta["val"], x_node.meta["val"] = grad, x
    whole = graph.call_function(target, (g_node, x_node))
    whole.meta["val"] = target(grad, x)
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (whole, 2.0)),))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert compat_inductor.decompose_whole_ops(gm, [target]) == 1
    assert target not in {n.target for n in gm.graph.nodes}
    decomposed = [n for n in gm.graph.nodes if n.name.startswith(f"{whole.name}_d")]
    assert decomposed and all(isinstance(n.meta.get("val"), torch.Tensor) for n in decomposed)
    (out,) = gm(grad, x)
    torch.testing.assert_close(out, target(grad, x) * 2)
    assert compat_inductor.decompose_whole_ops(gm, [target]) == 0


@pytest.mark.parametrize("model_name,codec", [("mlp", "fewbit_gelu")])
def test_a_few_bit_plan_under_inductor_is_fused_and_within_its_bound(model_name, codec):
    """The MLP's GELU inputs are read by their activation's backward alone:
    a compress-only plan restricted to the few-bit codec uses it, the codec
    and the product reach the generated code as Inductor kernels, and no
    activation backward is left. (fewbit_silu: `adacc_eager` only, see
    `partitioner.MODELLED_WHOLE_OPS`.)"""
    model, batch = build(model_name)
    model = _unit_scale(model)
    expected = loss_and_grads(model, model, *batch)
    options = {
        "memory_budget": 0.3, "accuracy": "aggressive", "codecs": (codec,),
        "allow_recompute": False, "device_profile": "h100",
    }  # fmt: skip
    actual, codes, partitioner = _compile_and_capture(model, batch, options)
    assert _codecs_used(partitioner) == {codec}
    assert len(codes) == 2, "a forward and a backward"
    assert not any(CODEC_OP_CALL.search(code) for code in codes)
    assert not any(ACTIVATION_BACKWARD_CALL.search(code) for code in codes)
    assert_same(expected, actual, rel=GRADIENT_ERROR_MULTIPLE * get_codec(codec).error_bound + INDUCTOR_REL)


@pytest.mark.slow  # ~20 s of Inductor compiles: the default run stays under 15 minutes
def test_an_aggressive_plan_that_compresses_nothing_gives_eager_gradients():
    """Kept whole for the planner but not compressed, the GELU backward is
    decomposed as Inductor would have: the same gradients, no extern call."""
    model, batch = build("mlp")
    expected = loss_and_grads(model, model, *batch)
    actual, codes, partitioner = _compile_and_capture(
        model, batch, {"memory_budget": 1.0, "accuracy": "aggressive"}
    )
    assert not _codecs_used(partitioner)
    assert not any(ACTIVATION_BACKWARD_CALL.search(code) for code in codes)
    assert_same(expected, actual, rel=INDUCTOR_REL)


def test_the_captured_joint_graph_keeps_the_ops_it_is_given():
    """`compat_tracing.capture_joint_graph` (``adacc plan``'s trace) with and
    without the GELU backward kept whole, on fake tensors."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (torch.nn.functional.gelu(self.fc(x)) - y).pow(2).mean()

    aten = torch.ops.aten
    targets = {}
    for kept in ((), (aten.gelu_backward.default,)):
        with compat_tracing.fake_tensors():
            model, x = Block(), torch.randn(4, 8)
        joint = compat_tracing.capture_joint_graph(model, (x, x), whole_ops=kept)
        targets[kept] = {n.target for n in joint.gm.graph.nodes}
    assert aten.gelu_backward.default in targets[(aten.gelu_backward.default,)]
    assert aten.gelu_backward.default not in targets[()]
