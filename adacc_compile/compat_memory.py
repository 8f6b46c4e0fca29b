"""Private PyTorch APIs for measuring memory: the profiler's allocator
events (a CPU step's peak, op by op) and the CUDA caching allocator's
history. Split from `compat` (the partitioner's shims), as every private
API adacc touches lives in a `compat*` module."""

from __future__ import annotations

from typing import Any

import torch


def profiler_active() -> bool:
    """Whether a ``torch.profiler`` (or autograd profiler) is running in this
    process: a second one cannot start inside it."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def allocator_totals(prof: Any) -> list[int]:
    """Bytes allocated above the level at profiling start, after every
    allocation and free that a ``torch.profiler.profile(profile_memory=True)``
    run recorded, in time order.

    The allocator reports a process-wide running total that drifts across
    profiling sessions (frees made while not profiling are not seen), so the
    totals are taken relative to the level just before the first event.
    """
    from torch._C._profiler import _EventType

    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    events = []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.total_allocated, fields.alloc_size))
    events.sort()
    if not events:
        return []
    base = events[0][1] - events[0][2]
    return [total - base for _time, total, _size in events]


def allocator_levels_by_op(prof: Any) -> list[tuple[str, int]]:
    """For each top-level aten op a ``torch.profiler.profile(profile_memory=True)``
    run recorded, in time order: its name and the most bytes allocated
    (above the level at profiling start, as `allocator_totals`) while it
    ran, frees since the op before it included. An eager graph runs one op
    per node, so this lines up with a simulated timeline node by node
    (``bench/bench_step_timeline.py``)."""
    from torch._C._profiler import _EventType

    allocations: list[tuple[int, int, int]] = []
    ops: list[Any] = []
    stack = [(node, False) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, inside_op = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            allocations.append((node.start_time_ns, fields.total_allocated, fields.alloc_size))
        elif node.tag == _EventType.TorchOp and not inside_op and node.name.startswith("aten::"):
            ops.append(node)
            inside_op = True
        stack.extend((child, inside_op) for child in node.children)
    if not allocations:
        return [(op.name, 0) for op in sorted(ops, key=lambda o: o.start_time_ns)]
    allocations.sort()
    base = allocations[0][1] - allocations[0][2]
    levels, level, i = [], 0, 0
    for op in sorted(ops, key=lambda o: o.start_time_ns):
        while i < len(allocations) and allocations[i][0] < op.start_time_ns:
            level = allocations[i][1] - base
            i += 1
        most = level
        while i < len(allocations) and allocations[i][0] <= op.end_time_ns:
            level = allocations[i][1] - base
            most = max(most, level)
            i += 1
        levels.append((op.name, most))
    return levels


def record_cuda_memory_history(enabled: bool, max_entries: int = 200_000) -> None:
    """Starts (or stops) recording every CUDA allocation and free with its
    Python stack (``torch.cuda.memory._record_memory_history``): an
    Inductor buffer's stack ends at the line of its generated wrapper code
    that allocates it, which names the buffer."""
    if enabled:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def cuda_memory_snapshot() -> dict[str, Any]:
    """The allocator's segments and the recorded trace
    (``torch.cuda.memory._snapshot``; pickle it for pytorch.org/memory_viz)."""
    return torch.cuda.memory._snapshot()
