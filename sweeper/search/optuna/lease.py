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
from datetime import datetime, timedelta

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.search.optuna.ledger import Ledger, host_name, pid_alive
from sweeper.search.optuna.study import OWNER


class Heartbeat:
    """Renews this process's leases until stopped."""

    def __init__(self, study: optuna.Study, ledger: Ledger, interval_s: float) -> None:
        self.study, self.ledger, self.interval_s = study, ledger, interval_s
        self.trial_ids: set[int] = set()  # the storage ids of the trials this process trains
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweeper-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def hold(self, trial_id: int) -> None:
        """Take the lease of a trial this process has just claimed."""
        storage = self.study._storage
        storage.set_trial_system_attr(trial_id, OWNER, self.ledger.member)
        storage.record_heartbeat(trial_id)
        self.trial_ids.add(trial_id)

    def release(self, trial_id: int) -> None:
        self.trial_ids.discard(trial_id)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for trial_id in list(self.trial_ids):
                    self.study._storage.record_heartbeat(trial_id)
                self.ledger.heartbeat()
            except Exception:  # a database hiccup: the next beat tries again (the lease has slack)
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=self.interval_s + 5)


def stale(study: optuna.Study, lease_s: float) -> list[FrozenTrial]:
    """RUNNING trials whose owner stopped renewing their lease (or, on this host, has exited)."""
    storage = study._storage
    expired = set(storage._get_stale_trial_ids(study._study_id))  # Optuna's own check, the DB's clock
    here = host_name()
    found = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(OWNER)
        if t._trial_id in expired:
            found.append(t)
        elif owner is None:  # claimed, then its process died before it took the lease
            started = t.datetime_start or datetime.now()
            if datetime.now() - started > timedelta(seconds=lease_s):
                found.append(t)
        else:
            host, pid, _ = owner.split(":")
            if host == here and not pid_alive(int(pid)):
                found.append(t)
    return found


def fail(study: optuna.Study, t: FrozenTrial) -> bool:
    """Mark a stale trial failed; False if it finished (or another process failed it) meanwhile."""
    try:
        return study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
