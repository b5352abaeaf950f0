"""A helper process that serves jobs one line at a time: the export's check process (verify.py)
and the model's registrar (registrar.py).

A job is one line on the process's stdin (a file's path); its answer one line on stdout ("ok",
or why it failed). One process of each kind serves this process's jobs, started when first asked
for, or early (``shared(..., warm)`` with the modules it imports while it waits for its first
job: a new Python and torch's import cost 1-1.5 s on a 2-core CPU, off a sweep's end when they
overlap its training). It is stopped when this process exits; one that died or hung is replaced
at the next job. Imports only the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
from multiprocessing.connection import Connection
from pathlib import Path

TIMEOUT_S = 600  # one job's answer: a hang must not hold the sweep forever


class Served:
    """One helper process: ``argv`` (its modules to import first appended), run in an empty
    folder of its own so nothing of the current folder is importable by accident. With
    ``channel``, it also gets a connection of its own (``--channel FD`` appended), this end of it
    ``channel``: pickled messages, for calls the line protocol cannot carry (track/remote.py)."""

    def __init__(self, argv: list[str], grace_s: float = 0.0, channel: bool = False) -> None:
        self.grace_s = grace_s  # how long close() waits for it to end by itself before killing it
        self.owner = os.getpid()
        self.folder = Path(tempfile.mkdtemp(prefix="sweeper-served-"))
        self.log = open(self.folder / "stderr.log", "w+b")  # noqa: SIM115 (closed in close())
        self.lock = threading.Lock()
        self.channel: Connection | None = None
        mine, theirs = socket.socketpair() if channel else (None, None)
        if theirs is not None:
            argv = [*argv, "--channel", str(theirs.fileno())]
        self.proc = subprocess.Popen(
            argv,
            cwd=self.folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            pass_fds=(theirs.fileno(),) if theirs is not None else (),
        )
        if mine is not None and theirs is not None:
            theirs.close()
            self.channel = Connection(mine.detach())

    def run(self, job: Path) -> str:
        """The answer to one job: "ok", or why it failed (the process's last words if it died). One
        that dies or does not answer within TIMEOUT_S is stopped (the next job gets a new one)."""
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                self.proc.stdin.write(f"{job}\n")
                self.proc.stdin.flush()
            except OSError:
                return self._died()
            ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
            if not ready:
                self.close()
                return f"no answer within {TIMEOUT_S} s"
            answer = self.proc.stdout.readline().strip()
            return answer.removeprefix("error: ") if answer else self._died()

    def _died(self) -> str:
        code = self.proc.wait()
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        self.close()
        return lines[-1] if lines else f"exit {code}"

    def close(self) -> None:
        """Stop it: its stdin closed (it ends once its job is done) and, if it has not ended
        within ``grace_s``, killed."""
        if self.grace_s and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(self.grace_s)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.log, self.channel):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_shared: dict[str, Served] = {}
_lock = threading.Lock()


def shared(
    kind: str, argv: list[str], warm: tuple[str, ...] = (), grace_s: float = 0.0, channel: bool = False
) -> Served:
    """This process's helper of ``kind`` (running ``argv``), started on first use, importing the
    ``warm`` modules while it waits for its first job; stopped when this process exits (given
    ``grace_s`` to end by itself: one that must close its files); ``channel``: see Served."""
    with _lock:
        served = _shared.get(kind)
        mine = served is not None and served.owner == os.getpid()  # not a forked copy's
        if served is None or not mine or served.proc.poll() is not None:
            if not _shared:
                atexit.register(_close_all)
            if served is not None and mine:
                served.close()
            served = _shared[kind] = Served([*argv, *warm], grace_s, channel)
        return served


def running(kind: str) -> Served | None:
    """This process's helper of ``kind`` if it was started and still runs (none is started)."""
    with _lock:
        served = _shared.get(kind)
        alive = served is not None and served.owner == os.getpid() and served.proc.poll() is None
        return served if alive else None


def _close_all() -> None:
    for served in _shared.values():
        if served.owner == os.getpid():
            served.close()
