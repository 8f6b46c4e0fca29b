"""`rank_zero.from_rank_zero` on a rank other than 0, with the store faked:
what rank 0 published comes back as real tensors, also where the caller
runs under a fake mode (the partitioner runs under AOTAutograd's)."""

from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

from adacc_compile import compat, compat_distributed, compat_tracing, plan_agreement, rank_zero


class _Store:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key]


def test_rank_zeros_tensors_arrive_real_under_a_fake_mode(monkeypatch):
    store = _Store()
    published = {"parameters": torch.arange(4, dtype=torch.int32)}
    store.set("adacc/rank0/calibration/1", pickle.dumps(published))
    monkeypatch.setattr(compat_distributed, "default_store", lambda: store)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(plan_agreement, "wait_for_keys", lambda *args: None)
    with compat_tracing.fake_tensors():
        got = rank_zero.from_rank_zero("calibration", lambda: None, timeout_s=1.0)
    assert not compat.is_fake(got["parameters"])
    assert torch.equal(got["parameters"], published["parameters"])
