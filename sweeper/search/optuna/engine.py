"""How sweeper connects to the sweep's database, for Optuna's storage and sweeper's ledger alike:
the engine's settings, and creating tables while other processes race to create them too."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from sweeper.errors import UserError
from sweeper.track import sqlite

T = TypeVar("T")

SQLITE_LOCK_TIMEOUT_S = 60  # sqlite: wait this long for another process's write lock rather than fail
CREATE_ATTEMPTS = 5  # processes starting together race to create the tables and the study
BACKOFF_S = 0.2  # the pause after the n-th lost race: n times this


# A server's connections, per engine (a process has a few: docs/many-machines.md#connections):
# one kept open between statements, and up to POOL_OVERFLOW more while other threads (a lease's
# heartbeat, the queue's, trials reporting epochs) run a statement at the same time, closed when
# returned; a thread past that waits for one (SQLAlchemy's pool_timeout, 30 s). SQLAlchemy's own
# default (5 kept, 10 more) held 10 connections of one queue worker at once.
POOL_KEPT = 1
POOL_OVERFLOW = 3


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy's create_engine keywords for ``url``: sqlite waits for a lock (and runs in WAL
    mode: a commit without a sync to disk); a server's connections are checked before use, and
    few are held (POOL_KEPT, POOL_OVERFLOW)."""
    sqlite.install()
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}}
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "pool_size": POOL_KEPT, "max_overflow": POOL_OVERFLOW}
    if url.startswith("postgresql"):
        kwargs["connect_args"] = postgresql_args(url)
    return kwargs


def postgresql_args(url: str) -> dict[str, Any]:
    """A PostgreSQL connection's arguments: its name in ``pg_stat_activity`` (``sweeper
    <command> <pid>``, unless the URL or $PGAPPNAME names it), and, for psycopg 3, no statements
    prepared on the server, which a pooler in transaction mode (pgbouncer before 1.21) cannot
    keep: a connection may serve another process's transaction next (docs/many-machines.md#connections)."""
    args: dict[str, Any] = {}
    if "application_name" not in sa.engine.make_url(url).query and "PGAPPNAME" not in os.environ:
        args["application_name"] = f"sweeper {_command()} {os.getpid()}"
    if sa.engine.make_url(url).get_driver_name() == "psycopg":
        args["prepare_threshold"] = None
    return args


_SHARED: dict[str, sa.Engine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(url: str) -> sa.Engine:
    """This process's engine for the database server at ``url``: the ledgers, the queue and
    Optuna's storage (rdb.on_engine) share its pool, so a process holds POOL_KEPT connections to
    the sweep's database between statements whatever it has open, POOL_KEPT + POOL_OVERFLOW at
    most (docs/many-machines.md#connections). It waits for a restarting server
    (waiting_for_server). Disposing it (a ledger closed) closes the connections it keeps; it
    opens new ones when next used. sqlite: a new engine each call, as its file is what is shared."""
    if url.startswith("sqlite"):
        return sa.create_engine(url, **engine_kwargs(url))
    with _SHARED_LOCK:
        if url not in _SHARED:
            _SHARED[url] = waiting_for_server(sa.create_engine(url, **engine_kwargs(url)))
        return _SHARED[url]


def racing(create: Callable[[], T], lost_race: Callable[[Exception], bool]) -> T:
    """``create()``, tried again after a growing pause while it fails because another process
    created the same thing meanwhile (``lost_race``), CREATE_ATTEMPTS times in all; the last
    failure, or one that is not a lost race, is raised."""
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return create()
        except Exception as exc:
            if attempt + 1 == CREATE_ATTEMPTS or not lost_race(exc):
                raise
            time.sleep(BACKOFF_S * (attempt + 1))
    raise AssertionError("unreachable")


# A PostgreSQL restart or failover cuts every connection and refuses new ones for a few seconds
# (`pg_ctlcluster 15 main restart -m fast`: about 2 s here; a managed failover: up to a minute).
# A process waits this long for its server to answer again before it gives up with an error that
# names the server (seconds), trying again after 0.5 s, 1 s, 2 s, ... at most MAX_PAUSE_S apart.
SERVER_WAIT_S = 120.0
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 5.0


def waiting_for_server(engine: sa.Engine) -> sa.Engine:
    """``engine``, whose new connections wait for a server that does not answer (restarting,
    failing over) instead of failing: SERVER_WAIT_S at most, one line when the wait starts and
    one when the server answers again, per process. Only a server that answered this process
    before is waited for: a wrong address or a server that is not up fails at once, as it did.
    sqlite engines come back unchanged. With
    pool_pre_ping, a pooled connection the restart cut is replaced by such a new one on its next
    use; a statement cut while it runs still fails (its caller decides what a retry means)."""
    if engine.url.get_backend_name() == "sqlite":
        return engine
    where = engine.url.render_as_string(hide_password=True)

    @sa.event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        if not _OUTAGE.answered_before(engine.url):
            connection = dialect.connect(*cargs, **cparams)
            _OUTAGE.servers.add(_server(engine.url))
            return connection
        refused = dialect.loaded_dbapi.OperationalError
        return _OUTAGE.connect(lambda: dialect.connect(*cargs, **cparams), refused, where)

    return engine


class _Outage:
    """This process's wait for its database servers: said once when it starts, once when over."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None  # time.monotonic() of the first refusal, while one lasts
        self.servers: set[str] = set()  # the servers (host:port) that answered this process

    def answered_before(self, url: sa.URL) -> bool:
        return _server(url) in self.servers

    def connect(self, open_: Callable[[], T], refused: type[Exception], where: str) -> T:
        pause = FIRST_PAUSE_S
        while True:
            try:
                connection = open_()
            except refused as exc:
                waited = self._refused(where, exc)
                if waited > SERVER_WAIT_S:
                    raise UserError(
                        f"the database at {where} has not answered for {waited:.0f} s: {first_line(exc)}; "
                        "is the server up? sweeper's processes wait for it up to that long"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, MAX_PAUSE_S)
                continue
            self._answered(where)
            return connection

    def _refused(self, where: str, exc: BaseException) -> float:
        with self.lock:
            now = time.monotonic()
            if self.since is None:
                self.since = now
                print(
                    f"warning: the database at {where} does not answer ({first_line(exc)}); "
                    f"waiting for it, at most {SERVER_WAIT_S:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            return now - self.since

    def _answered(self, where: str) -> None:
        with self.lock:
            if self.since is not None:
                print(
                    f"note: the database at {where} answers again after {time.monotonic() - self.since:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                self.since = None


def riding_out(op: Callable[[bool], T], url: sa.URL, what: str) -> T:
    """``op(cut)``, run again while it fails because the server went away under it (a statement
    or commit cut by a restart: ``outage``), for SERVER_WAIT_S at most; the pause is the new
    connection's (``waiting_for_server``). ``cut``: an earlier try was cut, and its commit may
    have gone through: ``op`` checks what it left (a compare-and-set reads its row back). For
    what may run twice: a read, a write of the same values, such a checked write; ``what`` names
    it in the error past the wait. ``url``: the server's. Only a server that answered this
    process before is waited for. sqlite: ``op(False)`` once (its errors are locks, not outages)."""
    if url.get_backend_name() == "sqlite":
        return op(False)
    where, cut = url.render_as_string(hide_password=True), False
    while True:
        try:
            return op(cut)
        except Exception as exc:
            cause = outage(exc)
            if cause is None or not _OUTAGE.answered_before(url):
                raise
            if _OUTAGE._refused(where, cause) > SERVER_WAIT_S:
                raise UserError(f"{what}: the database at {where} has not answered for {SERVER_WAIT_S:.0f} s") from None
            cut = True
            time.sleep(FIRST_PAUSE_S)


def outage(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain (itself, or one it was raised from) that says the server went
    away or refuses connections, None if there is none: SQLAlchemy's wrapper of a DBAPI
    OperationalError (connection refused, terminated by an administrator command, closed
    unexpectedly, shutting down, starting up) or a connection it found invalidated. Optuna's
    StorageInternalError carries it as its cause."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: Optuna's error, SQLAlchemy's, the driver's
        if seen is None:
            return None
        if isinstance(seen, sa.exc.DBAPIError) and (
            seen.connection_invalidated or isinstance(seen, sa.exc.OperationalError)
        ):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _server(url: sa.URL) -> str:
    return f"{url.host}:{url.port}"


def _command() -> str:
    """What this process runs: the CLI's command (``worker``), or the module or script's name
    (``finish``: a queue worker's finishing process)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if script.name == "__main__.py" and len(sys.argv) > 1 and sys.argv[1].isidentifier():
        return sys.argv[1]
    return script.stem


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (the driver's, for a log line), or its type's name."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


_OUTAGE = _Outage()
