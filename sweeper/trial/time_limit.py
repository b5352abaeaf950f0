"""``train.max_trial_seconds`` inside the process that trains: a watchdog thread raises
``TrialTimedOut`` in the training thread once the trial's wall time passes the limit.

The exception is delivered at the training thread's next Python bytecode (CPython's
``PyThreadState_SetAsyncExc``): within one step of Python code, and within about 5 s while the
thread waits for a hung DataLoader worker (DataLoader polls its queue every 5 s). A thread stuck
inside one native call (a ``time.sleep``, a collective waiting for a peer, a CUDA sync) runs no
bytecode: that trial is stopped from outside, by killing its worker process (search/pool.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from sweeper.errors import TrialFailed

__all__ = ["TimeLimit", "TrialTimedOut", "timed_out_reason"]


class TrialTimedOut(TrialFailed):
    """The trial ran past train.max_trial_seconds (raised in its training thread)."""


def timed_out_reason(limit_s: float, ran_s: float, how: str = "stopped") -> str:
    """The reason a timed-out trial carries (its record, MLflow run, summary.json)."""
    return f"ran past train.max_trial_seconds={limit_s:g} ({how} after {ran_s:.1f} s)"


class TimeLimit:
    """``with TimeLimit(seconds):`` runs the block with ``TrialTimedOut`` raised in this thread
    once ``seconds`` (wall time) have passed (None: no limit). Nothing is raised after the block
    has exited, nor inside ``shielded()`` (a talk over a pipe that must not be cut in two)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.thread_id = ctypes.c_ulong(threading.get_ident())
        self.lock = threading.Lock()  # orders the watchdog's raise against the block's end and shields
        self.inside = self.raised = self.expired = False
        self.shields = 0
        self.watchdog: threading.Timer | None = None

    def __enter__(self) -> TimeLimit:
        if self.seconds is not None:
            self.thread_id = ctypes.c_ulong(threading.get_ident())
            self.inside = True
            self.watchdog = threading.Timer(self.seconds, self._expire)
            self.watchdog.daemon = True
            self.watchdog.start()
        return self

    def _expire(self) -> None:
        with self.lock:
            self.expired = True
            if self.inside and not self.shields:
                self._raise(TrialTimedOut)

    def _raise(self, exc: type[BaseException] | None) -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(self.thread_id, ctypes.py_object(exc) if exc else None)
        self.raised = exc is not None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self.lock:
            self.inside = False
            if self.raised:  # raised but maybe not delivered yet (the block ended first): withdrawn
                self._raise(None)
        if self.watchdog is not None:
            self.watchdog.cancel()

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """No asynchronous raise inside the block; past the limit, TrialTimedOut is raised at its end."""
        with self.lock:
            self.shields += 1
            if self.raised:  # raised and not delivered yet: withdrawn, raised at the shield's end instead
                self._raise(None)
        try:
            yield
        finally:
            with self.lock:
                self.shields -= 1
                expired = self.expired and self.inside and not self.shields
        if expired:
            raise TrialTimedOut()
