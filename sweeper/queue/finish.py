"""Summarising and exporting a queued sweep, in a process beside the worker that ended it.

A queue's worker that ends a sweep (worker.py: it moved the sweep from running to finishing, as
its finisher) hands the sweep's name to its finishing process (`python -m
sweeper.queue.finish`, begun at its first such sweep, kept for the next) and goes on
serving trials: the summary, the report's plots and the export take seconds of CPU (3-7 s per
smoke sweep with 3 workers on 2 cores, `python benchmarks/sweep_queue.py`), during which the
worker's device would otherwise idle while runnable trials wait. A process, not a thread: the
summary and the export seed and use torch, whose random generators and thread settings are the
process's, and the trial training beside it must stay bitwise what it would be alone. One
process kept, not one per sweep: a fresh one imports for about 8 s of CPU (torch, plotting, the
exporters) before a summary that then takes about 1 s.

The finishing process marks each sweep finished (or failed, with why) itself, one after the other
in the order handed over. On Linux it dies with its worker (PR_SET_PDEATHSIG); anywhere it ends
when the worker's end of its input closes. A killed worker stops renewing its heartbeat, another
worker takes the finishing over (worker.py `_finish_orphans`), and the sweep is still summarised
once. Should the process itself die (killed for memory), the worker marks what it held failed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from sweeper.errors import SweepStopped, UserError
from sweeper.queue.table import Entry, Queue
from sweeper.search.state import Role
from sweeper.spec import SweepSpec

URL_VARIABLE = "SWEEPER_QUEUE_URL"  # the queue's URL reaches the process here, not on its command line


def queued_spec(entry: Entry, url: str) -> SweepSpec:
    """The queued sweep's spec, its study and ledger as a worker reaches the queue's database
    (its host, its role)."""
    from sweeper.spec import validate

    search = {**entry.spec["search"], "storage": url}
    return validate({**entry.spec, "search": search}, f"queued sweep '{entry.name}'")


class Finisher:
    """The worker's side: its finishing process, begun when first needed."""

    def __init__(self, url: str, out_root: Path, me: str, say: Callable[[str], None]) -> None:
        self.url, self.out_root, self.me, self.say = url, out_root, me, say
        self.process: subprocess.Popen | None = None
        self.handed: list[str] = []  # the sweeps handed over, in order

    def hand(self, name: str) -> int:
        """Sweep ``name`` (this worker its finisher) to be summarised; the process's pid."""
        if self.process is None:
            command = [sys.executable, "-m", "sweeper.queue.finish", str(self.out_root), str(os.getpid())]
            env = {**os.environ, URL_VARIABLE: self.url}
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, text=True)
        assert self.process.stdin is not None
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        self.handed.append(name)
        return self.process.pid

    def check(self, queue: Queue) -> None:
        """If the finishing process died, what it still held is marked failed (the trials stay in
        their studies); the next sweep begins a new one."""
        if self.process is None or self.process.poll() is None:
            return
        code, self.process = self.process.returncode, None
        for name in self.handed:
            why = f"its summary and export did not end: the finishing process exited with {code} (see worker {self.me})"
            if queue.move(name, ("finishing",), state="failed", ended_at=time.time(), note=why):
                self.say(f"sweep '{name}' failed: {why}")

    def close(self) -> None:
        """Wait for the sweeps handed over (its input closed: it exits after the last one)."""
        if self.process is not None:
            assert self.process.stdin is not None
            with contextlib.suppress(OSError):  # it died already
                self.process.stdin.close()
            self.process.wait()

    def finished(self, queue: Queue) -> int:
        """How many of the sweeps handed over are finished."""
        states = {e.name: e.state for e in queue.entries()}
        return sum(states.get(name) == "finished" for name in self.handed)


def summarise(queue: Queue, entry: Entry, spec: SweepSpec, out_dir: Path, say: Callable[[str], None]) -> bool:
    """`sweeper run`'s end for the queued sweep (runner role "finish": summary, export), then the
    sweep marked finished; False (the sweep marked failed, with why) on a user error."""
    from sweeper import export
    from sweeper.search import runner
    from sweeper.track.progress import QuietObserver

    # the export's helpers (kept for this process's later sweeps) start while the summary is made
    export.prestart(list(spec.export.formats), register=spec.tracking.enabled)
    try:
        summary = runner.run_sweep(spec, out_dir, QuietObserver(), role=Role.FINISH)
    except (UserError, SweepStopped) as exc:
        fail(queue, entry.name, str(exc), say)
        return False
    note = str((out_dir / "summary.json").resolve())
    queue.move(entry.name, ("finishing",), state="finished", ended_at=time.time(), note=note)
    best = summary.get("best") or {}
    say(f"finished sweep '{entry.name}': best {best.get('value')} (trial {best.get('number')}); {note}")
    return True


def fail(queue: Queue, name: str, why: str, say: Callable[[str], None]) -> None:
    from sweeper.queue.table import OPEN

    if queue.move(name, (*OPEN, "finishing"), state="failed", ended_at=time.time(), note=why):
        say(f"sweep '{name}' failed: {why}")


def _die_with(worker: int) -> None:
    """Linux: SIGKILL for this process when the worker that began it dies; gone already: exit."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != worker:  # the worker died before the signal was asked for: its successor finishes
        sys.exit(1)


def _finish_one(queue: Queue, name: str, out_root: Path, say: Callable[[str], None]) -> None:
    try:
        entry = queue.entry(name)
        spec = queued_spec(entry, queue.url)
    except UserError as exc:
        fail(queue, name, str(exc), say)
        return
    try:
        summarise(queue, entry, spec, out_root / name, say)
    except Exception as exc:  # a fault of this sweep's summary: said, the sweep failed, the next one goes on
        traceback.print_exc()
        fail(queue, name, f"its summary and export failed: {type(exc).__name__}: {exc}", say)


def main(argv: list[str]) -> int:
    out_root, worker = Path(argv[0]), int(argv[1])
    _die_with(worker)

    def say(line: str) -> None:
        print(line, flush=True)

    queue = Queue(os.environ[URL_VARIABLE])
    try:
        for line in sys.stdin:  # a sweep's name per line, until the worker closes its end
            _finish_one(queue, line.strip(), out_root, say)
    finally:
        queue.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
