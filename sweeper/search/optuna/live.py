"""The trials this process trains, from their start to their end: their configs and MLflow runs,
the pruner's answers after each epoch (asked of the trial's shadow: in a view of the earlier
batches, or with ``reproducible: false`` of the finished trials), their epochs recorded, and their end told to the
study in one transaction, logged, published, and handed to recovery (a lost worker, out of
memory) and to the circuit breaker."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError

from sweeper.search import checkpoints
from sweeper.search.backend import SearchContext
from sweeper.search.optuna import rdb
from sweeper.search.optuna.batches import CHECKED_RHO, EarlierBatches
from sweeper.search.optuna.lease import Heartbeat
from sweeper.search.optuna.recovery import Breaker, Recovery
from sweeper.search.optuna.study import (
    ACCUMULATE,
    BATCH,
    INFO,
    OPTUNA_STATES,
    PAUSED_AT,
    PROMOTED_FROM,
    RESUME,
    RETRY_OF,
    SLOT,
    record,
    records,
    seed,
)
from sweeper.search.trial_runs import close_trial_run, log_sweep_dataset, open_trial_run
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import FailureKind, TrialState
from sweeper.track.records import TrialEvent, objective_values
from sweeper.trial import fused
from sweeper.trial.build import TrialConfig
from sweeper.trial.checkpoint import trial_path
from sweeper.trial.execute import Outcome
from sweeper.trial.seeding import sampler_seed, threads_per_trial


@dataclass
class LiveTrial:
    trial: optuna.Trial  # in the real study
    config: TrialConfig
    run_id: str | None
    shadow: optuna.Trial | None  # the same trial in the view the pruner decides in (batches.py, finished.py)
    lost: bool = False  # another process failed it: this process's lease had run out
    epochs: dict[int, float] = field(default_factory=dict)  # the objective at each epoch, for its end
    carried: dict[str, Any] = field(default_factory=dict)  # the shadow's system attrs written to the trial
    round_epochs: int | None = None  # a trial of the family round: the epoch it ends at
    epoch_began: float = field(default_factory=time.time)  # when its current epoch began (time.time())
    clock_stopped: bool = False  # stopped by search.budget's clock, not by the pruner
    promoted_from: int | None = None  # the paused trial it continues (the family round's, or a pruner's)
    promoted_at: int | None = None  # the epoch a pruner paused that trial at (None: the family round's)
    batch: int | None = None  # reproducible mode: the batch that proposed it

    @property
    def trial_id(self) -> int:
        return rdb.trial_id(self.trial)


class LiveTrials:
    """The trials this process runs, by number."""

    def __init__(
        self,
        spec: SweepSpec,
        study: optuna.Study,
        heartbeat: Heartbeat,
        ctx: SearchContext,
        batches: EarlierBatches,
        recovery: Recovery,
        breaker: Breaker,
        fuse: int,
    ) -> None:
        self.spec, self.study, self.heartbeat, self.ctx = spec, study, heartbeat, ctx
        self.batches, self.recovery, self.breaker = batches, recovery, breaker
        self.fuse = fuse  # trials per fused model (1: none fused)
        self.live: dict[int, LiveTrial] = {}
        self.threads = threads_per_trial(spec)
        done = records(study)
        kept = checkpoints.kept(spec, done)
        self.kept = [r for r in done if r.number in kept]  # whose checkpoints are kept so far
        self.noted: set[str] = set()  # fallback reasons already said
        self.noted_rungs: set[int] = set()  # epochs search.pruner.check_rungs said it spares
        # search.budget's clock: no epoch may end past it (time.time(); the coordinator sets it
        # from the ledger's deadline); None: epochs are never stopped by the clock
        self.clock_end: float | None = None

    def __bool__(self) -> bool:
        return bool(self.live)

    def ids(self) -> set[int]:
        """The storage ids of the trials this process runs."""
        return {live.trial_id for live in self.live.values()}

    # --- start ---------------------------------------------------------------------------------

    def start(self, trials: list[optuna.Trial]) -> list[list[TrialConfig]]:
        """Claimed trials started: their configs and runs; returns their tasks (one, or fused
        tasks: fused.plan), to submit in order."""
        configs = [self._config(t) for t in trials]
        tasks, notes = fused.plan(configs, self.fuse) if len(configs) > 1 else ([configs], [])
        for note in notes:
            self.ctx.observer.note(note)
        for config in configs:
            self._open(self.live[config.number].trial, config)
        return tasks

    def _config(self, trial: optuna.Trial) -> TrialConfig:
        values = sp.suggest(self.spec.search.space, trial)
        batch = trial.user_attrs.get(BATCH)
        shadow: optuna.Trial | None
        if not self.spec.search.reproducible:
            assert self.batches.finished is not None, "the coordinator makes the view"
            shadow = self.batches.finished.shadow()
        else:
            shadow = self.batches.shadow(batch) if batch is not None else None
        resized = {"train.accumulate": trial.user_attrs[ACCUMULATE]} if ACCUMULATE in trial.user_attrs else {}
        # a preempted attempt's state, where this machine can read it (else: from the start, the same result)
        resume = trial.user_attrs.get(RESUME)
        round_epochs = self._round_epochs(trial)
        config = TrialConfig(
            trial.number,
            seed(self.spec, trial),
            values,
            self.spec.with_values({**values, **resized}),
            self.threads,
            str(trial_path(self.ctx.out_dir, trial.number)),
            resume=resume if resume is not None and Path(resume).exists() else None,
            pause_epoch=round_epochs,  # its state kept there: promoted, it continues from it
            # search.pruner.promote: stopped by the pruner, it pauses (promotions are proposed with batches)
            pause_on_prune=self.spec.search.pruner.promote and batch is not None and round_epochs is None,
        )
        live = LiveTrial(trial, config, None, shadow, round_epochs=round_epochs)
        live.promoted_from = trial.user_attrs.get(PROMOTED_FROM)
        live.promoted_at = trial.user_attrs.get(PAUSED_AT)
        live.batch = batch
        self.live[trial.number] = live
        return config

    def _open(self, trial: optuna.Trial, config: TrialConfig) -> None:
        """The trial's MLflow run, its start recorded."""
        batch = trial.user_attrs.get(BATCH)
        sampled = sampler_seed(self.spec.seed, batch) if batch is not None else None
        retry = {"retry_of": str(trial.user_attrs[RETRY_OF])} if RETRY_OF in trial.user_attrs else {}
        planned = trial.user_attrs.get(INFO, {}).get("mlflow_run_id")  # set by its claim
        run_id = open_trial_run(self.ctx.tracker, config, self.ctx.sweep, sampled, tags=retry, run_id=planned)
        self.live[trial.number].run_id = run_id
        if run_id != planned:  # created at once (or a trial of study.ask): a process recovering it closes this run
            self._guard(trial.number, lambda: trial.set_user_attr(INFO, {"seed": config.seed, "mlflow_run_id": run_id}))
        self.ctx.observer.event(TrialEvent.start(config.number, config.params))

    def _guard(self, number: int, write: Callable[[], object]) -> None:
        """A write to this process's trial; if another process has failed it meanwhile (this
        process's lease ran out), the trial is lost here and stops at its next epoch."""
        try:
            write()
        except UpdateFinishedTrialError:
            self.live[number].lost = True

    # --- epochs --------------------------------------------------------------------------------

    def decide(self, number: int, epoch: int, metrics: dict[str, float]) -> bool:
        """True if the pruner stops this trial after this epoch. Reproducible mode asks the
        in-memory shadow study only, so a waiting worker gets its answer at once."""
        live = self.live[number]
        value = metrics[self.spec.objective.metric]
        now = time.time()
        epoch_s, live.epoch_began = now - live.epoch_began, now
        if self.clock_end is not None and epoch < self.spec.train.epochs and now + epoch_s > self.clock_end:
            live.clock_stopped = True  # its next epoch would end past the budget's clock
        ends_round = live.round_epochs is not None and epoch >= live.round_epochs
        if ends_round or live.clock_stopped:  # the family round's trials end here, and the clock's
            if live.shadow is None:
                self._guard(number, lambda: live.trial.report(value, epoch))
                live.epochs[epoch] = value
            else:
                live.shadow.report(value, epoch)
            return True
        if len(self.spec.goals) > 1:  # no pruner compares several objectives: each trial runs to its end
            if live.shadow is None:
                live.epochs[epoch] = value
            return live.lost
        if live.shadow is None:  # the live study decides: it must hold this epoch first
            self._guard(number, lambda: live.trial.report(value, epoch))
            live.epochs[epoch] = value
            return live.lost or live.trial.should_prune()
        live.shadow.report(value, epoch)
        if live.batch is None:  # reproducible: false: against every trial finished so far
            assert self.batches.finished is not None
            self.batches.finished.before_decision(live.shadow)
        return live.lost or (live.shadow.should_prune() and not self._spared(live, epoch))

    def _spared(self, live: LiveTrial, epoch: int) -> bool:
        """True if search.pruner.check_rungs overrules the pruner's cut (said once per epoch)."""
        if live.batch is None:  # reproducible mode's (free mode has no rung checks)
            return False
        rho = self.batches.spared(live.batch, epoch)
        if rho is None:
            return False
        if not math.isnan(rho) and epoch not in self.noted_rungs:
            self.noted_rungs.add(epoch)
            k = self.spec.search.pruner.check_rungs
            self.ctx.observer.note(
                f"search.pruner.check_rungs: epoch {epoch}'s values rank the first {k} complete trials unlike "
                f"their final ones (Spearman {rho:.2f} < {CHECKED_RHO}): no trial is stopped there"
            )
        return True

    def _round_epochs(self, trial: optuna.Trial) -> int | None:
        """The epoch a trial of the family round (the sweep's first slots) ends at; None for others."""
        round_ = self.spec.search.family_round
        slot = trial.user_attrs.get(SLOT)
        if round_ is None or slot is None or not round_.holds(slot):
            return None
        # a round at the run's full length stops nothing: each family runs whole
        return round_.epochs if round_.epochs < self.spec.train.epochs else None

    def record(self, number: int, epoch: int, metrics: dict[str, float]) -> None:
        """The slow part of an epoch (storage, MLflow, display), done after the worker has its answer."""
        live = self.live[number]
        self.ctx.tracker.log_metrics(live.run_id, epoch, metrics)
        self.ctx.observer.event(TrialEvent.epoch_end(number, epoch, metrics))
        if live.shadow is None or live.lost:
            return
        # the study gets it with the trial's end (and, for `sweeper status`, its next heartbeat):
        # no decision reads a running trial's epochs from the study in this mode
        live.epochs[epoch] = metrics[self.spec.objective.metric]
        self.heartbeat.progress(live.trial_id, epoch, live.epochs[epoch])
        # pruners (ASHA) keep per-trial state in system attrs: carry new values to the real trial
        for key, val in rdb.system_attrs(live.shadow).items():
            if key not in live.carried or live.carried[key] != val:
                live.carried[key] = val
                self._guard(number, functools.partial(rdb.set_system_attr, self.study, live.trial_id, key, val))

    # --- end -----------------------------------------------------------------------------------

    def finish(self, outcome: Outcome) -> None:
        live = self.live[outcome.number]
        if outcome.state == TrialState.INTERRUPTED:  # its worker process died, or it was preempted: retried
            self._retry(live, outcome)
            return
        reason, values = self._ending(live, outcome)
        self._carried(live, outcome)
        live.run_id = self.ctx.tracker.created(live.run_id)  # its MLflow id, if the sender made it already
        info = {
            "seed": live.config.seed,
            "reason": reason,
            "mlflow_run_id": live.run_id,
            "history": outcome.history,
            **outcome.info,
            **({"failure": outcome.failure.value} if outcome.failure is not None else {}),
        }
        if self._paused(live, outcome):  # a later batch may promote it (batches.py: promotions)
            info["paused_at"] = len(outcome.history)
        if values is not None:
            info["values"] = dict(zip([g.metric for g in self.spec.goals], values))
            info["value"] = info["values"][self.spec.objective.metric]  # the primary objective's (the table's value)
        frozen = None
        self.heartbeat.release(live.trial_id)  # first: no beat writes its epochs meanwhile
        if not live.lost:
            try:  # its epochs, info, state and value: one transaction
                frozen = rdb.finish(
                    self.study, live.trial_id, OPTUNA_STATES[outcome.state], values, live.epochs, {INFO: info}
                )
            except UpdateFinishedTrialError:
                live.lost = True
        self.live.pop(outcome.number)
        if frozen is None:  # another process failed it and retries it: this attempt is void
            reason = "its lease ran out while it trained; another process retried it"
            close_trial_run(self.ctx.tracker, live.run_id, TrialState.INTERRUPTED, reason)
            return
        self._publish(live, outcome, reason, frozen)

    def _carried(self, live: LiveTrial, outcome: Outcome) -> None:
        """The epochs a resumed trial (promoted, or preempted and retried) carried on from the
        state it continued, added to its MLflow run and its study record: both hold every epoch."""
        if live.config.resume is None:
            return
        first = min(live.epochs, default=len(outcome.history) + 1)  # the first epoch trained here
        for epoch, metrics in enumerate(outcome.history[: first - 1], start=1):
            live.epochs[epoch] = metrics[self.spec.objective.metric]
            self.ctx.tracker.log_metrics(live.run_id, epoch, metrics)

    def _retry(self, live: LiveTrial, outcome: Outcome) -> None:
        """An interrupted trial (its worker died, or it was preempted) goes back to be trained again."""
        self.heartbeat.release(live.trial_id)
        stored = rdb.stored(self.study, live.trial_id)
        if outcome.failure == FailureKind.PREEMPTED:
            why, resume = outcome.reason or "preempted", outcome.info.get("resume")
            self.recovery.retry_preempted(stored, why, resume, outcome.history)
        else:
            self.recovery.retry_lost([(stored, outcome.reason or "")])
        self.live.pop(outcome.number)

    def _ending(self, live: LiveTrial, outcome: Outcome) -> tuple[str | None, list[float] | None]:
        """The trial's reason (an out-of-memory one retried, a pruned one with the pruner's
        figure) and its objective values (None unless complete); a complete trial whose
        footprint could not be measured becomes failed."""
        metric, reason = self.spec.objective.metric, outcome.reason
        fallback = outcome.info.get("fuse_fallback")
        if fallback and fallback not in self.noted:
            self.noted.add(fallback)
            self.ctx.observer.note(
                f"a fused task trained its trials one at a time (trial {outcome.number} among them): {fallback}"
            )
        if outcome.state == TrialState.FAILED and outcome.failure == FailureKind.OUT_OF_MEMORY and not live.lost:
            reason = self.recovery.retry_oom(live.config, live.trial, reason or FailureKind.OUT_OF_MEMORY.value)
        if outcome.state == TrialState.PRUNED and live.clock_stopped:
            reason = (
                f"search.budget's clock: epoch {len(outcome.history) + 1} would end past it "
                f"({metric}={outcome.history[-1][metric]:.4g})"
            )
        elif outcome.state == TrialState.PRUNED and live.round_epochs is not None:
            reason = (
                f"family round: {live.config.params.get('model.plugin')} stopped at epoch {len(outcome.history)} "
                f"of {self.spec.train.epochs} ({metric}={outcome.history[-1][metric]:.4g})"
            )
        elif outcome.state == TrialState.PRUNED:
            reason = (
                f"{reason} by the {self.spec.search.pruner.type} pruner ({metric}={outcome.history[-1][metric]:.4g})"
            )
        if live.promoted_from is not None:
            resumed = "resumed from its state" if live.config.resume else "its state unreadable here: trained again"
            where = "of the family round" if live.promoted_at is None else f"paused at epoch {live.promoted_at}"
            promoted = f"promoted from trial {live.promoted_from} {where} ({resumed})"
            reason = f"{reason}; {promoted}" if reason else promoted
        complete = outcome.state == TrialState.COMPLETE
        values = objective_values(self.spec, outcome.history, outcome.info) if complete else None
        if complete and values is None:  # a footprint the trial could not measure
            outcome.state = TrialState.FAILED
            reason = f"objectives not measured: {', '.join(g.metric for g in self.spec.goals)}"
        return reason, values

    def _paused(self, live: LiveTrial, outcome: Outcome) -> bool:
        """True if the pruner stopped this trial and search.pruner.promote keeps it paused
        (whether or not its state could be saved: a promotion without it trains again)."""
        stopped_by_pruner = outcome.state == TrialState.PRUNED and not live.clock_stopped and not live.lost
        return stopped_by_pruner and live.config.pause_on_prune

    def _publish(self, live: LiveTrial, outcome: Outcome, reason: str | None, frozen: Any) -> None:
        """A stored trial's end, to MLflow, the breaker, its checkpoint's place and the observer."""
        close_trial_run(self.ctx.tracker, live.run_id, outcome.state, reason, outcome.error, outcome.info)
        log_sweep_dataset(self.ctx.tracker, self.spec, self.ctx.sweep, outcome.info)
        finished = record(frozen)
        self.breaker.check(finished)
        if outcome.state == TrialState.COMPLETE:
            checkpoints.publish(self.spec, self.ctx.tracker, finished, self.ctx.out_dir)
            # free the disk as the sweep goes, not only at its end
            self.kept = checkpoints.keep_better(self.spec, self.kept, finished, self.ctx.out_dir)
        self.ctx.observer.event(TrialEvent.end(finished))
