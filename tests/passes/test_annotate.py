"""Annotate pass on small traced graphs with exact expected numbers."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile.passes.annotate import annotate, annotation
from adacc_compile.passes.device_profile import BUILTIN_PROFILES, DeviceProfile, calibrate, profile_by_name
from adacc_compile.passes.op_class import OpClass

PROFILE = DeviceProfile(
    name="test", matmul_flops_per_s={"float32": 1e12}, elementwise_flops_per_s=1e11,
    memory_bytes_per_s=1e11, launch_overhead_s=1e-6,
)


def traced():
    """a[32,64] @ b[64,16] -> mm -> t (view), relu -> sum."""

    def f(a, b):
        mm = a @ b
        return mm.t(), torch.relu(mm).sum(), torch.nn.functional.dropout(mm, 0.5, True) > 0

    return make_fx(f, tracing_mode="fake")(torch.randn(32, 64), torch.randn(64, 16))


def by_op(gm, op):
    return next(annotation(n) for n in gm.graph.nodes if n.op == "call_function" and annotation(n).op == op)


def test_bytes_flops_runtime_and_classes():
    gm = annotate(traced(), PROFILE)
    mm = by_op(gm, "aten.mm")
    assert (mm.nbytes, mm.storage_bytes, mm.flops) == (2048, 2048, 2 * 32 * 64 * 16)
    assert mm.op_class is OpClass.MATMUL
    assert mm.bytes_moved == 2048 + 32 * 64 * 4 + 64 * 16 * 4
    assert mm.runtime_s == max(mm.flops / 1e12, mm.bytes_moved / 1e11) + 1e-6
    t = by_op(gm, "aten.t")
    assert (t.nbytes, t.storage_bytes, t.op_class, t.runtime_s) == (0, 2048, OpClass.VIEW, 0.0)
    assert by_op(gm, "aten.relu").op_class is OpClass.ACTIVATION
    assert by_op(gm, "aten.sum").op_class is OpClass.REDUCTION
    assert by_op(gm, "aten.gt").op_class is OpClass.MASK
    random_classes = {annotation(n).op_class for n in gm.graph.nodes if "rand" in annotation(n).op or "bernoulli" in annotation(n).op or "dropout" in annotation(n).op}
    assert random_classes and random_classes <= {OpClass.RANDOM, OpClass.DROPOUT}


def test_placeholders_cost_nothing_and_side_is_set():
    gm = annotate(traced(), PROFILE, backward_nodes=())
    for node in gm.graph.nodes:
        ann = annotation(node)
        if node.op == "placeholder":
            assert (ann.side, ann.nbytes, ann.runtime_s) == ("input", 0, 0.0)
        elif node.op == "call_function":
            assert ann.side == "forward"


class _Rotate(torch.nn.Module):
    """A module that is no attribute of the model, called by one of its
    blocks (transformers >= 5.25 wraps `apply_rotary_pos_emb` so)."""

    def forward(self, x):
        return torch.cat([-x[..., 2:], x[..., :2]], dim=-1) * 1.5


ROTATE = _Rotate()


class _Block(torch.nn.Module):
    def __init__(self, rotate: bool):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.rotate = rotate

    def forward(self, x):
        y = self.lin(x)
        return (ROTATE(y) if self.rotate else y).relu()


class _Net(torch.nn.Module):
    """Two blocks in ``layers``; returns a scalar with ``loss``."""

    def __init__(self, *, rotate: bool = False, loss: bool = False):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(rotate), _Block(rotate)])
        self.loss = loss

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum() if self.loss else x


def test_layer_from_module_stack():
    gm = torch.export.export(_Net(), (torch.randn(2, 4),)).module()
    layers = set()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            layers.add(annotate(gm, PROFILE) and annotation(node).layer)
    assert {"layers.0", "layers.1"} <= layers


def test_profiles():
    assert profile_by_name("h200").memory_bytes_per_s > profile_by_name("a100").memory_bytes_per_s
    assert set(BUILTIN_PROFILES) == {"a100", "h100", "h200"}
    cpu = calibrate("cpu")
    assert cpu is calibrate("cpu"), "calibration is cached per process"
    assert cpu.matmul_rate(torch.float32) > 1e8 and cpu.memory_bytes_per_s > 1e8
    assert 0 < cpu.launch_overhead_s < 1e-2


def test_attention_probabilities_are_softmax_outputs():
    """scaled_dot_product_attention decomposes to ``aten._safe_softmax``; its
    output is classed as a softmax (probabilities in [0, 1]), so the
    softmax_u8 codec is offered for it."""
    from adacc_compile.passes.op_class import classify

    def attention_probabilities(x):
        return torch.ops.aten._safe_softmax(x, -1), torch.softmax(x, -1), torch.log_softmax(x, -1)

    gm = make_fx(attention_probabilities)(torch.randn(2, 4, 4))
    classes = {str(n.target): classify(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert classes["aten._safe_softmax.default"] is OpClass.SOFTMAX
    assert classes["aten._softmax.default"] is OpClass.SOFTMAX
    assert classes["aten._log_softmax.default"] is OpClass.SOFTMAX


def test_a_module_level_module_belongs_to_the_block_that_calls_it():
    from adacc_compile import compat_tracing

    joint = compat_tracing.capture_joint_graph(_Net(rotate=True, loss=True), [torch.randn(2, 4)]).gm
    annotate(joint, PROFILE)
    cats = [n for n in joint.graph.nodes if n.op == "call_function" and annotation(n).op == "aten.cat"]
    stacks = [[str(path) for path, _ in (n.meta.get("nn_module_stack") or {}).values()] for n in cats]
    assert len(cats) == 2 and all(s and s[-1].startswith("G[") for s in stacks), stacks  # the case under test
    assert [annotation(n).layer for n in cats] == ["layers.0", "layers.1"]
