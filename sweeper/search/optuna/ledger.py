"""The sweep's ledger: sweeper's own rows beside the Optuna study, in the same database, shared
by every process serving the sweep (on one machine or many).

- ``sweeper_sweeps``: one row per study. Who prepares the sweep (its MLflow parent run, the LR
  warm start) and what they found; the spec it was started with; the budget (n_trials, timeout)
  and what has been claimed of it: batches and trial slots, each claimed by one atomic
  compare-and-set UPDATE, so the budget is never exceeded nor short, whatever the number of
  processes; a stop request.
- ``sweeper_spent``: one row per study: the device-seconds its finished trials used, added by
  one atomic ``UPDATE ... SET device_seconds = device_seconds + ?`` per trial (no update lost,
  whatever the number of processes), checked against search.budget before each claim.
- ``sweeper_members``: one row per process serving the sweep (host, pid, role), renewed by its
  heartbeat: ``sweeper status`` shows it, and a claim left by a process that stopped renewing
  can be taken over.
- ``sweeper_spaces``: the sweep's search spaces, once `sweeper run` resumed it with another one.

A "slot" is a trial of the budget: slot s is the s-th trial proposed (0-based). A trial retried
because its process died keeps its slot (and so its seed and parameters).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from sweeper.search.optuna.engine import racing, riding_out, shared_engine

_RACE = (IntegrityError, OperationalError, ProgrammingError)  # another process created the table first

METADATA = sa.MetaData()
SWEEPS = sa.Table(
    "sweeper_sweeps",
    METADATA,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),  # JSON: the spec the sweep was started with
    sa.Column("state", sa.String(16), nullable=False),  # preparing | ready
    sa.Column("preparer", sa.String(128)),  # member preparing it (state preparing)
    sa.Column("prepared", sa.Text),  # JSON: what preparing produced (runner.Prepared)
    sa.Column("n_trials", sa.Integer),  # the budget; None: until the timeout
    sa.Column("timeout_s", sa.Float),
    sa.Column("started_at", sa.Float, nullable=False),  # unix time the sweep (or its resume) began
    sa.Column("batches", sa.Integer, nullable=False, default=0),  # batches claimed
    sa.Column("proposed", sa.Integer, nullable=False, default=0),  # slots claimed
    sa.Column("batch_start", sa.Integer, nullable=False, default=0),  # first slot of the last batch
    sa.Column("proposing", sa.String(128)),  # the lock: member creating or retrying trials, else None
    sa.Column("stop", sa.Boolean, nullable=False, default=False),
)
SPENT = sa.Table(  # a table of its own: a ledger made by an older sweeper gains it by create_all
    "sweeper_spent",
    METADATA,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("device_seconds", sa.Float, nullable=False),  # seconds × devices (GPUs, or CPU threads)
)
MEMBERS = sa.Table(
    "sweeper_members",
    METADATA,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("member", sa.String(128), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False),  # run | worker
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),  # its last heartbeat (unix time)
    sa.Column("left_at", sa.Float),  # it exited cleanly
)

# The sweep's search spaces, when `sweeper run` resumed it with another search.space: version 1
# is the space it started with (recorded with the first change), each later one applies from
# the slot ``first_slot`` on. Created by create_all in databases of an older sweeper too.
SPACES = sa.Table(
    "sweeper_spaces",
    METADATA,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("space", sa.Text, nullable=False),  # JSON: search.space as the spec writes it
    sa.Column("first_slot", sa.Integer, nullable=False),  # the first trial slot proposed in this space
    sa.Column("created_at", sa.Float, nullable=False),  # unix time
)


def host_name() -> str:
    """This machine's name in leases and ``sweeper status``: $SWEEPER_HOST, else the host name
    (set SWEEPER_HOST where containers on one kernel share a host name)."""
    return os.environ.get("SWEEPER_HOST") or socket.gethostname()


def this_member() -> str:
    return f"{host_name()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Sweep:
    """A sweeps row."""

    spec: dict[str, Any]
    state: str
    preparer: str | None
    prepared: dict[str, Any] | None
    n_trials: int | None
    timeout_s: float | None
    started_at: float
    batches: int
    proposed: int
    batch_start: int
    proposing: str | None
    stop: bool
    device_seconds: float = 0.0  # what the sweep's finished trials spent (sweeper_spent)

    def device_budget_s(self) -> float | None:
        """search.budget in device-seconds, as `sweeper run` last set it (None: no budget)."""
        budget = self.spec.get("search", {}).get("budget")
        return None if budget is None else budget["device_hours"] * 3600

    def device_budget_spent(self) -> bool:
        cap = self.device_budget_s()
        return cap is not None and self.device_seconds >= cap

    def deadline(self) -> float | None:
        return None if self.timeout_s is None else self.started_at + self.timeout_s


class Ledger:
    """The rows of one study (``name``) in the database at ``url``."""

    def __init__(self, url: str, name: str, grace_s: float, member: str | None = None) -> None:
        self.engine, self.name, self.grace_s = shared_engine(url), name, grace_s
        self.member = member or this_member()
        # processes starting together race to create the tables
        racing(lambda: METADATA.create_all(self.engine), lambda exc: isinstance(exc, _RACE))

    def close(self) -> None:
        self.engine.dispose()

    # --- the sweep row -------------------------------------------------------------------------

    def read(self) -> Sweep | None:
        return riding_out(lambda _: self._read(), self.engine.url, f"sweep {self.name}: reading its row")

    def _read(self) -> Sweep | None:
        with self.engine.connect() as db:
            row = db.execute(sa.select(SWEEPS).where(SWEEPS.c.study == self.name)).mappings().first()
        if row is None:
            return None
        return Sweep(
            device_seconds=self.device_seconds(),
            spec=json.loads(row["spec"]),
            state=row["state"],
            preparer=row["preparer"],
            prepared=json.loads(row["prepared"]) if row["prepared"] else None,
            n_trials=row["n_trials"],
            timeout_s=row["timeout_s"],
            started_at=row["started_at"],
            batches=row["batches"],
            proposed=row["proposed"],
            batch_start=row["batch_start"],
            proposing=row["proposing"],
            stop=row["stop"],
        )

    def create(self, spec: dict[str, Any], n_trials: int | None, timeout_s: float | None, existing: int = 0) -> bool:
        """Insert the sweep's row with this process preparing it; False if it exists already.
        ``existing``: trials the study holds already (made before it had a ledger)."""
        try:
            with self.engine.begin() as db:
                db.execute(
                    SWEEPS.insert().values(
                        study=self.name,
                        spec=json.dumps(spec),
                        state="preparing",
                        preparer=self.member,
                        n_trials=n_trials,
                        timeout_s=timeout_s,
                        started_at=time.time(),
                        batches=int(existing > 0),
                        proposed=existing,
                        batch_start=0,
                        stop=False,
                    )
                )
            return True
        except IntegrityError:
            return False

    def _update(self, where: Any, **values: Any) -> bool:
        """One atomic UPDATE of the sweep's row where ``where`` holds; True if it applied. Through
        a restart of the server: an answer lost with the connection is read back from the row
        (it holds ``values``: this update applied, or one that set the same)."""

        def update(cut: bool) -> bool:  # cut: an earlier try's commit may have gone through
            with self.engine.begin() as db:
                done = db.execute(SWEEPS.update().where(SWEEPS.c.study == self.name, where).values(**values))
            if done.rowcount == 1 or not cut:
                return done.rowcount == 1
            with self.engine.connect() as db:
                row = db.execute(sa.select(SWEEPS).where(SWEEPS.c.study == self.name)).mappings().first()
            literal = {k: v for k, v in values.items() if not isinstance(v, sa.ColumnElement)}
            return row is not None and all(row[k] == v for k, v in literal.items())

        return riding_out(update, self.engine.url, f"sweep {self.name}: updating its row")

    def take_preparation(self, dead: str | None) -> bool:
        """Prepare in place of ``dead`` (a preparer that stopped), or re-prepare a ready sweep (dead=None)."""
        owner = SWEEPS.c.preparer == dead if dead is not None else SWEEPS.c.state == "ready"
        return self._update(owner, state="preparing", preparer=self.member)

    def publish(self, prepared: dict[str, Any]) -> None:
        self._update(SWEEPS.c.preparer == self.member, state="ready", prepared=json.dumps(prepared))

    def restart(self, spec: dict[str, Any], n_trials: int | None, timeout_s: float | None) -> None:
        """`sweeper run` (re)starting the sweep: its spec and budget, the timeout counted from now,
        and no stop request."""
        self._update(
            sa.true(), spec=json.dumps(spec), n_trials=n_trials, timeout_s=timeout_s, started_at=time.time(), stop=False
        )

    def request_stop(self) -> bool:
        return self._update(sa.true(), stop=True)

    # --- search spaces --------------------------------------------------------------------------

    def spaces(self) -> list[dict[str, Any]]:
        """The sweep's space versions, oldest first: [] while it has kept the space it started with."""

        def read(_: bool) -> list[dict[str, Any]]:
            with self.engine.connect() as db:
                rows = db.execute(sa.select(SPACES).where(SPACES.c.study == self.name).order_by(SPACES.c.version))
                return [{"version": r.version, "space": json.loads(r.space), "first_slot": r.first_slot} for r in rows]

        return riding_out(read, self.engine.url, f"sweep {self.name}: reading its spaces")

    def add_space(self, space: dict[str, Any], first_slot: int) -> int:
        """Record ``space`` as the sweep's next version, from ``first_slot`` on; its version."""
        version = len(self.spaces()) + 1
        with self.engine.begin() as db:
            db.execute(
                SPACES.insert().values(
                    study=self.name,
                    version=version,
                    space=json.dumps(space),
                    first_slot=first_slot,
                    created_at=time.time(),
                )
            )
        return version

    # --- claims --------------------------------------------------------------------------------

    def claim_batch(self, seen: Sweep, size: int) -> bool:
        """Claim batch ``seen.batches`` (slots ``seen.proposed`` .. +size) for this process to
        propose, holding the lock until it has enqueued them; False if another process was first."""
        return self._update(
            sa.and_(SWEEPS.c.batches == seen.batches, SWEEPS.c.proposing.is_(None)),
            batches=seen.batches + 1,
            proposed=seen.proposed + size,
            batch_start=seen.proposed,
            proposing=self.member,
        )

    def claim_slot(self, seen: Sweep) -> bool:
        """Claim slot ``seen.proposed`` (reproducible: false proposes one trial at a time), holding
        the lock until its trial exists."""
        return self._update(
            sa.and_(SWEEPS.c.proposed == seen.proposed, SWEEPS.c.proposing.is_(None)),
            proposed=seen.proposed + 1,
            batch_start=seen.proposed,
            proposing=self.member,
        )

    def release_slot(self) -> None:
        """Give back the slot claimed last (reproducible: false, when no trial was made for it)."""
        self._update(SWEEPS.c.proposing == self.member, proposed=SWEEPS.c.proposed - 1, proposing=None)

    def lock(self) -> bool:
        """The sweep's lock, held while trials are created or retried: no batch is claimed while
        a trial of the last one is between failed and retried."""
        return self._update(SWEEPS.c.proposing.is_(None), proposing=self.member)

    def take_lock(self, dead: str) -> bool:
        """The lock of a process that stopped while holding it (its work is then repaired)."""
        return self._update(SWEEPS.c.proposing == dead, proposing=self.member)

    def unlock(self) -> None:
        self._update(SWEEPS.c.proposing == self.member, proposing=None)

    # --- spending ------------------------------------------------------------------------------

    def spend(self, device_seconds: float) -> None:
        """Add a finished trial's device-seconds to the sweep's total (atomically: the database
        adds, so concurrent processes lose no update)."""
        if device_seconds <= 0:
            return
        add = (
            SPENT.update()
            .where(SPENT.c.study == self.name)
            .values(device_seconds=SPENT.c.device_seconds + device_seconds)
        )

        def spend(_: bool) -> None:
            with self.engine.begin() as db:
                if db.execute(add).rowcount == 1:
                    return
            try:  # the sweep's first spending: its row
                with self.engine.begin() as db:
                    db.execute(SPENT.insert().values(study=self.name, device_seconds=device_seconds))
            except IntegrityError:  # another process inserted it first: add to it
                with self.engine.begin() as db:
                    db.execute(add)

        # again after a cut: a commit the restart cut after it applied counts this trial twice (the
        # budget ends up to one trial early; no key tells an addition apart)
        riding_out(spend, self.engine.url, f"sweep {self.name}: adding spent device time")

    def device_seconds(self) -> float:
        def read(_: bool) -> float:
            with self.engine.connect() as db:
                spent = db.execute(sa.select(SPENT.c.device_seconds).where(SPENT.c.study == self.name)).scalar()
            return float(spent or 0.0)

        return riding_out(read, self.engine.url, f"sweep {self.name}: reading its spent device time")

    # --- members -------------------------------------------------------------------------------

    def join(self, role: str) -> None:
        now = time.time()
        host, pid, _ = self.member.split(":")
        row = {"study": self.name, "member": self.member, "host": host, "pid": int(pid), "role": role}

        def insert(cut: bool) -> None:
            try:
                with self.engine.begin() as db:
                    db.execute(MEMBERS.insert().values(**row, started_at=now, seen_at=now))
            except IntegrityError:
                if not cut:  # else the cut try's insert went through
                    raise

        riding_out(insert, self.engine.url, f"sweep {self.name}: joining it")

    def heartbeat(self) -> None:
        self._set_member(seen_at=time.time())

    def leave(self) -> None:
        self._set_member(left_at=time.time())

    def _set_member(self, **values: Any) -> None:
        """This process's members row updated (again after a restart of the server: the same)."""

        def update(_: bool) -> None:
            with self.engine.begin() as db:
                mine = (MEMBERS.c.study == self.name, MEMBERS.c.member == self.member)
                db.execute(MEMBERS.update().where(*mine).values(**values))

        riding_out(update, self.engine.url, f"sweep {self.name}: its member {self.member}")

    def members(self) -> list[dict[str, Any]]:
        def read(_: bool) -> list[dict[str, Any]]:
            with self.engine.connect() as db:
                query = sa.select(MEMBERS).where(MEMBERS.c.study == self.name).order_by(MEMBERS.c.started_at)
                return [dict(r) for r in db.execute(query).mappings().all()]

        return riding_out(read, self.engine.url, f"sweep {self.name}: reading its members")

    def alive(self, member: str | None) -> bool:
        """Whether ``member`` still renews its heartbeat (a process on this host: whether its pid lives)."""
        if member is None:
            return False
        row = next((m for m in self.members() if m["member"] == member), None)
        if row is None or row["left_at"] is not None:
            return False
        if row["host"] == host_name() and not pid_alive(row["pid"]):
            return False
        return time.time() - row["seen_at"] < self.grace_s


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def studies(url: str, shown: Any = str) -> list[str]:
    """The sweeps recorded in the database at ``url`` (``shown(url)`` in errors)."""
    from sweeper.errors import UserError

    try:
        engine = shared_engine(url)
    except Exception as exc:  # not a database URL; a driver missing
        raise UserError(f"--study {shown(url)}: {type(exc).__name__}: {exc}") from None
    try:
        if not sa.inspect(engine).has_table(SWEEPS.name):
            return []
        with engine.connect() as db:
            return list(db.execute(sa.select(SWEEPS.c.study)).scalars())
    except sa.exc.SQLAlchemyError as exc:
        raise UserError(f"--study {shown(url)}: cannot read it: {str(exc).splitlines()[0]}") from None
    finally:
        engine.dispose()


def find(url: str, name: str | None, shown: Any = str) -> str:
    """The sweep ``name`` in the database at ``url`` (None: its only sweep); a UserError naming
    the sweeps it holds otherwise."""
    from sweeper.errors import UserError

    names = studies(url, shown)
    if name is None and len(names) == 1:
        return names[0]
    if name is None or name not in names:
        raise UserError(
            f"{shown(url)} holds no sweep {repr(name) if name else ''}; it holds: "
            f"{', '.join(names) or 'none'}{'' if name else ' (name one with --name)'}"
        )
    return name
