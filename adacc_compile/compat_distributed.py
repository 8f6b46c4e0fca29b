"""Private PyTorch APIs for process groups: resolving a functional
collective's group by name, its size, ranks and backend, and the default
group's key-value store (recompute inside communication windows, plans
agreed across ranks). Split from `compat` (the partitioner's shims), as
every private API adacc touches lives in a `compat*` module."""

from __future__ import annotations

from typing import Any


def dist_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def resolve_group(group_name: str) -> Any:
    """The ProcessGroup a functional collective names (None if unknown)."""
    if not dist_ready():
        return None
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(group_name)
    except Exception:
        return None


def group_size(group_name: str, default: int = 1) -> int:
    group = resolve_group(group_name)
    return int(group.size()) if group is not None else default


def group_ranks(group_name: str) -> list[int]:
    """Global ranks of a named group ([] when distributed is not set up)."""
    import torch.distributed as dist

    group = resolve_group(group_name)
    return list(dist.get_process_group_ranks(group)) if group is not None else []


def group_backend(group_name: str) -> str | None:
    import torch.distributed as dist

    group = resolve_group(group_name)
    if group is None:
        return None
    try:
        return str(dist.get_backend(group))
    except Exception:
        return None


def default_store() -> Any:
    """The c10d key-value store of the default process group."""
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()
