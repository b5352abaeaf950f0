"""Where a command's seconds go: named phases (resolve, dry build, tracker, trial, export, ...),
each timed from its start to its end on the thread that ran it.

Nothing is recorded unless $SWEEPER_PHASES names a file: then each phase appends one JSON line
there (``{"phase", "start", "end", "thread", "pid"}``, wall-clock seconds since the epoch, so a
benchmark can set them against the moment it launched the process). benchmarks/startup.py reads
them into its phase table (docs/speed.md). Imports nothing beyond the standard library: a
command's first import must stay cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator

ENV = "SWEEPER_PHASES"  # the file the phases are appended to; unset: nothing is recorded


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` (recorded only when $SWEEPER_PHASES is set)."""
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        record(name, start, time.time(), path)


def record(name: str, start: float, end: float, path: str | None = None) -> None:
    """Append phase ``name`` (``start`` and ``end``: time.time() seconds) to $SWEEPER_PHASES's file."""
    path = path or os.environ.get(ENV)
    if not path:
        return
    line = {"phase": name, "start": start, "end": end, "thread": threading.current_thread().name}
    with open(path, "a", encoding="utf-8") as file:  # one write of one line: lines never interleave
        file.write(json.dumps({**line, "pid": os.getpid()}) + "\n")


# The moment the command was launched (time.time() seconds), where a harness knows it better than
# the process does (a test running commands in one process sets it per command).
LAUNCHED_ENV = "SWEEPER_LAUNCHED_AT"
_IMPORTED_AT = time.time()


def launched_at() -> float:
    """When this command was launched (time.time() seconds): $SWEEPER_LAUNCHED_AT, else the
    process's start as Linux records it (before the interpreter's own start-up), else when this
    module was first imported. What search.budget's clock counts from (plan/budget_clock.py)."""
    given = os.environ.get(LAUNCHED_ENV)
    if given:
        return float(given)
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22: starttime, after the name
        with open("/proc/uptime", encoding="ascii") as uptime:
            up = float(uptime.read().split()[0])  # seconds since boot, to 10 ms (btime is whole seconds)
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT
