"""`compat_tracing.capture_joint_graph` (what ``adacc plan`` traces) runs Inductor's
joint-graph passes, as Inductor's partition function does before adacc's
backend sees the graph: both plan the same graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adacc_compile import compat_tracing


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Linear(16, 300)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.out(x), targets)


def _targets(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_the_cross_entropy_backward_scatter_is_rewritten_as_in_a_compile():
    """The scatter of -1 into a zero [tokens, vocabulary] tensor becomes a
    pointwise select (Inductor's ``scatter_upon_const_tensor``): a plan of
    the unrewritten graph counted a float32 buffer of that size that no
    compiled step holds."""
    with compat_tracing.fake_tensors() as fake:
        model = _Head()
        inputs = [fake.from_tensor(torch.randn(64, 16)), fake.from_tensor(torch.randint(0, 300, (64,)))]
        captured = compat_tracing.capture_joint_graph(model, inputs)
    targets = _targets(captured.gm)
    assert not any("scatter" in t for t in targets), sorted(targets)
    assert "aten.where.self" in targets


def test_dropout_draws_as_a_compile_draws_it():
    """Inductor's replace_random pass turns dropout into its own random ops
    (unless ``fallback_random``), as in a compile."""
    import torch._inductor.config as inductor_config

    def capture() -> set[str]:
        with compat_tracing.fake_tensors() as fake:
            model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.1))
            x = fake.from_tensor(torch.randn(8, 16, requires_grad=True))
            return _targets(compat_tracing.capture_joint_graph(model, [x]).gm)

    with inductor_config.patch(fallback_random=False):
        assert any("inductor_random" in t for t in capture())
    with inductor_config.patch(fallback_random=True):
        assert not any("inductor_random" in t for t in capture())
