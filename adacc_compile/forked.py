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
The child does graph work only (no tensor kernels, so no thread pools are
entered) and leaves with ``os._exit``. Where fork is unavailable (no
``os.fork``, or ``ADACC_NO_FORK=1``), the child fails or does not answer
within ``timeout_s``, the function runs in the caller when the result is
asked for: the same result, without the overlap.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import time
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def fork_available() -> bool:
    return hasattr(os, "fork") and os.environ.get("ADACC_NO_FORK", "") not in ("1", "true", "yes")


class Forked(Generic[T]):
    """``Forked(fn)`` starts ``fn()`` in a child; ``.result()`` waits for it."""

    def __init__(self, fn: Callable[[], T], *, timeout_s: float = 600.0) -> None:
        self._fn = fn
        self._timeout_s = timeout_s
        self._pid: int | None = None
        self._read: int | None = None
        self.ran_in_child = False
        if not fork_available():
            return
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
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
        status, value = self._collect()
        if status == "ok":
            self.ran_in_child = True
            return value  # type: ignore[return-value]
        log.debug("adacc: forked work failed (%s); running it here", value)
        return self._fn()

    def _collect(self) -> tuple[str, object]:
        assert self._pid is not None and self._read is not None
        chunks: list[bytes] = []
        deadline = time.monotonic() + self._timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._read], [], [], max(left, 0.0))
                if not ready:
                    os.kill(self._pid, 9)
                    return "error", f"no answer within {self._timeout_s:g} s"
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
