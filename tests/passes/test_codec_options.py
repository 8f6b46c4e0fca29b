"""`codec_options.make_compress_options`: which codecs a value is offered."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from adacc_compile.passes.annotate import annotate
from adacc_compile.passes.codec_options import allowed_codecs, make_compress_options
from adacc_compile.passes.device_profile import profile_by_name

aten = torch.ops.aten


def _graph():
    """x -> relu(x) (the forward's output); sigmoid(x) and x > 0 computed for
    the backward alone (a derivative factor and a mask)."""
    g = fx.Graph()
    x = g.placeholder("primals_1")
    out = g.call_function(aten.relu.default, (x,))
    factor = g.call_function(aten.sigmoid.default, (x,))
    mask = g.call_function(aten.gt.Scalar, (x, 0))
    g.output((out, factor, mask))
    gm = fx.GraphModule(torch.nn.Module(), g)
    FakeTensorProp(gm).propagate(torch.randn(256, 512))
    annotate(gm, profile_by_name("h100"), frozenset())
    return gm, x, out, factor, mask


def test_a_value_computed_for_the_backward_alone_is_offered_lossless_codecs_only():
    gm, x, out, factor, mask = _graph()
    codecs = allowed_codecs("aggressive", None)
    profile = profile_by_name("h100")
    unrestricted = make_compress_options(codecs, profile, frozenset())
    assert unrestricted(factor), "lossy codecs apply to a float factor (else this test checks nothing)"
    options = make_compress_options(codecs, profile, frozenset(), forward_needed=frozenset({x, out}))
    assert options(factor) == ()
    assert [o.codec for o in options(mask)] == [o.codec for o in unrestricted(mask)] == ["bitmask"]
    assert options(out) == unrestricted(out)  # what the forward needs keeps every codec


def test_in_eager_mode_each_option_carries_its_codecs_compress_scratch():
    """Eager runs a codec's aten form op by op: the options say how much
    it allocates beyond the value and its payload; under Inductor 0."""
    from adacc_compile.kernels import get_codec
    from adacc_compile.kernels.aten_graphs import codec_graphs
    from adacc_compile.passes.codec_options import compress_scratch_bytes
    from adacc_compile.passes.fusion import Realization
    from adacc_compile.passes.memory_sim import graph_scratch_bytes

    gm, x, out, factor, mask = _graph()
    codecs = allowed_codecs("balanced", None)
    profile = profile_by_name("h100")
    eager = {o.codec: o.compress_scratch for o in make_compress_options(codecs, profile, frozenset(), mode=Realization.EAGER)(out)}
    fused = {o.codec: o.compress_scratch for o in make_compress_options(codecs, profile, frozenset())(out)}
    assert set(eager) == set(fused) and "int8_outlier" in eager
    assert all(v == 0 for v in fused.values())
    value_bytes = 256 * 512 * 4
    assert eager["int8_outlier"] > value_bytes  # several value-sized float temporaries
    traced = codec_graphs(get_codec("int8_outlier"), out.meta["val"]).compress
    assert eager["int8_outlier"] == compress_scratch_bytes(get_codec("int8_outlier"), out.meta["val"])
    assert eager["int8_outlier"] == graph_scratch_bytes(traced, mode=Realization.EAGER)
    assert graph_scratch_bytes(traced, mode=Realization.INDUCTOR) < eager["int8_outlier"] // 4


def test_a_value_of_a_few_elements_is_offered_lossless_codecs_only():
    """A declared bound is measured on large tensors: eight BatchNorm
    statistics just above a power of two broke fp8_e5m2's."""
    from adacc_compile.passes.codec_options import MIN_LOSSY_ELEMENTS

    g = fx.Graph()
    x = g.placeholder("primals_1")
    out = g.call_function(aten.relu.default, (x,))
    mask = g.call_function(aten.gt.Scalar, (x, 0))
    g.output((out, mask))
    codecs = allowed_codecs("aggressive", None)
    profile = profile_by_name("h100")
    for numel, lossy in ((MIN_LOSSY_ELEMENTS - 1, False), (MIN_LOSSY_ELEMENTS, True)):
        gm = fx.GraphModule(torch.nn.Module(), g)
        FakeTensorProp(gm).propagate(torch.randn(numel))
        annotate(gm, profile, frozenset())
        options = make_compress_options(codecs, profile, frozenset())
        assert bool(options(out)) is lossy
        assert [o.codec for o in options(mask)] == ["bitmask"]
