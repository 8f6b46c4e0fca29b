"""Rank 0 measures, every rank plans with its numbers: codec calibration and
adaptive drift decisions in distributed runs.

Why: calibration and drift monitoring measure the activations of the batch
at hand, and every rank holds its own batch. Measured separately, ranks
would reject different codec options, plan differently, re-plan at
different steps, and (where graphs hold collectives) deadlock. So in a run
with more than one rank, rank 0 alone runs the calibration forward and
publishes its `Calibration`; every other rank plans with it, and rank 0's
drift verdict at each check is every rank's. The plans then agree by
construction, which the plan hash check still confirms.

Exchange goes through the default group's c10d store (as
`plan_agreement` does): no collective is issued, so nothing here can
deadlock the process group; a rank that waits past ``timeout_s`` raises
`PlanMismatchError` naming what it waited for. Each rank numbers what it
shares (one counter per kind), so the n-th graph compiled or the n-th check
on one rank meets the n-th on rank 0; where the ranks compiled different
graphs (pipeline stages), the values rank 0 calibrated are not this rank's,
and this rank keeps the declared codec bounds (with that reason).
"""

from __future__ import annotations

import pickle
from typing import Callable, TypeVar

from adacc_compile import compat, compat_distributed
from adacc_compile.passes.calibrate import Calibration, not_calibrated

T = TypeVar("T")

_PREFIX = "adacc/rank0"


def distributed() -> bool:
    """More than one rank: rank 0's measurements are shared."""
    import torch.distributed as dist

    return compat_distributed.dist_ready() and dist.get_world_size() > 1


def from_rank_zero(kind: str, measure: Callable[[], T], timeout_s: float) -> T:
    """Rank 0 runs ``measure`` and publishes its result; every other rank
    returns rank 0's (the n-th call of ``kind`` on each rank meets the n-th
    on rank 0)."""
    import torch.distributed as dist

    from adacc_compile.plan_agreement import wait_for_keys

    store, me = compat_distributed.default_store(), dist.get_rank()
    sequence = int(store.add(f"{_PREFIX}/{kind}/count/{me}", 1))
    key = f"{_PREFIX}/{kind}/{sequence}"
    if me == 0:
        value = measure()
        store.set(key, pickle.dumps(value))
        return value
    wait_for_keys(store, [key], timeout_s, f"rank 0's {kind} #{sequence}")
    # Real tensors: unpickled under the partitioner's fake mode, a
    # calibration's parameters would become fake, and the constant the
    # compiled graph holds with them would fail at the first step.
    with compat.real_tensors():
        return pickle.loads(store.get(key))


def shared_calibration(measure: Callable[[], Calibration], lossy: dict[str, list[str]], timeout_s: float) -> Calibration:
    """Rank 0's calibration of this graph, where rank 0 calibrated the same
    values (``lossy``: value -> its lossy codec options, as this rank sees
    them); otherwise the declared bounds."""
    calibration = from_rank_zero("calibration", measure, timeout_s)
    if not calibration.used:
        return calibration
    ours = {value: sorted(codecs) for value, codecs in lossy.items()}
    if any(sorted(per) != ours.get(value) for value, per in calibration.options.items()):
        return not_calibrated("distributed run: rank 0 calibrated other values (another graph)")
    return calibration
