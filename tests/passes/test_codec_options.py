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
