"""The first training step, measured: a step budget that holds when
measured, not only when modelled.

Why: the budget is guarded by a model of what the step allocates, which
mirrors Inductor's code-generation habits (buffer reuse, fusion, in-place
kernels). A torch release or a backend the model was not checked on can
move a habit; the plan then fits the model and not the device. So, under
``budget_scope="step"``, the first call of each compiled training graph is
measured from its forward to the end of its backward
(``torch.cuda.max_memory_allocated`` on a GPU, the profiler's allocator
trace on a CPU, as `adacc_compile.measure` does) and compared with the
plan's predicted step peak. Where the measured peak is over the budget, or
far under it while the budget binds the plan, the graph is planned again
once, at its next call, with the model's cap moved by the difference
(`Correction`): a drifted habit costs one re-plan, never the budget.

Only a step of one graph is corrected: after a graph break the window of
one graph's call holds other graphs' work (`step_ledger` shares the budget
among them), and its measured peak is not its own. Such a step, a call
under an active profiler or without a backward, is not measured; a later
call is tried instead.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Callable

import torch

from adacc_compile import compat_memory
from adacc_compile.measure import native_stderr_silenced

OVER_TOLERANCE = 0.02
"""A measured peak up to 2% over the budget is left as it is: the CPU
allocator's trace and a GPU's caching allocator round small buffers."""

UNDER_TOLERANCE = 0.10
"""A measured peak more than 10% under a budget that binds the plan buys a
re-plan for a faster plan."""

BINDS = 0.95
"""The budget binds a plan whose predicted peak is at least 95% of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Correction:
    """One graph's first step, measured against its plan."""

    measured_bytes: int
    predicted_bytes: int
    budget_bytes: int

    @property
    def error_bytes(self) -> int:
        """How far the model was low (positive) or high (negative)."""
        return self.measured_bytes - self.predicted_bytes

    def wanted(self, *, clamped: bool) -> bool:
        """Whether a re-plan with the cap moved by `error_bytes` is worth it:
        the step was over the budget, or far under a budget that binds.
        ``clamped``: the budget is the reachable minimum, under which no
        plan exists, so being over it is not corrected."""
        if self.measured_bytes > (1 + OVER_TOLERANCE) * self.budget_bytes:
            return not clamped
        binds = self.predicted_bytes >= BINDS * self.budget_bytes
        return binds and self.measured_bytes < (1 - UNDER_TOLERANCE) * self.budget_bytes


class StepPeakProbe:
    """Measures one call's peak bytes, from its forward to the end of its
    backward, above what was allocated when it started.

    On a CPU the profiler's allocator trace is taken of the forward and of
    the backward separately, each started and stopped on its own side of
    the autograd engine: the engine runs a backward under the thread-local
    state captured when ``backward()`` was called and restores it after, so
    a profiler running across that call and stopped inside the backward
    would be left enabled on the caller's thread. What the caller allocates
    between the two (the loss outside the graph) is not seen; the backward
    starts from the level the forward ended at."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0
        self._profiler: Any = None
        self._forward_peak = 0
        self._forward_end = 0

    @staticmethod
    def for_inputs(args: tuple[Any, ...]) -> "StepPeakProbe | None":
        """A probe for the device of the call's tensors; None where none is
        measurable (no tensor, a device other than CPU or CUDA, a profiler
        already running on a CPU)."""
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if device is None or device.type not in ("cpu", "cuda"):
            return None
        if device.type == "cpu" and compat_memory.profiler_active():
            return None
        return StepPeakProbe(device)

    def start(self) -> None:
        """Before the forward."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            gc.collect()  # earlier work's garbage freed inside the window would count (`measure`)
            self._profiler = _start_profiler()

    def forward_done(self) -> None:
        """After the forward returned."""
        if self._profiler is not None:
            totals = _stop_profiler(self._profiler)
            self._profiler = None
            self._forward_peak = max([0, *totals])
            self._forward_end = totals[-1] if totals else 0

    def backward_starts(self) -> None:
        """Inside the backward, before this graph's backward runs."""
        if self.device.type == "cpu" and not compat_memory.profiler_active():
            self._profiler = _start_profiler()

    def stop(self) -> int | None:
        """Inside the backward, after this graph's backward ran: the peak
        bytes since `start` (None where the backward could not be measured:
        a profiler of the caller's was running)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self._base
        if self._profiler is None:
            return None
        totals = _stop_profiler(self._profiler)
        self._profiler = None
        return max(self._forward_peak, self._forward_end + max([0, *totals]))


def _start_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with native_stderr_silenced():
        profiler.start()
    return profiler


def _stop_profiler(profiler: Any) -> list[int]:
    with native_stderr_silenced():
        profiler.stop()
    return compat_memory.allocator_totals(profiler)


def measured_call(
    compiled: Callable[..., Any], args: tuple[Any, ...], probe: StepPeakProbe, done: Callable[[int | None], None]
) -> Any:
    """``compiled(*args)`` with ``probe`` measuring it until the backward of
    this call ends; then ``done(peak_bytes)``. ``done(None)`` right after
    the forward where the call has no backward (no output needs a
    gradient), or after a backward that could not be measured."""
    probe.start()
    try:
        out = compiled(*args)
    finally:
        probe.forward_done()
    node = next(
        (t.grad_fn for t in (out if isinstance(out, (list, tuple)) else [out])
         if isinstance(t, torch.Tensor) and t.grad_fn is not None),
        None,
    )
    if node is None:
        probe.stop()
        done(None)
    else:
        node.register_prehook(lambda *_: probe.backward_starts())
        node.register_hook(lambda *_: done(probe.stop()))
    return out
