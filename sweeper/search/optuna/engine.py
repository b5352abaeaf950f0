"""How sweeper connects to the sweep's database, for Optuna's storage and sweeper's ledger alike:
the engine's settings, and creating tables while other processes race to create them too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from sweeper.track import sqlite

T = TypeVar("T")

SQLITE_LOCK_TIMEOUT_S = 60  # sqlite: wait this long for another process's write lock rather than fail
CREATE_ATTEMPTS = 5  # processes starting together race to create the tables and the study
BACKOFF_S = 0.2  # the pause after the n-th lost race: n times this


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy's create_engine keywords for ``url``: sqlite waits for a lock (and runs in WAL
    mode: a commit without a sync to disk); a server's connections are checked before use."""
    sqlite.install()
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}}
    return {"pool_pre_ping": True}


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
