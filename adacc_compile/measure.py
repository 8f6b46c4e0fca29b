"""Measuring the real peak memory of a training step.

GPU: ``torch.cuda.max_memory_allocated`` minus what was allocated before.
CPU: the profiler's allocator trace. ``torch.profiler`` with
``profile_memory=True`` records every allocation and free made through
c10's CPU allocator, which is what eager kernels *and* Inductor's generated
C++ (``empty_strided_cpu``) allocate through, together with the allocator's
running total; the peak of that total is the step's peak. This is the same
quantity as the CUDA statistic, unlike process RSS, which glibc's caching
and page reuse make unreliable at the megabyte scale of CPU test models.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Any, Callable, Iterator

import torch

from adacc_compile import compat_memory


def measure_peak_bytes(step: Callable[[], Any], device: str | torch.device = "cpu") -> int:
    """Peak bytes allocated while ``step()`` runs, above what existed before."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    if device.type != "cpu":
        raise ValueError(f"measure_peak_bytes supports cpu and cuda devices, not {device}")
    totals = compat_memory.allocator_totals(profile_memory_of(step))
    return max([0, *totals])


def second_step_peak_bytes(model: torch.nn.Module, step: Callable[[], Any]) -> int:
    """``step()``'s peak the second time it runs, its first run's gradients
    freed outside the window: the profiler counts frees only of blocks a
    profiled window allocated, so gradients freed inside it made a model
    measured second in a process read up to 20% low."""
    step()
    model.zero_grad(set_to_none=True)
    return measure_peak_bytes(step)


def profile_memory_of(step: Callable[[], Any]) -> Any:
    """A CPU ``torch.profiler`` run of ``step()`` that records every
    allocation and free (`compat_memory.allocator_totals` and
    `compat_memory.allocator_levels_by_op` read it)."""
    from torch.profiler import ProfilerActivity, profile

    # Garbage of earlier work (a model compiled before, its cyclic graphs)
    # freed by a collection inside the window would count as this step's
    # frees: on a GPT measured after a Llama in one process, 0.5 MB less.
    gc.collect()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with native_stderr_silenced():
        prof.start()
    try:
        step()
    finally:
        with native_stderr_silenced():
            prof.stop()
    return prof


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Kineto logs ``USDT ... profiler_start`` / ``profiler_stop`` lines to
    the C-level stderr at every profiler start and stop (torch 2.13), which
    a measurement loop turns into dozens of lines in the user's output; only
    an environment variable read at process start controls it. File
    descriptor 2 points at /dev/null just for the start and the stop, never
    while the measured step runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
