"""Trial leases: a process owns each trial it trains, and proves it is alive by renewing a lease.

A lease is the trial's Optuna heartbeat row (the database's clock) plus the owner's member id
(host:pid:tag) in the trial's system attrs. ``Heartbeat`` renews the leases of this process's
trials, and its own member row, every ``search.heartbeat_s`` from a background thread (training
holds no lock it needs). ``stale`` finds the RUNNING trials whose owner has stopped: its lease is
older than ``search.lease_s``, or it ran on this host under a pid that no longer exists (a
restarted process need not wait for the lease to run out).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from sweeper.search.optuna import rdb
from sweeper.search.optuna.ledger import Ledger, host_name, pid_alive
from sweeper.search.optuna.study import OWNER

PROGRESS_S = 1.0  # how often the epochs done are written for display (s)


class Heartbeat:
    """Renews this process's leases until stopped."""

    def __init__(self, study: optuna.Study, ledger: Ledger, interval_s: float) -> None:
        self.study, self.ledger, self.interval_s = study, ledger, interval_s
        self.trial_ids: set[int] = set()  # the storage ids of the trials this process trains
        self.epochs: dict[int, dict[int, float]] = {}  # epochs done since the last beat, by trial id
        self._lock = threading.Lock()  # epochs: written by the coordinator, sent by the beat
        # held while the beat writes: a trial's end waits for it (release), else both could
        # insert the same epoch's row (a unique key) in transactions of their own
        self._writing = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweeper-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def hold(self, trial_id: int) -> None:
        """Take the lease of a trial this process has just made RUNNING (``study.ask``)."""
        rdb.set_system_attr(self.study, trial_id, OWNER, self.ledger.member)
        rdb.record_heartbeat(self.study, trial_id)
        self.trial_ids.add(trial_id)

    def created(self, trial_id: int) -> None:
        """Renew the lease of a trial this process created RUNNING, its owner (rdb.create)."""
        self.trial_ids.add(trial_id)

    def claim(self, trial_id: int, user_attrs: dict[str, Any] | None = None) -> bool:
        """Claim a WAITING trial and take its lease (and set ``user_attrs``), in one transaction;
        False when another process claimed it first."""
        if not rdb.claim(self.study, trial_id, {OWNER: self.ledger.member}, user_attrs or {}):
            return False
        self.trial_ids.add(trial_id)
        return True

    def progress(self, trial_id: int, epoch: int, value: float) -> None:
        """An epoch's objective, for display (`sweeper status`): written to the study by the
        heartbeat's thread within PROGRESS_S, with the other epochs done meanwhile, in one
        transaction a trial. The trial's end writes every epoch (rdb.finish)."""
        with self._lock:
            self.epochs.setdefault(trial_id, {})[epoch] = value

    def release(self, trial_id: int) -> None:
        """No more beats for this trial (it ends now: its end writes its epochs)."""
        with self._writing, self._lock:
            self.trial_ids.discard(trial_id)
            self.epochs.pop(trial_id, None)

    def _loop(self) -> None:
        due = time.monotonic() + self.interval_s  # the next lease renewal
        while not self._stop.wait(min(PROGRESS_S, self.interval_s)):
            renew = time.monotonic() >= due
            try:
                with self._writing:
                    with self._lock:
                        epochs, self.epochs = self.epochs, {}
                        trial_ids = list(self.trial_ids) if renew else list(epochs)
                    for trial_id in trial_ids:
                        rdb.beat(self.study, trial_id, epochs.get(trial_id, {}), renew=renew)
                if renew:
                    due = time.monotonic() + self.interval_s
                    self.ledger.heartbeat()
            except Exception:  # a database hiccup: the next beat tries again (the lease has slack)
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=self.interval_s + 5)


def stale(study: optuna.Study, lease_s: float) -> list[FrozenTrial]:
    """RUNNING trials whose owner stopped renewing their lease (or, on this host, has exited),
    found from their ids and owners (one light read), then read whole."""
    expired = rdb.expired(study)  # Optuna's own check, the database's clock
    here = host_name()
    found, unowned = set(), set()
    for trial_id, owner in rdb.running(study, OWNER):
        if trial_id in expired:
            found.add(trial_id)
        elif owner is None:  # claimed, then its process died before it took the lease?
            unowned.add(trial_id)
        else:
            host, pid, _ = owner.split(":")
            if host == here and not pid_alive(int(pid)):
                found.add(trial_id)
    out = []
    for t in rdb.whole(study, found | unowned):
        started = t.datetime_start or datetime.now()
        if t.state == OptunaState.RUNNING and (
            rdb.trial_id(t) in found or datetime.now() - started > timedelta(seconds=lease_s)
        ):
            out.append(t)
    return out


def fail(study: optuna.Study, t: FrozenTrial) -> bool:
    """Mark a stale trial failed; False if it finished (or another process failed it) meanwhile."""
    return rdb.fail(study, rdb.trial_id(t))
