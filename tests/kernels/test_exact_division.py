"""`aten_graphs.divide`: the codecs' float32 divisions give the correctly
rounded quotient on every backend. On the CPU it is the plain division; on
a GPU it divides in float64 and rounds once, which these tests check gives
float32's own division, bit for bit (the GPU itself is checked by
``bench/gpu_check.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from adacc_compile.kernels.aten_graphs import divide


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def _hard_pairs(n: int = 1 << 20) -> tuple[torch.Tensor, torch.Tensor]:
    """Random float32 pairs over the whole exponent range, subnormals included."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 0x7F800000, (2, n), generator=g, dtype=torch.int32)
    a, b = bits.view(torch.float32)
    sign = torch.randint(0, 2, (n,), generator=g).bool()
    return torch.where(sign, -a, a), b


def test_on_the_cpu_it_is_the_plain_division():
    a, b = _hard_pairs(4096)
    assert torch.equal(_bits(divide(a, b)), _bits(a / b))
    assert torch.equal(_bits(divide(1.0, b)), _bits(1.0 / b))
    assert torch.equal(_bits(divide(a, 126.0)), _bits(a / 126.0))
    graph = make_fx(lambda x, y: divide(x, y))(a, b).graph
    assert not any(n.target == torch.ops.aten._to_copy.default for n in graph.nodes)


def test_elsewhere_it_divides_in_float64_and_returns_float32():
    a, b = torch.ones(3, 4, device="meta"), torch.ones(4, device="meta")
    graph = make_fx(lambda x, y: divide(x, y))(a, b).graph
    casts = [n.kwargs.get("dtype") for n in graph.nodes if n.target == torch.ops.aten._to_copy.default]
    assert casts.count(torch.float64) == 2 and casts[-1] == torch.float32
    assert divide(a, b).dtype == torch.float32 and divide(1.0, b).shape == (4,)


def test_a_float64_quotient_rounded_to_float32_is_float32_division():
    # Why the GPU route is exact: 53 >= 2 * 24 + 2, so double rounding is innocuous.
    a, b = _hard_pairs()
    wide = (a.double() / b.double()).float()
    assert torch.equal(_bits(wide), _bits(a / b))


@pytest.mark.parametrize("divisor", [126.0, 7.0, 6.0])
def test_inductors_folded_constant_division_rounds_like_float32(divisor: float):
    # On a GPU Inductor turns x / c into x * (1 / c); in float64 and rounded
    # to float32 that equals float32's x / c for the codecs' divisors, on
    # every bfloat16 value and a million random float32 ones.
    every_bf16 = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = torch.cat([every_bf16, _hard_pairs()[0].abs()])
    folded = (x.double() * (1.0 / divisor)).float()
    assert torch.equal(_bits(folded), _bits(x / divisor))


def test_needs_a_tensor():
    with pytest.raises(TypeError, match="tensor"):
        divide(1.0, 2.0)
