"""The answers to faults: trials of processes that stopped are failed and queued again with the
same params, seed and batch (after the lease runs out, or at once when the process is known
dead); a trial out of memory is queued again with train.accumulate doubled; the work of a process
that died holding the ledger's lock is finished (``Recovery``); and the circuit breaker stops a
sweep whose first trials all fail alike (``Breaker``)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, create_trial
from optuna.trial import TrialState as OptunaState

from sweeper.search import faults
from sweeper.search.backend import SearchContext
from sweeper.search.optuna import lease, rdb
from sweeper.search.optuna.batches import EarlierBatches
from sweeper.search.optuna.ledger import Ledger, Sweep
from sweeper.search.optuna.proposer import Budget, Proposer
from sweeper.search.optuna.study import (
    ACCUMULATE,
    ATTEMPT,
    BATCH,
    INFO,
    INTERRUPTED,
    OWNER,
    PAUSED_AT,
    PREEMPTIONS,
    PROMOTED_FROM,
    RESUME,
    RETRY_OF,
    SEED_SLOT,
    SLOT,
    earlier,
    interrupted,
    records,
)
from sweeper.search.trial_runs import close_trial_run
from sweeper.spec import SweepSpec
from sweeper.states import TrialState
from sweeper.track.records import TrialRecord
from sweeper.trial.build import TrialConfig

# How often a process with nothing to train looks at the study again, and the shortest time
# between two looks for lost trials (s)
POLL_S = 0.5


class Recovery:
    """Retries lost trials and trials out of memory; repairs what a process holding the ledger's
    lock left undone."""

    def __init__(
        self,
        spec: SweepSpec,
        study: optuna.Study,
        ledger: Ledger,
        ctx: SearchContext,
        proposer: Proposer,
        batches: EarlierBatches,
    ) -> None:
        self.spec, self.study, self.ledger, self.ctx = spec, study, ledger, ctx
        self.proposer, self.batches = proposer, batches
        self.next_check = 0.0  # monotonic time to look for stale trials next

    def recover(self, mine: set[int]) -> None:
        """Retry the trials of processes that stopped (every half heartbeat), and finish the
        work of a process that stopped while it held the ledger's lock. ``mine``: the storage ids
        of the trials this process trains (never stale)."""
        if time.monotonic() < self.next_check:
            return
        self.next_check = time.monotonic() + max(POLL_S, self.spec.search.heartbeat_s / 2)
        sweep = self.ledger.read()
        assert sweep is not None
        holder = sweep.proposing
        if (
            holder is not None
            and holder != self.ledger.member
            and not self.ledger.alive(holder)
            and self.ledger.take_lock(holder)
        ):
            repaired = self.ledger.read()
            assert repaired is not None
            self._repair(repaired)
            self.ledger.unlock()
        found = [t for t in lease.stale(self.study, self.spec.search.lease_s) if rdb.trial_id(t) not in mine]
        if found:
            self.retry_lost([(t, _lost_reason(t)) for t in found])

    def retry_lost(self, trials: list[tuple[FrozenTrial, str]]) -> None:
        """Fail trials whose process stopped and queue each again with the same params, seed and
        batch, under the ledger's lock (no batch is proposed between a failure and its retry)."""
        for _ in range(50):
            if self.ledger.lock():
                break
            time.sleep(0.1)
        else:
            return  # the lock stays busy: the next check tries again (another process may do it)
        for t, why in trials:
            # attempts lost (preempted ones are not): at most search.max_retries retried
            lost = t.user_attrs.get(ATTEMPT, 1) - t.user_attrs.get(PREEMPTIONS, 0)
            retry = lost <= self.spec.search.max_retries
            try:
                if retry:
                    rdb.set_system_attr(self.study, rdb.trial_id(t), INTERRUPTED, why)
                else:  # lost too often (a trial that kills its machine?): it stays failed
                    why = f"{why}; not retried: lost {lost} times (search.max_retries)"
                    rdb.set_user_attr(self.study, rdb.trial_id(t), INFO, {**t.user_attrs.get(INFO, {}), "reason": why})
            except UpdateFinishedTrialError:
                continue  # it finished meanwhile
            if not lease.fail(self.study, t):  # it finished (or another process failed it) meanwhile
                with contextlib.suppress(UpdateFinishedTrialError):
                    rdb.set_system_attr(self.study, rdb.trial_id(t), INTERRUPTED, False)
                continue
            if retry:
                self._enqueue_retry(t)
            # its process cannot close its run: FAILED (a lost machine is a failure, not a user's stop)
            close_trial_run(self.ctx.tracker, self._run_of(t), TrialState.INTERRUPTED, why, status="FAILED")
            self.ctx.observer.note(
                f"trial {t.number} was lost ({why})" + (": retried with the same parameters" if retry else "")
            )
        self.ledger.unlock()

    def retry_oom(self, config: TrialConfig, trial: optuna.Trial, reason: str) -> str:
        """Queue a trial out of memory again, train.accumulate doubled, before it is told (its batch
        stays unfinished: no later batch is proposed without the retry). Returns its reason."""
        accumulate = faults.oom_retry(config.spec, trial.user_attrs.get(ATTEMPT, 1))
        if accumulate is None:
            return f"{reason}; not retried (search.max_retries, or train.accumulate is train.batch_size already)"
        # as stored (an optuna.Trial has no system attrs): the sampler's go to the retry
        self._enqueue_retry(rdb.stored(self.study, rdb.trial_id(trial)), **{ACCUMULATE: accumulate})
        self.ctx.observer.note(f"trial {trial.number} ran out of memory: retried, train.accumulate={accumulate}")
        return f"{reason}; retried with train.accumulate={accumulate}"

    def _run_of(self, t: FrozenTrial) -> str | None:
        """The MLflow id of a lost trial's run (a placeholder while MLflow is away: the close
        waits in the journal with it); None if MLflow answers and has no run of that placeholder:
        the trial's process died before its sender created it, there is none to close."""
        tracker = self.ctx.tracker
        found: str | None = tracker.found_ids(
            [t.user_attrs.get(INFO, {}).get("mlflow_run_id")], self.ctx.sweep.parent_run_id
        )[0]
        return found

    def retry_preempted(self, t: FrozenTrial, why: str, resume: str | None, history: list[dict[str, Any]]) -> None:
        """A trial stopped after an epoch because a sweep of higher priority wanted its device:
        failed as interrupted and queued again at once, to continue from ``resume`` (its state
        after that epoch; None: from the start), not counted against search.max_retries; its
        record keeps the epochs it trained (``history``)."""
        while not self.ledger.lock():  # no batch is proposed between the failure and the retry
            time.sleep(0.1)
        try:
            rdb.set_system_attr(self.study, rdb.trial_id(t), INTERRUPTED, why)
            rdb.set_user_attr(self.study, rdb.trial_id(t), INFO, {**t.user_attrs.get(INFO, {}), "history": history})
            if lease.fail(self.study, t):
                more = {PREEMPTIONS: t.user_attrs.get(PREEMPTIONS, 0) + 1, **({RESUME: resume} if resume else {})}
                self._enqueue_retry(t, **more)
                close_trial_run(self.ctx.tracker, self._run_of(t), TrialState.INTERRUPTED, why, status="KILLED")
                self.ctx.observer.note(f"trial {t.number} {why}: retried from there")
        finally:
            self.ledger.unlock()

    def _enqueue_retry(self, t: FrozenTrial, **changes: Any) -> None:
        """Queue another attempt at trial ``t``'s slot (as ``study.enqueue_trial`` does): same
        params, seed and batch (and the same train.accumulate, unless ``changes`` sets another),
        and the sampler's attrs (NSGA-II's generation: the retry stands in for the attempt)."""
        attrs = t.user_attrs
        carried = (
            SLOT,
            BATCH,
            ACCUMULATE,
            PREEMPTIONS,
            SEED_SLOT,
            PROMOTED_FROM,
            PAUSED_AT,
            RESUME,
        )  # a promotion's too
        kept = {k: attrs[k] for k in carried if k in attrs}
        sampler = {k: v for k, v in t.system_attrs.items() if not k.startswith("sweeper_") and k != "fixed_params"}
        self.study.add_trial(
            create_trial(
                state=OptunaState.WAITING,
                system_attrs={**sampler, "fixed_params": t.params},
                user_attrs={**kept, RETRY_OF: t.number, ATTEMPT: attrs.get(ATTEMPT, 1) + 1, **changes},
            )
        )

    def _repair(self, sweep: Sweep) -> None:
        """Holding the lock of a process that stopped mid-way: every slot claimed so far gets a
        trial (its batch's proposal, or the retry of its lost attempt)."""
        trials = [t for t in self.study.get_trials(deepcopy=False) if not earlier(t)]  # observations hold no slot
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
            proposed = self.batches.params(sweep.batch_start, sweep.proposed - sweep.batch_start)
            self.proposer.enqueue(
                [(proposed[slot - sweep.batch_start], {SLOT: slot, BATCH: sweep.batch_start}) for slot in missing]
            )


class Breaker:
    """The circuit breaker: the first trials all failed alike and none trained, so the sweep
    stops (every process: the ledger's stop request) with that error once running trials end."""

    def __init__(
        self, spec: SweepSpec, study: optuna.Study, ledger: Ledger, budget: Budget, ctx: SearchContext
    ) -> None:
        self.spec, self.study, self.ledger, self.budget, self.ctx = spec, study, ledger, budget, ctx
        # the breaker is off once a trial has trained
        self.trained = any(r.state in (TrialState.COMPLETE, TrialState.PRUNED) for r in records(study))
        self.stopped: Exception | None = None  # the breaker's error, raised once the trials end

    def check(self, finished: TrialRecord) -> None:
        self.trained = self.trained or finished.state in (TrialState.COMPLETE, TrialState.PRUNED)
        if self.trained or finished.state != TrialState.FAILED or self.stopped is not None:
            return
        sweep = self.ledger.read()
        assert sweep is not None
        cap = self.budget.cap(sweep)
        self.stopped = faults.breaker(self.spec, records(self.study), None if cap is None else cap - sweep.proposed)
        if self.stopped is not None:
            self.ledger.request_stop()
            self.ctx.observer.note("stopping: the first trials all failed with the same error")


def _lost_reason(t: FrozenTrial) -> str:
    owner = t.system_attrs.get(OWNER, "an unknown process")
    return f"its process {owner} stopped renewing its lease"
