"""The queue's rows, in the database that holds its sweeps' studies and ledgers (PostgreSQL for a
pool of machines; sqlite for one):

- ``sweeper_queue``: one row per submitted sweep: its spec (checked at submission), owner,
  priority, the device it requires, and its state: queued -> running -> finishing -> finished
  (or failed), or cancelled. Every change of state is one atomic compare-and-set UPDATE, so of
  many workers exactly one starts finishing a sweep (summary, export, registry).
- ``sweeper_owners``: an owner's fair-share weight and quota of concurrent devices (none: no row).
- ``sweeper_queue_workers``: one row per `sweeper worker --queue` process: what it offers, which
  sweep it serves, renewed by a heartbeat; the quota counts the live ones.

A sweep's own coordination (batches, budget, leases, spent device-seconds) stays in its ledger
(search/optuna/ledger.py), keyed by the sweep's name, which is its study's name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweeper.errors import UserError
from sweeper.search.optuna.engine import racing, riding_out, shared_engine
from sweeper.search.optuna.ledger import SPENT
from sweeper.search.optuna.study import safe_url

T = TypeVar("T")
_RACE = (IntegrityError, OperationalError, ProgrammingError)  # another process created the table first

STATES = ("queued", "running", "finishing", "finished", "failed", "cancelled")
OPEN = ("queued", "running")  # states whose sweeps take new trials
DEVICES = ("any", "cpu", "cuda")  # what a sweep may require of a worker's device
LIVE_S = 30.0  # a worker not seen for this long is gone: its devices leave its owner's quota

METADATA = sa.MetaData()
QUEUE = sa.Table(
    "sweeper_queue",
    METADATA,
    sa.Column("name", sa.String(512), primary_key=True),  # the sweep's name: its study's name
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),  # higher first
    sa.Column("state", sa.String(16), nullable=False),  # one of STATES
    sa.Column("spec", sa.Text, nullable=False),  # JSON: the spec as submitted (search.storage: the queue's)
    sa.Column("device", sa.String(8), nullable=False),  # one of DEVICES
    sa.Column("min_memory_gb", sa.Float, nullable=False),  # of the device (GPU memory; RAM on the CPU)
    # train.devices: the devices each trial holds (its DDP ranks: GPUs on CUDA)
    sa.Column("devices", sa.Integer, nullable=False, server_default="1"),
    sa.Column("submitted_at", sa.Float, nullable=False),  # unix time
    sa.Column("started_at", sa.Float),  # its first trial claimed
    sa.Column("ended_at", sa.Float),  # finished, failed or cancelled
    sa.Column("finisher", sa.String(128)),  # the worker summarising and exporting it
    sa.Column("note", sa.Text),  # the summary's path, or why it failed
)
OWNERS = sa.Table(
    "sweeper_owners",
    METADATA,
    sa.Column("owner", sa.String(128), primary_key=True),
    sa.Column("weight", sa.Float, nullable=False),  # fair share: device time in proportion to it
    sa.Column("max_devices", sa.Integer),  # quota of devices in use at once (None: no quota)
)
WORKERS = sa.Table(
    "sweeper_queue_workers",
    METADATA,
    sa.Column("worker", sa.String(128), primary_key=True),  # host:pid:tag
    sa.Column("device", sa.String(8), nullable=False),  # cpu | cuda
    sa.Column("memory_gb", sa.Float, nullable=False),
    sa.Column("devices", sa.Integer, nullable=False, server_default="1"),  # GPUs it offers (CPU: 1)
    sa.Column("serving", sa.String(512)),  # the sweep it trains for now (None: between sweeps)
    sa.Column("unit_s", sa.Float),  # device-seconds of its last trial: fair share's estimate of its running one
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),  # its last heartbeat (unix time)
    sa.Column("left_at", sa.Float),  # it exited cleanly
)


@dataclass(frozen=True)
class Entry:
    """A sweep of the queue, as its row holds it."""

    name: str
    owner: str
    priority: int
    state: str
    spec: dict[str, Any]
    device: str
    min_memory_gb: float
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    finisher: str | None
    note: str | None
    devices: int = 1  # train.devices: each trial's devices (DDP ranks)

    @classmethod
    def of(cls, row: Any) -> Entry:
        values = dict(row)
        values["spec"] = json.loads(values["spec"])
        return cls(**values)


@dataclass(frozen=True)
class Offer:
    """What a worker offers: its device's kind and memory (GB), and how many GPUs (a sweep of
    train.devices N trains each trial on N; on the CPU, a trial's ranks share the worker's cores)."""

    device: str
    memory_gb: float
    devices: int = 1

    def fits(self, entry: Entry) -> bool:
        enough = self.device != "cuda" or self.devices >= entry.devices
        return entry.device in ("any", self.device) and self.memory_gb >= entry.min_memory_gb and enough


class Queue:
    """The queue in the database at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._has_ledger = False  # sweeper_spent exists (a sweep's ledger made it); once true, stays
        try:
            self.engine = shared_engine(url)
            racing(lambda: METADATA.create_all(self.engine), lambda exc: isinstance(exc, _RACE))
            _add_columns(self.engine, url)
        except UserError:
            raise
        except sa.exc.SQLAlchemyError as exc:
            raise UserError(f"--queue {safe_url(url)}: cannot open it: {str(exc).splitlines()[0]}") from None
        except Exception as exc:  # not a database URL; a driver missing
            raise UserError(f"--queue {safe_url(url)}: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self.engine.dispose()

    # --- sweeps -------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        owner: str,
        priority: int,
        spec: dict[str, Any],
        device: str,
        min_memory_gb: float,
        devices: int = 1,
    ) -> None:
        try:
            with self.engine.begin() as db:
                db.execute(
                    QUEUE.insert().values(
                        name=name,
                        owner=owner,
                        priority=priority,
                        state="queued",
                        spec=json.dumps(spec),
                        device=device,
                        min_memory_gb=min_memory_gb,
                        devices=devices,
                        submitted_at=time.time(),
                    )
                )
        except IntegrityError:
            raise UserError(
                f"{safe_url(self.url)}: the queue holds a sweep named '{name}' already "
                f"(`sweeper queue {safe_url(self.url)}` lists them); give this one another name: name=..."
            ) from None
        except sa.exc.ProgrammingError as exc:  # row-level security (queue-access): only as oneself
            raise UserError(
                f"{safe_url(self.url)}: the database refused to queue sweep '{name}' for owner '{owner}' "
                f"({str(exc.orig).splitlines()[0]}); a submitter queues sweeps as its own database role: "
                f"--owner {self.role()}"
            ) from None

    def _riding(self, op: Callable[[bool], T], what: str) -> T:
        """``op`` through a restart of the server (engine.riding_out): for what may run twice."""
        return riding_out(op, self.engine.url, f"the queue at {safe_url(self.url)}: {what}")

    def _rows(self, query: Any) -> list[Any]:
        """The rows ``query`` selects (mappings), read through a restart of the server."""

        def read(_: bool) -> list[Any]:
            with self.engine.connect() as db:
                return list(db.execute(query).mappings().all())

        return self._riding(read, "reading it")

    def entries(self) -> list[Entry]:
        """Every sweep of the queue, in the order submitted."""
        return [Entry.of(r) for r in self._rows(sa.select(QUEUE).order_by(QUEUE.c.submitted_at, QUEUE.c.name))]

    def entry(self, name: str) -> Entry:
        row = next(iter(self._rows(sa.select(QUEUE).where(QUEUE.c.name == name))), None)
        if row is None:
            names = [e.name for e in self.entries()]
            raise UserError(
                f"{safe_url(self.url)}: the queue holds no sweep '{name}'; it holds: {', '.join(names) or 'none'}"
            )
        return Entry.of(row)

    def move(self, name: str, from_states: tuple[str, ...], **values: Any) -> bool:
        """One atomic UPDATE of the sweep's row while it is in one of ``from_states``; True if it
        applied. Through a restart of the server: an answer lost with the connection is read back
        from the row (it holds ``values``: this move applied, or one that set the same)."""

        def update(cut: bool) -> bool:
            with self.engine.begin() as db:
                done = db.execute(
                    QUEUE.update().where(QUEUE.c.name == name, QUEUE.c.state.in_(from_states)).values(**values)
                )
            if done.rowcount == 1 or not cut:
                return done.rowcount == 1
            with self.engine.connect() as db:
                row = db.execute(sa.select(QUEUE).where(QUEUE.c.name == name)).mappings().first()
            return row is not None and all(row[k] == v for k, v in values.items())

        return self._riding(update, f"moving sweep {name}")

    def set_priority(self, name: str, priority: int) -> None:
        entry = self.entry(name)  # a UserError naming the sweeps when there is no such sweep
        with self.engine.begin() as db:
            done = db.execute(QUEUE.update().where(QUEUE.c.name == name).values(priority=priority))
        if done.rowcount != 1:
            raise self.not_yours(entry)

    def not_yours(self, entry: Entry) -> UserError:
        """The error for a change that row-level security (queue-access) did not let through."""
        return UserError(
            f"sweep '{entry.name}' belongs to {entry.owner}: the database lets only its owner's role (or the "
            f"workers') change it; you are connected as {self.role()}"
        )

    def role(self) -> str:
        """The database role this process is connected as."""
        if not self.url.startswith("postgresql"):
            return "the database's only user"
        with self.engine.connect() as db:
            return str(db.execute(sa.text("select current_user")).scalar())

    # --- owners -------------------------------------------------------------------------------

    def set_owner(self, owner: str, weight: float | None, max_devices: int | None) -> None:
        """Set an owner's fair-share weight and/or quota (max_devices < 0: no quota)."""
        with self.engine.begin() as db:
            row = db.execute(sa.select(OWNERS).where(OWNERS.c.owner == owner)).mappings().first()
            values = dict(row) if row is not None else {"owner": owner, "weight": 1.0, "max_devices": None}
            if weight is not None:
                values["weight"] = weight
            if max_devices is not None:
                values["max_devices"] = None if max_devices < 0 else max_devices
            if row is None:
                db.execute(OWNERS.insert().values(**values))
            else:
                db.execute(OWNERS.update().where(OWNERS.c.owner == owner).values(**values))

    def owners(self) -> dict[str, dict[str, Any]]:
        """owner -> {weight, max_devices}, for the owners given either."""
        rows = self._rows(sa.select(OWNERS))
        return {r["owner"]: {"weight": r["weight"], "max_devices": r["max_devices"]} for r in rows}

    def spent(self) -> dict[str, float]:
        """Device-seconds each sweep's finished trials used (its ledger's sweeper_spent row)."""

        def read(_: bool) -> dict[str, float]:
            with self.engine.connect() as db:
                self._has_ledger = self._has_ledger or sa.inspect(db).has_table(SPENT.name)
                if not self._has_ledger:  # no sweep has run yet: the workers look once per decision until one has
                    return {}
                return {r.study: float(r.device_seconds) for r in db.execute(sa.select(SPENT))}

        return self._riding(read, "reading the spent device time")

    # --- workers ------------------------------------------------------------------------------

    def join(self, worker: str, offer: Offer) -> None:
        now = time.time()
        row = {"device": offer.device, "memory_gb": offer.memory_gb, "devices": offer.devices}

        def insert(cut: bool) -> None:
            try:
                with self.engine.begin() as db:
                    db.execute(WORKERS.insert().values(worker=worker, **row, started_at=now, seen_at=now))
            except IntegrityError:
                if not cut:  # else the cut try's insert went through
                    raise

        self._riding(insert, f"worker {worker} joining")

    def serve(self, worker: str, name: str | None) -> None:
        """Say which sweep ``worker`` trains for now (None: none)."""
        self._set(worker, serving=name, seen_at=time.time())

    def _set(self, worker: str, **values: Any) -> None:
        """``worker``'s row updated with ``values`` (again after a restart of the server: the same)."""

        def update(_: bool) -> None:
            with self.engine.begin() as db:
                db.execute(WORKERS.update().where(WORKERS.c.worker == worker).values(**values))

        self._riding(update, f"worker {worker}'s row")

    def take_seat(self, worker: str, entry: Entry, live_within_s: float) -> bool:
        """Say that ``worker`` serves ``entry`` now, unless its owner's quota of devices is used
        up by other live workers: one transaction holding the owner's row (PostgreSQL: FOR UPDATE),
        so two workers cannot both take an owner's last device."""
        since = time.time() - live_within_s
        return self._riding(lambda _: self._take_seat(worker, entry, since), f"worker {worker} serving {entry.name}")

    def _take_seat(self, worker: str, entry: Entry, since: float) -> bool:
        """take_seat's transaction (run again after a cut: the same answer, as the quota counts
        the other workers only)."""
        with self.engine.begin() as db:
            quota = db.execute(
                sa.select(OWNERS.c.max_devices).where(OWNERS.c.owner == entry.owner).with_for_update()
            ).scalar()
            if quota is not None:  # the devices the owner's trials hold elsewhere (a DDP trial: several)
                in_use = db.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(QUEUE.c.devices), 0))
                    .select_from(WORKERS.join(QUEUE, WORKERS.c.serving == QUEUE.c.name))
                    .where(
                        QUEUE.c.owner == entry.owner,
                        WORKERS.c.worker != worker,
                        WORKERS.c.left_at.is_(None),
                        WORKERS.c.seen_at >= since,
                    )
                ).scalar()
                if int(in_use or 0) + entry.devices > quota:
                    return False
            db.execute(
                WORKERS.update().where(WORKERS.c.worker == worker).values(serving=entry.name, seen_at=time.time())
            )
        return True

    def set_unit(self, worker: str, seconds: float) -> None:
        """Say what ``worker``'s last trial cost (device-seconds): others count its running trial so."""
        self._set(worker, unit_s=seconds)

    def heartbeat(self, worker: str) -> None:
        self._set(worker, seen_at=time.time())

    def leave(self, worker: str) -> None:
        self._set(worker, serving=None, left_at=time.time())

    def workers(self, live_within_s: float) -> list[dict[str, Any]]:
        """The workers that renewed their heartbeat within ``live_within_s`` and have not left."""
        since = time.time() - live_within_s
        live = sa.select(WORKERS).where(WORKERS.c.left_at.is_(None), WORKERS.c.seen_at >= since)
        return [dict(r) for r in self._rows(live)]


# Columns added after the queue's first release: (table, column, its definition for ADD COLUMN)
ADDED = (
    (QUEUE, "devices", "INTEGER NOT NULL DEFAULT 1"),
    (WORKERS, "devices", "INTEGER NOT NULL DEFAULT 1"),
    (WORKERS, "unit_s", "FLOAT"),
)


def _add_columns(engine: sa.Engine, url: str) -> None:
    """The columns of ADDED that a queue's tables, created before them, lack (rows: the default)."""

    def columns() -> set[tuple[str, str]]:
        with engine.connect() as db:
            inspector = sa.inspect(db)
            return {(t, c["name"]) for t in {t.name for t, _, _ in ADDED} for c in inspector.get_columns(t)}

    present = columns()  # one inspection per open; a second only where an ALTER failed
    for table, column, definition in ADDED:
        if (table.name, column) in present:
            continue
        try:
            with engine.begin() as db:
                db.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {column} {definition}"))
        except sa.exc.SQLAlchemyError as exc:
            if (table.name, column) in columns():  # another process added it meanwhile: fine
                continue
            raise UserError(
                f"--queue {safe_url(url)}: table {table.name} predates its {column} column and this role "
                f"cannot add it ({str(exc).splitlines()[0]}); run `sweeper queue {safe_url(url)}` once as "
                f"the tables' owner"
            ) from None
