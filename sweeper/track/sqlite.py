"""How sweeper's sqlite databases are opened (Optuna's study and its ledger, MLflow's store):
in write-ahead-log mode with ``synchronous=NORMAL``.

In sqlite's default mode (a rollback journal, synchronous FULL) every commit syncs the journal
and the database to disk; in WAL mode with synchronous NORMAL a commit syncs nothing (the log is
synced at checkpoints), and a sweep commits several times a trial (what each mode costs:
docs/speed.md#orchestration-timed-directly). A process that crashes loses nothing; a power cut
may lose the last commits, never the database's consistency (https://sqlite.org/wal.html). WAL
mode is kept in the database file; its readers and writers must be on one machine (shared
memory), as they had to be already: many machines share a study through PostgreSQL
(docs/many-machines.md).

A database copied with its files (``*-wal``) or by sqlite's backup API is whole; a copy of the
main file alone, while a process has it open, may miss the last commits. So the connections
opened here are closed when the process exits (the last one to close folds the log into the
database file and removes it): the `sweeper` command leaves without Python's teardown, which
would otherwise close them (cli/base.py).
"""

from __future__ import annotations

import atexit
import contextlib
import sqlite3
from typing import Any

_installed = False
_opened: dict[int, sqlite3.Connection] = {}  # id -> connection in WAL mode, till its pool closes it


def install() -> None:
    """Every SQLAlchemy engine of this process tunes its sqlite connections as they open
    (others are left as they are). Idempotent."""
    global _installed
    if _installed:
        return
    import sqlalchemy as sa

    sa.event.listen(sa.engine.Engine, "connect", _tune)
    for event in ("close", "close_detached"):  # the pool closed it: not ours to close any more
        sa.event.listen(sa.pool.Pool, event, lambda connection, *_: _opened.pop(id(connection), None))
    atexit.register(close_all)
    _installed = True


def close_all() -> None:
    """Close this process's connections in WAL mode: the database files are whole again."""
    for connection in list(_opened.values()):
        with contextlib.suppress(sqlite3.Error):
            connection.close()
    _opened.clear()


def _tune(connection: Any, _record: Any) -> None:
    if not isinstance(connection, sqlite3.Connection):
        return
    cursor = connection.cursor()
    try:
        mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
        if mode == "delete":  # sqlite's default; memory databases ("memory") are left as they are
            mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode == "wal":  # NORMAL is safe in WAL mode only (in rollback mode a power cut may corrupt)
            cursor.execute("PRAGMA synchronous=NORMAL")
            _opened[id(connection)] = connection
    except sqlite3.OperationalError:  # another process holds a lock while the mode changes: as it was
        pass
    finally:
        cursor.close()
