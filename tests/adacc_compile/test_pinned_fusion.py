"""Inductor may not move the backward's recomputations by fusing them with
far kernels (`compat_inductor.inductor_compile` with ``pinned_meta_key``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from adacc_compile import compat_inductor


@dataclass
class _Choices:
    """Stands in for Inductor's default handler: fuses everything."""

    asked: list[tuple[str, str]] = field(default_factory=list)

    def can_fuse(self, scheduler, node1, node2, score):
        self.asked.append((node1.name, node2.name))
        return True

    def score_fusion(self, scheduler, node1, node2):
        return 7


def _snode(name: str, order: int, *, pinned: bool = False):
    origin = SimpleNamespace(meta={"adacc_placed": True} if pinned else {})
    sub = SimpleNamespace(node=SimpleNamespace(origins=[origin]))
    return SimpleNamespace(name=name, min_order=order, max_order=order, get_nodes=lambda: [sub])


def test_pinned_node_fuses_only_with_its_neighbours():
    inner = _Choices()
    guard = compat_inductor._PinnedNodesStay(inner, "adacc_placed")
    recompute = _snode("recomputed silu", 8, pinned=True)
    assert guard.can_fuse(None, recompute, _snode("its consumer", 9), 0)
    assert not guard.can_fuse(None, recompute, _snode("silu backward, past two matmuls", 12), 0)
    assert not guard.can_fuse(None, _snode("other layer's rope", 40), recompute, 0)
    assert inner.asked == [("recomputed silu", "its consumer")]


def test_unpinned_nodes_keep_inductors_decisions():
    inner = _Choices()
    guard = compat_inductor._PinnedNodesStay(inner, "adacc_placed")
    assert guard.can_fuse(None, _snode("a", 3), _snode("b", 60), 0)
    assert inner.asked == [("a", "b")]
    assert guard.score_fusion(None, None, None) == 7  # everything else is delegated
