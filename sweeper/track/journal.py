"""Where MLflow writes wait while the tracking server is away: a journal of JSON lines in the
sweep's output folder, sent in order once the server answers again. Only storage: what a
write holds and how it reaches MLflow is the outbox's (outbox.py); what a run means, its
callers'. Of sweeper, it imports only files (atomic writes).

A journal folder (``<out>/mlflow-journal``) holds, per tracker that lost its server:
  ``<host>-<pid>-<tag>.jsonl``       a header line (the tracking URI without its password, the
                                     experiment), then one write per line, in the order made
  ``<host>-<pid>-<tag>.state.json``  how many of its writes were sent, and the MLflow id of each
                                     run created while the server was away (a "local-<hex>"
                                     placeholder until then); replaced atomically after every
                                     sent write, and kept once the journal is sent: a placeholder
                                     may still be in a record that outlives it
  ``files/<host>-<pid>-<tag>/``      copies of the artifacts logged meanwhile (their sources
                                     may be temporary files)
Whoever writes or sends a journal holds an exclusive flock on it; the kernel drops it with the
process. So another process (the next ``sweeper run``, ``sweeper sync``) sends only journals
that no live process holds, and never one twice at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from sweeper.files import write_atomic

FOLDER = "mlflow-journal"  # in a sweep's output folder
LOCAL = "local-"  # prefix of a placeholder: a run not created yet (server away, or by a sender thread)
_STATE = ".state.json"


def local_id() -> str:
    return LOCAL + uuid.uuid4().hex


def is_local(run_id: str | None) -> TypeGuard[str]:
    """Whether ``run_id`` is a placeholder (a run not created in MLflow yet)."""
    return run_id is not None and run_id.startswith(LOCAL)


class Journal:
    """One journal, held (flocked) by this process until ``close``."""

    def __init__(self, path: Path, handle: Any) -> None:
        self.path, self._handle = path, handle
        self.state_path = path.with_name(path.name.removesuffix(".jsonl") + _STATE)
        self.files = path.parent / "files" / path.stem
        state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.sent_count: int = state.get("sent", 0)
        self.ids: dict[str, str | None] = state.get("ids", {})  # placeholder -> run id (None: MLflow refused it)

    @classmethod
    def create(cls, folder: Path, header: dict[str, Any]) -> Journal:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        handle = open(path, "a+", encoding="utf-8")
        fcntl.flock(handle, fcntl.LOCK_EX)  # a new name: nobody else holds it
        journal = cls(path, handle)
        journal.append({"header": header})
        return journal

    @classmethod
    def adopt(cls, path: Path) -> Journal | None:
        """The journal at ``path``, held by this process now; None if a live process holds it."""
        try:
            handle = open(path, "r+", encoding="utf-8")
        except FileNotFoundError:  # sent and removed meanwhile
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        if not path.exists():  # sent and removed by its holder just before the lock was taken
            handle.close()
            return None
        return cls(path, handle)

    def _lines(self) -> list[dict[str, Any]]:
        out = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:  # a line cut short by a crash while it was appended: never sent
                    break
        return out

    @property
    def header(self) -> dict[str, Any]:
        """The tracking URI (no password) and experiment; {} if a crash cut the journal short
        at its first line (then it holds no write either)."""
        lines = self._lines()
        return lines[0].get("header", {}) if lines else {}

    def append(self, entry: dict[str, Any]) -> None:
        """One write, on disk before this returns (a crash right after keeps it)."""
        self._handle.seek(0, os.SEEK_END)
        self._handle.write(json.dumps(entry) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def keep_file(self, source: Path) -> str:
        """A copy of ``source`` (same file name) in the journal's files; its path relative to them."""
        rel = Path(uuid.uuid4().hex[:12]) / source.name
        (self.files / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, self.files / rel)
        return str(rel)

    def pending(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """(index, write) of the writes not sent yet, in order."""
        writes = self._lines()[1:]
        yield from ((i, writes[i]) for i in range(self.sent_count, len(writes)))

    def waiting(self) -> int:
        return max(0, len(self._lines()) - 1 - self.sent_count)

    def mark_sent(self, index: int, created: dict[str, str | None] | None = None) -> None:
        """Write ``index`` reached MLflow (``created``: the placeholder of the run it created ->
        the run's id). Atomic: a crash leaves the old state or the new one."""
        self.sent_count = index + 1
        self.ids.update(created or {})
        write_atomic(self.state_path, json.dumps({"sent": self.sent_count, "ids": self.ids}))

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the journal; once every write is sent, its file and copies are removed (the
        state file stays: it maps placeholders to run ids)."""
        if self._handle.closed:
            return
        if self.waiting() == 0:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.files, ignore_errors=True)
            with contextlib.suppress(OSError):  # files/ itself, once no journal has copies there
                self.files.parent.rmdir()
        self._handle.close()


def journals(folder: Path) -> list[Path]:
    """The journals in ``folder`` with writes that may wait, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name))


def known_ids(folder: Path | None) -> dict[str, str | None]:
    """Every placeholder -> run id that the journals in ``folder`` have recorded."""
    ids: dict[str, str | None] = {}
    for path in sorted(folder.glob(f"*{_STATE}")) if folder is not None and folder.is_dir() else []:
        try:
            ids.update(json.loads(path.read_text()).get("ids", {}))
        except (OSError, ValueError):  # unreadable (written atomically, it should not be): its ids stay unknown
            continue
    return ids
