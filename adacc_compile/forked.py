"""Work on a second core: a function run in a forked child process while
the caller goes on, its result sent back pickled.

Why: `adacc plan` spends about a third of its time simulating the baseline
strategies (PyTorch's min-cuts, one forward/backward split each), work that
needs the traced graph and the pipeline's state up to the budget but not
the plan; the plan's MILP solve and split take as long again. Forking after
the budget stage runs the two side by side on a machine with two cores, the
smallest this project runs on.

Fork, not spawn: the child inherits the traced graph and the state as they
are, so nothing is pickled on the way in and only the result comes back.
The child does graph work only and leaves with ``os._exit``. Forking a
process that has run for a while is not safe: a thread pool or lock that
another thread held at the fork (OpenMP's, after real tensor kernels ran)
can hang the child, as it did once in the test suite's long-lived process.
So only ``adacc plan`` forks, in its own fresh process, and only while no
other Python thread runs; the caller waits for the child at most
``timeout_s`` or twice as long as its own work since the fork, whichever
is shorter (at least ``min_wait_s``). Where fork is unavailable (no
``os.fork``, ``ADACC_NO_FORK=1``, other threads), or the child fails or
does not answer in time, the function runs in the caller when the result
is asked for: the same result, without the overlap.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import select
import threading
import time
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def fork_available() -> bool:
    """Fork is safe here: a platform with ``os.fork``, not switched off, and no
    other Python thread (a fork copies only the calling thread, so a lock
    another thread holds stays held in the child forever)."""
    return (
        hasattr(os, "fork")
        and os.environ.get("ADACC_NO_FORK", "") not in ("1", "true", "yes")
        and threading.active_count() == 1
    )


def no_monitor_threads() -> None:
    """Keeps tqdm (which Dynamo's compile path uses) from starting its
    monitor thread in this process, so that `fork_available` holds; for a
    process adacc owns (``adacc plan``), called before anything runs."""
    try:
        import tqdm
    except ImportError:
        return
    tqdm.tqdm.monitor_interval = 0


class Forked(Generic[T]):
    """``Forked(fn)`` starts ``fn()`` in a child; ``.result()`` (call it once)
    waits for it."""

    def __init__(self, fn: Callable[[], T], *, timeout_s: float = 600.0, min_wait_s: float = 30.0) -> None:
        self._fn = fn
        self._timeout_s = timeout_s
        self._min_wait_s = min_wait_s
        self._forked_at = time.monotonic()
        self._pid: int | None = None
        self._read: int | None = None
        self.ran_in_child = False
        if not fork_available():
            return
        read, write = os.pipe()
        # Objects that exist now are left out of garbage collection until
        # the result is in: a collection writes to every object it visits,
        # and each write makes the kernel copy a page the two processes
        # share (copy-on-write), which slows both.
        gc.freeze()
        try:
            pid = os.fork()
        except OSError as exc:  # no memory or process slots: run it here later
            gc.unfreeze()
            os.close(read)
            os.close(write)
            log.debug("adacc: fork failed (%s); the work runs here", exc)
            return
        if pid == 0:  # the child
            gc.disable()
            os.close(read)
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which reruns fn
                payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
            with os.fdopen(write, "wb") as f:
                f.write(payload)
            os._exit(0)
        os.close(write)
        self._pid, self._read = pid, read

    def result(self) -> T:
        if self._pid is None or self._read is None:
            return self._fn()
        try:
            status, value = self._collect()
        finally:
            gc.unfreeze()
        if status == "ok":
            self.ran_in_child = True
            return value  # type: ignore[return-value]
        log.debug("adacc: forked work failed (%s); running it here", value)
        return self._fn()

    def _collect(self) -> tuple[str, object]:
        assert self._pid is not None and self._read is not None
        chunks: list[bytes] = []
        now = time.monotonic()
        wait = min(self._timeout_s, max(self._min_wait_s, 2 * (now - self._forked_at)))
        deadline = now + wait
        try:
            while True:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._read], [], [], max(left, 0.0))
                if not ready:
                    os.kill(self._pid, 9)
                    return "error", f"no answer within {wait:.0f} s"
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._read)
            self._read = None
            os.waitpid(self._pid, 0)
        if not chunks:
            return "error", "the child exited without a result"
        try:
            return pickle.loads(b"".join(chunks))
        except Exception as exc:  # noqa: BLE001
            return "error", f"unreadable result: {exc}"
