"""The coordinator's answers to faults (a mixin of coordinator.Coordinator): trials of
processes that stopped are failed and queued again with the same params, seed and batch (after
the lease runs out, or at once when the process is known dead); a trial out of memory is queued
again with train.accumulate doubled; the work of a process that died holding the ledger's lock
is finished; and the circuit breaker stops a sweep whose first trials all fail alike."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState, create_trial

from sweeper.search import faults
from sweeper.search.optuna import lease
from sweeper.search.optuna.ledger import Sweep
from sweeper.search.optuna.study import ACCUMULATE, ATTEMPT, BATCH, INFO, INTERRUPTED, RETRY_OF, SLOT, interrupted
from sweeper.search.trial_runs import close_trial_run
from sweeper.track.records import TrialRecord

# How often a process with nothing to train looks at the study again, and the shortest time
# between two looks for lost trials (s)
POLL_S = 0.5


class Recovery:
    """Needs the coordinator's spec, study, ledger, ctx, live, next_check, trained, stopped,
    records(), _batch_params() and _enqueue()."""

    spec: Any
    study: Any
    ledger: Any
    ctx: Any
    live: dict[int, Any]
    next_check: float
    trained: bool
    stopped: Exception | None

    def _recover(self) -> None:
        """Retry the trials of processes that stopped (every half heartbeat), and finish the
        work of a process that stopped while it held the ledger's lock."""
        if time.monotonic() < self.next_check:
            return
        self.next_check = time.monotonic() + max(POLL_S, self.spec.search.heartbeat_s / 2)
        sweep = self.ledger.read()
        holder = sweep.proposing
        if (
            holder is not None
            and holder != self.ledger.member
            and not self.ledger.alive(holder)
            and self.ledger.take_lock(holder)
        ):
            self._repair(self.ledger.read())
            self.ledger.unlock()
        mine = {live.trial._trial_id for live in self.live.values()}
        found = [t for t in lease.stale(self.study, self.spec.search.lease_s) if t._trial_id not in mine]
        if found:
            self._retry_lost([(t, _lost_reason(t)) for t in found])

    def _retry_lost(self, trials: list[tuple[FrozenTrial, str]]) -> None:
        """Fail trials whose process stopped and queue each again with the same params, seed and
        batch, under the ledger's lock (no batch is proposed between a failure and its retry)."""
        for _ in range(50):
            if self.ledger.lock():
                break
            time.sleep(0.1)
        else:
            return  # the lock stays busy: the next check tries again (another process may do it)
        for t, why in trials:
            storage = self.study._storage
            retry = t.user_attrs.get(ATTEMPT, 1) <= self.spec.search.max_retries
            try:
                if retry:
                    storage.set_trial_system_attr(t._trial_id, INTERRUPTED, why)
                else:  # lost too often (a trial that kills its machine?): it stays failed
                    why = f"{why}; not retried: lost {t.user_attrs.get(ATTEMPT, 1)} times (search.max_retries)"
                    storage.set_trial_user_attr(t._trial_id, INFO, {**t.user_attrs.get(INFO, {}), "reason": why})
            except UpdateFinishedTrialError:
                continue  # it finished meanwhile
            if not lease.fail(self.study, t):  # it finished (or another process failed it) meanwhile
                with contextlib.suppress(UpdateFinishedTrialError):
                    storage.set_trial_system_attr(t._trial_id, INTERRUPTED, False)
                continue
            if retry:
                self._enqueue_retry(t)
            # its process cannot close its run: FAILED (a lost machine is a failure, not a user's stop)
            close_trial_run(self.ctx.tracker, self._run_of(t), "interrupted", why, status="FAILED")
            self.ctx.observer.note(
                f"trial {t.number} was lost ({why})" + (": retried with the same parameters" if retry else "")
            )
        self.ledger.unlock()

    def _run_of(self, t: FrozenTrial) -> str | None:
        """The MLflow id of a lost trial's run (a placeholder while MLflow is away: the close
        waits in the journal with it); None if MLflow answers and has no run of that placeholder:
        the trial's process died before its sender created it, there is none to close."""
        tracker = self.ctx.tracker
        return tracker.found_ids([t.user_attrs.get(INFO, {}).get("mlflow_run_id")], self.ctx.sweep.parent_run_id)[0]

    def _enqueue_retry(self, t: FrozenTrial, **changes: Any) -> None:
        """Queue another attempt at trial ``t``'s slot (as ``study.enqueue_trial`` does): same
        params, seed and batch (and the same train.accumulate, unless ``changes`` sets another),
        and the sampler's attrs (NSGA-II's generation: the retry stands in for the attempt)."""
        attrs = t.user_attrs
        kept = {k: attrs[k] for k in (SLOT, BATCH, ACCUMULATE) if k in attrs}
        sampler = {k: v for k, v in t.system_attrs.items() if not k.startswith("sweeper_") and k != "fixed_params"}
        self.study.add_trial(
            create_trial(
                state=TrialState.WAITING,
                system_attrs={**sampler, "fixed_params": t.params},
                user_attrs={**kept, RETRY_OF: t.number, ATTEMPT: attrs.get(ATTEMPT, 1) + 1, **changes},
            )
        )

    def _retry_oom(self, live: Any, reason: str) -> str:
        """Queue a trial out of memory again, train.accumulate doubled, before it is told (its batch
        stays unfinished: no later batch is proposed without the retry). Returns its reason."""
        accumulate = faults.oom_retry(live.config.spec, live.trial.user_attrs.get(ATTEMPT, 1))
        if accumulate is None:
            return f"{reason}; not retried (search.max_retries, or train.accumulate is train.batch_size already)"
        # as stored (an optuna.Trial has no system attrs): the sampler's go to the retry
        self._enqueue_retry(self.study._storage.get_trial(live.trial._trial_id), **{ACCUMULATE: accumulate})
        self.ctx.observer.note(f"trial {live.trial.number} ran out of memory: retried, train.accumulate={accumulate}")
        return f"{reason}; retried with train.accumulate={accumulate}"

    def _check_breaker(self, finished: TrialRecord) -> None:
        """The circuit breaker: the first trials all failed alike and none trained, so the sweep
        stops (every process: the ledger's stop request) with that error once running trials end."""
        self.trained = self.trained or finished.state in ("complete", "pruned")
        if self.trained or finished.state != "failed" or self.stopped is not None:
            return
        sweep = self.ledger.read()
        cap = self._cap(sweep)
        self.stopped = faults.breaker(self.spec, self.records(), None if cap is None else cap - sweep.proposed)
        if self.stopped is not None:
            self.ledger.request_stop()
            self.ctx.observer.note("stopping: the first trials all failed with the same error")

    def _repair(self, sweep: Sweep) -> None:
        """Holding the lock of a process that stopped mid-way: every slot claimed so far gets a
        trial (its batch's proposal, or the retry of its lost attempt)."""
        trials = self.study.get_trials(deepcopy=False)
        filled = {t.user_attrs.get(SLOT, t.number) for t in trials if not interrupted(t)}
        for t in trials:
            slot = t.user_attrs.get(SLOT, t.number)
            if interrupted(t) and slot not in filled:
                self._enqueue_retry(t)
                filled.add(slot)
        missing = [s for s in range(sweep.batch_start, sweep.proposed) if s not in filled]
        if missing and not self.spec.search.reproducible:
            self.ledger.release_slot()  # the stopped process claimed a slot and made no trial for it
            self.ledger.lock()
        elif missing:
            proposed = self._batch_params(sweep.batch_start, sweep.proposed - sweep.batch_start)
            self._enqueue(
                [(proposed[slot - sweep.batch_start], {SLOT: slot, BATCH: sweep.batch_start}) for slot in missing]
            )


def _lost_reason(t: FrozenTrial) -> str:
    owner = t.system_attrs.get("sweeper_owner", "an unknown process")
    return f"its process {owner} stopped renewing its lease"
