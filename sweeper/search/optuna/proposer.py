"""What a process trains next: the budget left, the WAITING trials it claims (one, or with
fusing the waiting trials of one chunk of a batch), and, when none waits, new trials proposed:
a batch (reproducible mode, once every trial of the batches it knows has finished: all
earlier ones but the last search.staleness) or one trial
(``reproducible: false``). Budget, batches and slots are claimed in the ledger, so each is spent
exactly once whatever the number of processes."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from sweeper.search.optuna import rdb
from sweeper.search.optuna.batches import EarlierBatches
from sweeper.search.optuna.finished import LIVE_SAMPLERS
from sweeper.search.optuna.lease import Heartbeat
from sweeper.search.optuna.ledger import Ledger, Sweep
from sweeper.search.optuna.study import ATTEMPT, BATCH, INFO, OWNER, SLOT, UNFINISHED, seed
from sweeper.search.state import Role
from sweeper.spec import SweepSpec
from sweeper.track.mlflow import Tracker


class Budget:
    """The sweep's budget as the ledger holds it (``sweeper run`` sets it for every process)."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, role: Role) -> None:
        self.spec, self.study, self.role = spec, study, role

    def cap(self, sweep: Sweep) -> int | None:
        """The most trials the sweep runs (None: no cap, until the timeout)."""
        return self.spec.search.trial_cap(sweep.n_trials)

    def left(self, sweep: Sweep) -> int | None:
        """Slots still to claim (None: no cap, until the timeout); 0 when spent or timed out."""
        deadline = sweep.deadline()
        if (deadline is not None and time.time() >= deadline) or sweep.device_budget_spent():
            return 0
        cap = self.cap(sweep)
        return None if cap is None else max(0, cap - sweep.proposed)

    def over(self, sweep: Sweep) -> bool:
        """Nothing left for this process: the budget is spent and no trial waits (a worker); and
        no trial runs anywhere (`sweeper run`, which then summarises)."""
        if sweep.stop:
            return True
        if self.left(sweep) != 0 or sweep.proposing is not None:
            return False
        unfinished = self.study.get_trials(deepcopy=False, states=UNFINISHED)
        if sweep.device_budget_spent():  # waiting trials stay waiting (a resume with more budget runs them)
            unfinished = [t for t in unfinished if t.state != OptunaState.WAITING]
        elif any(t.state == OptunaState.WAITING for t in unfinished):
            return False
        return self.role == Role.WORKER or not unfinished


class Found(Enum):
    """What looking for trials to train found."""

    TRIALS = "trials"  # trials this process now holds (RUNNING, leased): start them
    AGAIN = "again"  # trials were made WAITING, or another process claimed first: look again at once
    NOTHING = "nothing"  # nothing to claim or propose now (the budget is spent, or a batch still runs)


@dataclass(frozen=True)
class Proposal:
    found: Found
    trials: list[optuna.Trial] = field(default_factory=list)  # Found.TRIALS: the trials to start


NOTHING, AGAIN = Proposal(Found.NOTHING), Proposal(Found.AGAIN)


class Proposer:
    """Claims WAITING trials for this process and proposes new ones."""

    def __init__(
        self,
        spec: SweepSpec,
        study: optuna.Study,
        ledger: Ledger,
        heartbeat: Heartbeat,
        budget: Budget,
        batches: EarlierBatches,
        tracker: Tracker,
        fuse: int,
    ) -> None:
        self.spec, self.study, self.ledger, self.heartbeat = spec, study, ledger, heartbeat
        self.budget, self.batches, self.tracker = budget, batches, tracker
        self.fuse = fuse  # trials per fused model (1: none fused)
        # trials this process created and has not claimed yet: claimed without reading the study
        # first (a claim is atomic: one another process took meanwhile is skipped)
        self.waiting_here: list[FrozenTrial] = []
        self.sampled: FrozenTrial | None = None  # reproducible: false: the next trial, before its slot's claim

    def next(self, sweep: Sweep) -> Proposal:
        """Trials to start: WAITING ones claimed, else new ones proposed; none once the device
        budget is spent."""
        if sweep.device_budget_spent():
            return NOTHING
        claimed = self.claim_waiting()
        return Proposal(Found.TRIALS, claimed) if claimed else self.propose(sweep)

    def claim_waiting(self) -> list[optuna.Trial]:
        """WAITING trials made RUNNING by this process (each one atomic update: one owner), leased:
        one trial, or with fusing the waiting trials of the first one's chunk."""
        claimed: list[optuna.Trial] = []
        mine = bool(self.waiting_here)
        waiting = self.waiting_here or sorted(rdb.waiting(self.study), key=lambda t: t.user_attrs.get(SLOT, t.number))
        tried = set()
        for t in waiting:
            if claimed and (self.fuse == 1 or self.chunk(t) != self.chunk(claimed[0])):
                continue
            tried.add(rdb.trial_id(t))
            # its seed and run, known from the start: a process recovering the trial (if this one
            # dies) records the seed and closes the run (created by the tracker's sender thread)
            info = {"seed": seed(self.spec, t), "mlflow_run_id": self.tracker.new_run_id()}
            if self.heartbeat.claim(rdb.trial_id(t), {INFO: info}):
                claimed.append(optuna.Trial(self.study, rdb.trial_id(t)))
        if mine:
            self.waiting_here = [t for t in waiting if rdb.trial_id(t) not in tried]
        return claimed

    def chunk(self, t: FrozenTrial | optuna.Trial) -> tuple[Any, ...]:
        """Which fused task a trial belongs to: its batch, its chunk of ``fuse`` slots in it, and
        its attempt (retries fuse with retries)."""
        attrs = t.user_attrs
        batch = attrs.get(BATCH)
        if batch is None:
            return ("alone", t.number)
        return batch, (attrs.get(SLOT, t.number) - batch) // self.fuse, attrs.get(ATTEMPT, 1)

    def propose(self, sweep: Sweep) -> Proposal:
        """Claim budget and create its trials: a new batch (reproducible), or one trial."""
        left = self.budget.left(sweep)
        if left == 0 or sweep.proposing is not None:
            return NOTHING
        if not self.spec.search.reproducible:
            # sampled before the slot's claim, which holds the sweep's lock until the trial exists,
            # and kept until a slot is claimed: processes that lose a claim sample nothing again
            if self.sampled is None and self.spec.search.sampler not in LIVE_SAMPLERS:
                assert self.batches.finished is not None, "the coordinator makes the view"
                self.sampled = self.batches.finished.params()
            if not self.ledger.claim_slot(sweep):
                return AGAIN  # another process claimed that slot: look again
            return self._new_trial(sweep.proposed)
        known = self.batches.known(sweep.proposed)
        if any((-1 if batch is None else batch) < known for _, batch in rdb.unfinished(self.study, BATCH)):
            return NOTHING  # a batch the next one must see the results of is not finished
        size = self.spec.search.batch_size if left is None else min(left, self.spec.search.batch_size)
        if not self.ledger.claim_batch(sweep, size):
            return AGAIN
        proposed = self.batches.params(sweep.proposed, size)
        self.enqueue(
            [(trial, {SLOT: slot, BATCH: sweep.proposed}) for slot, trial in enumerate(proposed, start=sweep.proposed)]
        )
        self.ledger.unlock()  # only once all are enqueued: a process that dies before is repaired
        return AGAIN

    def _new_trial(self, slot: int) -> Proposal:
        """reproducible: false: the trial of ``slot`` (whose claim holds the ledger's lock): an
        LR warm start's, enqueued, then claimed like any; else the sampled one, created leased
        to this process (finished.py); else (LIVE_SAMPLERS) asked of the live study."""
        if slot < len(self.batches.enqueue):  # an LR warm-start trial: enqueued, then claimed like any
            self.study.enqueue_trial(self.batches.enqueue[slot], user_attrs={SLOT: slot})
            self.ledger.unlock()
            return AGAIN
        if self.sampled is not None:  # created claimed: no other process takes it before this one
            template, self.sampled = self.sampled, None
            return Proposal(Found.TRIALS, [self._created(template, slot)])
        with warnings.catch_warnings():  # Optuna warns that heartbeats belong in study.optimize
            warnings.simplefilter("ignore")
            trial = self.study.ask()
        if SLOT in trial.user_attrs:  # it popped a trial that was waiting (a retry): the slot goes back
            self.ledger.release_slot()
        else:
            trial.set_user_attr(SLOT, slot)
            self.ledger.unlock()
        self.heartbeat.hold(rdb.trial_id(trial))
        return Proposal(Found.TRIALS, [trial])

    def _created(self, template: FrozenTrial, slot: int) -> optuna.Trial:
        """The trial of ``slot`` made from ``template``, RUNNING and leased to this process, in
        one transaction; the sweep's lock released."""
        new = optuna.trial.create_trial(
            state=OptunaState.RUNNING,
            params=template.params,
            distributions=template.distributions,
            user_attrs={SLOT: slot},
            system_attrs={**_sampler_attrs(template), OWNER: self.ledger.member},
        )
        # as a claim records them: a process recovering the trial records the seed and closes the run
        new.user_attrs[INFO] = {"seed": seed(self.spec, new), "mlflow_run_id": self.tracker.new_run_id()}
        (made,) = rdb.create(self.study, [new])
        self.ledger.unlock()
        self.heartbeat.created(rdb.trial_id(made))
        return optuna.Trial(self.study, rdb.trial_id(made))

    def enqueue(self, proposed: list[tuple[FrozenTrial, dict[str, Any]]]) -> None:
        """Proposed trials (with their user attrs), WAITING, in one transaction, with their params
        already (``enqueue_trial`` makes one transaction a trial and leaves each param to be
        written, one transaction each, when the trial is claimed; its "fixed_params" system attr
        is not needed: a trial's suggest returns a param it holds)."""
        self.waiting_here += rdb.create(
            self.study,
            [
                optuna.trial.create_trial(
                    state=OptunaState.WAITING,
                    params=p.params,
                    distributions=p.distributions,
                    user_attrs={**p.user_attrs, **attrs},  # a promotion's (batches.py), and its slot
                    system_attrs=_sampler_attrs(p),
                )
                for p, attrs in proposed
            ],
        )


def _sampler_attrs(proposed: FrozenTrial) -> dict[str, Any]:
    """The system attrs a proposed trial keeps (NSGA-II's generation, CMA-ES's); not its
    "fixed_params", which a trial holding its params does not need (its suggest returns them)."""
    return {k: v for k, v in proposed.system_attrs.items() if k != "fixed_params"}
