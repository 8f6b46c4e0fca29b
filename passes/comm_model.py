"""Communication cost model: how long a collective takes on a link.

The Lynx planner hides recomputation inside the time a collective is in
flight, so it needs that time before anything runs. The model is the
classic alpha-beta one for ring algorithms (what NCCL and gloo use for the
sizes that matter), with ``p`` ranks, ``n`` bytes, per-hop latency ``α``
and per-rank link bandwidth ``B``:

* all-reduce:        ``2(p-1)·α + 2(p-1)/p · n / B``  (reduce-scatter + all-gather)
* all-gather:        ``(p-1)·α + (p-1)/p · n_out / B``  (``n_out``: gathered bytes)
* reduce-scatter:    ``(p-1)·α + (p-1)/p · n_in / B``
* all-to-all:        ``(p-1)·α + (p-1)/p · n / B``
* broadcast:         ``(p-1)·α + n / B``  (pipelined chain)

plus a fixed launch overhead. ``B`` is the *bus* bandwidth in NCCL-tests
terms (what one rank's link sustains), so ``n / B`` is the wire time of one
full pass over the data. Built-in profiles cover NVLink (A100, H100), PCIe,
InfiniBand and gloo on CPU processes; `calibrate_link` fits ``α`` and ``B``
to all-reduces timed on a live process group.

Pure arithmetic except `calibrate_link`, which runs collectives (it is opt-in:
``comm_profile="calibrate"``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """The link between the ranks of one process group."""

    name: str
    bandwidth_bytes_per_s: float
    """Bus bandwidth one rank sustains (NCCL-tests ``busbw``)."""
    latency_s: float
    """Per-step latency ``α`` of a ring algorithm."""
    launch_overhead_s: float = 5e-6
    """Fixed cost per collective (kernel launch, bookkeeping)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
            "launch_overhead_s": self.launch_overhead_s,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> "LinkProfile":
        return LinkProfile(
            name=str(data["name"]),
            bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
            latency_s=float(data["latency_s"]),
            launch_overhead_s=float(data["launch_overhead_s"]),
        )


# Achievable bus bandwidths (NCCL-tests all-reduce busbw at large sizes), not
# datasheet peaks; latencies are per ring step.
BUILTIN_LINKS: dict[str, LinkProfile] = {
    "nvlink3": LinkProfile(name="NVLink 3 (A100 SXM)", bandwidth_bytes_per_s=230e9, latency_s=6e-6),
    "nvlink4": LinkProfile(name="NVLink 4 (H100/H200 SXM)", bandwidth_bytes_per_s=360e9, latency_s=5e-6),
    "pcie4": LinkProfile(name="PCIe 4.0 x16", bandwidth_bytes_per_s=20e9, latency_s=10e-6),
    "pcie5": LinkProfile(name="PCIe 5.0 x16", bandwidth_bytes_per_s=40e9, latency_s=10e-6),
    "ib_hdr": LinkProfile(name="InfiniBand HDR 200 Gb/s", bandwidth_bytes_per_s=22e9, latency_s=8e-6),
    "ib_ndr": LinkProfile(name="InfiniBand NDR 400 Gb/s", bandwidth_bytes_per_s=45e9, latency_s=8e-6),
    "gloo_cpu": LinkProfile(
        name="gloo on CPU processes (TCP loopback)",
        bandwidth_bytes_per_s=1e9,
        latency_s=100e-6,
        launch_overhead_s=20e-6,
    ),
}
ALIASES = {"nvlink": "nvlink4", "pcie": "pcie4", "infiniband": "ib_ndr", "gloo": "gloo_cpu"}
LINK_CHOICES = (*BUILTIN_LINKS, *ALIASES, "auto", "calibrate")


def link_by_name(name: str) -> LinkProfile:
    """A built-in link profile by name or alias ("nvlink", "pcie", ...)."""
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return BUILTIN_LINKS[key]
    except KeyError:
        raise ValueError(
            f"comm_profile={name!r} is not one of: {', '.join(LINK_CHOICES)}"
        ) from None


def default_link(backend: str | None) -> LinkProfile:
    """The profile ``comm_profile="auto"`` picks for a process-group backend."""
    if backend and "nccl" in backend.lower():
        return BUILTIN_LINKS["nvlink4"]
    return BUILTIN_LINKS["gloo_cpu"]


def collective_seconds(kind: str, nbytes: int, group_size: int, link: LinkProfile) -> float:
    """Estimated duration of one collective (see the module docstring).

    ``nbytes`` is the input size, except for all-gather, where it is the
    gathered output size. One rank (or fewer) costs only the launch overhead.
    """
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; known: {COLLECTIVE_KINDS}")
    p = int(group_size)
    if p <= 1:
        return link.launch_overhead_s
    wire = nbytes / link.bandwidth_bytes_per_s
    if kind == "all_reduce":
        steps, volume = 2 * (p - 1), 2 * (p - 1) / p * wire
    elif kind == "broadcast":
        steps, volume = p - 1, wire
    else:
        steps, volume = p - 1, (p - 1) / p * wire
    return link.launch_overhead_s + steps * link.latency_s + volume


def calibrate_link(group: Any = None, *, sizes: tuple[int, ...] = (1 << 8, 1 << 20), repeats: int = 5) -> LinkProfile:
    """Fits ``α`` and ``B`` to all-reduces timed on ``group`` (a collective:
    every rank of the group must call it).

    The per-size medians are max-reduced over the group, so every rank ends
    up with the same profile: the planner's inputs, and hence the plan, stay
    identical across ranks.
    """
    from adacc_compile import compat

    with compat.real_tensors():
        return _calibrate_link(group, sizes, repeats)


def _calibrate_link(group: Any, sizes: tuple[int, ...], repeats: int) -> LinkProfile:
    import torch
    import torch.distributed as dist

    p = dist.get_world_size(group)
    medians = []
    for numel in (max(1, s // 4) for s in sizes):
        x = torch.ones(numel, dtype=torch.float32)
        dist.all_reduce(x.clone(), group=group)  # warm-up
        times = []
        for _ in range(repeats):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(x, group=group)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    measured = torch.tensor(medians, dtype=torch.float64)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=group)
    small, large = (float(v) for v in measured)
    n_small, n_large = (4 * max(1, s // 4) for s in sizes)
    steps = 2 * (p - 1) if p > 1 else 1
    factor = 2 * (p - 1) / p if p > 1 else 1.0
    # t = steps·α + factor·n/B at two sizes: solve for α and B.
    slope = max((large - small) / max(n_large - n_small, 1), 1e-15)
    bandwidth = factor / slope
    latency = max((small - factor * n_small / bandwidth) / steps, 0.0)
    return LinkProfile(
        name=f"calibrated {dist.get_backend(group)} x{p}",
        bandwidth_bytes_per_s=float(f"{bandwidth:.6g}"),
        latency_s=float(f"{latency:.6g}"),
        launch_overhead_s=0.0,
    )
