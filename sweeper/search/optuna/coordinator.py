"""The Optuna coordinator: one per process serving the sweep. It claims trials, answers its
workers' pruning questions, tells results and logs them; workers only train.

Many processes (on many machines) may serve one study: each trial is claimed by exactly one
(an atomic WAITING -> RUNNING update) and leased to it (lease.py); the budget is claimed in the
ledger (ledger.py), so it is spent exactly once whatever the number of processes.

Reproducible mode (default): trials are proposed in batches of ``search.batch_size``. Batch b
(named by its first slot) is proposed, once, by whichever process first claims it in the
ledger, from the results of the trials of earlier batches only, by a sampler seeded from the
sweep's "sampler" stream at b; each trial is pruned against those same trials (a "shadow"
in-memory study). A batch is proposed only when every trial of the earlier ones has finished.
The sampler's input and every pruning decision are then functions of the seed and of results,
never of timing, so any number of processes and workers gives the same trial table.
``reproducible: false`` asks a new trial whenever a worker is free and prunes against
everything reported so far: more throughput, no such guarantee.

Fused trials (search.fuse): a process claims the waiting trials of one chunk of a batch together
(chunks of ``fuse`` slots: which trials share a fused model is a function of the spec, never of
timing) and hands them to one worker as one task; trials of another architecture in the chunk
wait as further tasks (see trial/fused.py: plan).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from sweeper.search import checkpoints
from sweeper.search.backend import SearchContext
from sweeper.search.optuna import lease, writes
from sweeper.search.optuna.ledger import Ledger, Sweep
from sweeper.search.optuna.recovery import POLL_S, Recovery
from sweeper.search.optuna.study import (
    ACCUMULATE,
    ATTEMPT,
    BATCH,
    FINISHED,
    INFO,
    RETRY_OF,
    SLOT,
    TELL,
    directions,
    interrupted,
    make_pruner,
    make_sampler,
    record,
)
from sweeper.search.pool import Executor
from sweeper.search.trial_runs import close_trial_run, log_sweep_dataset, open_trial_run
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.track.records import TrialEvent, TrialRecord, objective_values
from sweeper.trial import fused
from sweeper.trial.build import TrialConfig
from sweeper.trial.checkpoint import trial_path
from sweeper.trial.execute import OOM, Outcome
from sweeper.trial.seeding import sampler_seed, threads_per_trial, trial_seed

UNFINISHED = (TrialState.WAITING, TrialState.RUNNING)


@dataclass
class _Live:
    trial: optuna.Trial  # in the real study
    config: TrialConfig
    run_id: str | None
    shadow: optuna.Trial | None  # reproducible mode: the same trial in the shadow study
    lost: bool = False  # another process failed it: this process's lease had run out
    epochs: dict[int, float] = field(default_factory=dict)  # the objective at each epoch, for its end
    carried: dict[str, Any] = field(default_factory=dict)  # the shadow's system attrs written to the trial


class Coordinator(Recovery):
    """Claims and proposes trials, answers pruning questions, tells results, logs them; its
    answers to faults are recovery.py's."""

    def __init__(
        self, spec: SweepSpec, study: optuna.Study, ledger: Ledger, heartbeat: lease.Heartbeat, ctx: SearchContext
    ) -> None:
        self.spec, self.study, self.ledger, self.heartbeat, self.ctx = spec, study, ledger, heartbeat, ctx
        self.live: dict[int, _Live] = {}
        self.snapshot: tuple[int, list[FrozenTrial]] = (-1, [])  # (batch, its finished earlier trials)
        self.shared_view: tuple[int, optuna.Study | None] = (-1, None)  # (batch, the view its trials share)
        self.threads = threads_per_trial(spec)
        self.next_check = 0.0  # monotonic time to look for stale trials next
        records = self.records()
        kept = checkpoints.kept(spec, records)
        self.kept = [r for r in records if r.number in kept]  # whose checkpoints are kept so far
        self.trained = any(r.state in ("complete", "pruned") for r in records)  # the breaker is off once true
        self.stopped: Exception | None = None  # the circuit breaker's error, raised once the trials end
        # trials per fused model (1: none fused); claimed tasks wait in `pending` for a free worker
        self.fuse = spec.search.fuse_size(cuda=spec.train.device != "cpu" and torch.cuda.is_available())
        self.pending: list[list[TrialConfig]] = []
        self.noted: set[str] = set()  # fallback reasons already said
        # trials this process created and has not claimed yet: claimed without reading the study
        # first (a claim is atomic: one another process took meanwhile is skipped)
        self.waiting_here: list[FrozenTrial] = []

    def run(self, executor: Executor) -> None:
        """Serve the sweep until its budget is spent (a worker), and every trial has finished
        (``sweeper run``), or until ``sweeper stop``. ``self.heartbeat`` runs meanwhile."""
        while True:
            self._recover()
            sweep = self.ledger.read()
            if executor.slots and self.pending:  # claimed already: they run even after a stop request
                executor.submit(self.pending.pop(0))
                continue
            if executor.slots and not sweep.stop:
                trials = self._claim_waiting() or self._propose(sweep)
                if trials is not None:
                    if isinstance(trials, list):
                        self._start(executor, trials)
                    continue
            if self.live:
                for outcome in executor.results(POLL_S):
                    self._finish(outcome)
                continue
            if self._over(sweep):
                if self.stopped is not None:
                    raise self.stopped
                return
            time.sleep(POLL_S)  # the trials of this batch run elsewhere: the next batch waits for them

    # --- budget --------------------------------------------------------------------------------

    def _cap(self, sweep: Sweep) -> int | None:
        cap = sweep.n_trials
        if self.spec.search.sampler == "grid":
            size = sp.grid_size(self.spec.search.space)
            cap = size if cap is None else min(cap, size)
        return cap

    def _budget_left(self, sweep: Sweep) -> int | None:
        """Slots still to claim (None: no cap, until the timeout); 0 when spent or timed out."""
        deadline = sweep.deadline()
        if deadline is not None and time.time() >= deadline:
            return 0
        cap = self._cap(sweep)
        return None if cap is None else max(0, cap - sweep.proposed)

    def _over(self, sweep: Sweep) -> bool:
        """Nothing left for this process: the budget is spent and no trial waits (a worker); and
        no trial runs anywhere (`sweeper run`, which then summarises)."""
        if sweep.stop:
            return True
        if self._budget_left(sweep) != 0 or sweep.proposing is not None:
            return False
        unfinished = self.study.get_trials(deepcopy=False, states=UNFINISHED)
        if any(t.state == TrialState.WAITING for t in unfinished):
            return False
        return self.ctx.role == "worker" or not unfinished

    # --- claiming and proposing ----------------------------------------------------------------

    def _claim_waiting(self) -> list[optuna.Trial]:
        """WAITING trials made RUNNING by this process (each one atomic update: one owner), leased:
        one trial, or with fusing the waiting trials of the first one's chunk."""
        claimed: list[optuna.Trial] = []
        mine = bool(self.waiting_here)
        waiting = self.waiting_here or sorted(
            self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)),
            key=lambda t: t.user_attrs.get(SLOT, t.number),
        )
        tried = set()
        for t in waiting:
            if claimed and (self.fuse == 1 or self._chunk(t) != self._chunk(claimed[0])):
                continue
            tried.add(t._trial_id)
            # its seed and run, known from the start: a process recovering the trial (if this one
            # dies) records the seed and closes the run (created by the tracker's sender thread)
            info = {"seed": self._seed(t), "mlflow_run_id": self.ctx.tracker.new_run_id()}
            if self.heartbeat.claim(t._trial_id, {INFO: info}):
                claimed.append(optuna.Trial(self.study, t._trial_id))
        if mine:
            self.waiting_here = [t for t in waiting if t._trial_id not in tried]
        return claimed

    def _chunk(self, t: FrozenTrial | optuna.Trial) -> tuple[Any, ...]:
        """Which fused task a trial belongs to: its batch, its chunk of ``fuse`` slots in it, and
        its attempt (retries fuse with retries)."""
        attrs = t.user_attrs
        batch = attrs.get(BATCH)
        if batch is None:
            return ("alone", t.number)
        return batch, (attrs.get(SLOT, t.number) - batch) // self.fuse, attrs.get(ATTEMPT, 1)

    def _propose(self, sweep: Sweep) -> list[optuna.Trial] | bool | None:
        """Claim budget and create its trials: a new batch (reproducible), or one trial. Returns
        a trial to start, True to look again at once, None when there is nothing to propose."""
        left = self._budget_left(sweep)
        if left == 0 or sweep.proposing is not None:
            return None
        if not self.spec.search.reproducible:
            if not self.ledger.claim_slot(sweep):
                return True  # another process claimed that slot: look again
            trial = self._new_trial(sweep.proposed)
            return [trial] if isinstance(trial, optuna.Trial) else trial
        if self.study.get_trials(deepcopy=False, states=UNFINISHED):
            return None  # the current batch is not finished: the next one must see its results
        size = self.spec.search.batch_size if left is None else min(left, self.spec.search.batch_size)
        if not self.ledger.claim_batch(sweep, size):
            return True
        proposed = self._batch_params(sweep.proposed, size)
        self._enqueue(
            [(trial, {SLOT: slot, BATCH: sweep.proposed}) for slot, trial in enumerate(proposed, start=sweep.proposed)]
        )
        self.ledger.unlock()  # only once all are enqueued: a process that dies before is repaired
        return True

    def _new_trial(self, slot: int) -> optuna.Trial | bool:
        """reproducible: false: the trial of ``slot`` (whose claim holds the ledger's lock)."""
        if slot < len(self.ctx.enqueue):  # an LR warm-start trial: enqueued, then claimed like any
            self.study.enqueue_trial(self.ctx.enqueue[slot], user_attrs={SLOT: slot})
            self.ledger.unlock()
            return True
        with warnings.catch_warnings():  # Optuna warns that heartbeats belong in study.optimize
            warnings.simplefilter("ignore")
            trial = self.study.ask()
        if SLOT in trial.user_attrs:  # it popped a trial that was waiting (a retry): the slot goes back
            self.ledger.release_slot()
        else:
            trial.set_user_attr(SLOT, slot)
            self.ledger.unlock()
        self.heartbeat.hold(trial._trial_id)
        return trial

    def _finished_before(self, batch: int) -> list[FrozenTrial]:
        """The finished trials of batches before ``batch`` (lost attempts aside), by slot."""
        if self.snapshot[0] != batch:
            done = [
                t
                for t in self.study.get_trials(deepcopy=True, states=FINISHED)
                if not interrupted(t) and t.user_attrs.get(BATCH, -1) < batch
            ]
            self.snapshot = (batch, sorted(done, key=lambda t: t.user_attrs.get(SLOT, t.number)))
        return self.snapshot[1]

    def _view(self, batch: int, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
        """An in-memory study holding the finished trials of the batches before ``batch``."""
        view = optuna.create_study(
            study_name=self.spec.name, directions=directions(self.spec), sampler=sampler, pruner=make_pruner(self.spec)
        )
        view.add_trials(self._finished_before(batch))
        return view

    def _shadow(self, batch: int) -> optuna.Trial:
        """A trial's shadow: a new trial in a view of the batches before ``batch``. The median
        pruner (and none) looks only at complete trials and the trial itself, so the trials of a
        batch share one view, built once (each build copies every finished trial: 15 ms at 250).
        ASHA and Hyperband look at running trials too (Hyperband at the trial's number): a view each."""
        if self.spec.search.pruner.type not in ("median", "none"):
            return self._view(batch).ask()
        if self.shared_view[0] != batch:
            self.shared_view = (batch, self._view(batch))
        return self.shared_view[1].ask()

    def _batch_params(self, batch: int, size: int) -> list[FrozenTrial]:
        """The trials (params and distributions) of the batch starting at slot ``batch``: a
        function of the seed and of the earlier batches' results only (whichever process computes it)."""
        view = self._view(batch, make_sampler(self.spec, sampler_seed(self.spec.seed, batch)))
        out = []
        for slot in range(batch, batch + size):
            if slot < len(self.ctx.enqueue):
                view.enqueue_trial(self.ctx.enqueue[slot])
            trial = view.ask()
            sp.suggest(self.spec.search.space, trial)
            out.append(view._storage.get_trial(trial._trial_id))
        return out

    def _enqueue(self, proposed: list[tuple[FrozenTrial, dict[str, Any]]]) -> None:
        """Proposed trials (with their user attrs), WAITING, in one transaction, with their params
        already (``enqueue_trial`` makes one transaction a trial and leaves each param to be
        written, one transaction each, when the trial is claimed; its "fixed_params" system attr
        is not needed: a trial's suggest returns a param it holds)."""
        self.waiting_here += writes.create(
            self.study,
            [
                optuna.trial.create_trial(
                    state=TrialState.WAITING,
                    params=p.params,
                    distributions=p.distributions,
                    user_attrs=attrs,
                    system_attrs={k: v for k, v in p.system_attrs.items() if k != "fixed_params"},
                )  # NSGA-II's generation
                for p, attrs in proposed
            ],
        )

    # --- running -------------------------------------------------------------------------------

    def _start(self, executor: Executor, trials: list[optuna.Trial]) -> None:
        """Start claimed trials: one task, or fused tasks (fused.plan), the first now."""
        configs = [self._config(t) for t in trials]
        tasks, notes = fused.plan(configs, self.fuse) if len(configs) > 1 else ([configs], [])
        for note in notes:
            self.ctx.observer.note(note)
        for config in configs:
            self._open(self.live[config.number].trial, config)
        executor.submit(tasks[0])
        self.pending.extend(tasks[1:])

    def _config(self, trial: optuna.Trial) -> TrialConfig:
        values = sp.suggest(self.spec.search.space, trial)
        batch = trial.user_attrs.get(BATCH)
        shadow = self._shadow(batch) if self.spec.search.reproducible and batch is not None else None
        resized = {"train.accumulate": trial.user_attrs[ACCUMULATE]} if ACCUMULATE in trial.user_attrs else {}
        config = TrialConfig(
            trial.number,
            self._seed(trial),
            values,
            self.spec.with_values({**values, **resized}),
            self.threads,
            str(trial_path(self.ctx.out_dir, trial.number)),
        )
        self.live[trial.number] = _Live(trial, config, None, shadow)
        return config

    def _seed(self, trial: FrozenTrial | optuna.Trial) -> int:
        return trial_seed(self.spec.seed, trial.user_attrs.get(SLOT, trial.number))

    def _open(self, trial: optuna.Trial, config: TrialConfig) -> None:
        """The trial's MLflow run, its start recorded."""
        batch = trial.user_attrs.get(BATCH)
        seed = sampler_seed(self.spec.seed, batch) if batch is not None else None
        retry = {"retry_of": str(trial.user_attrs[RETRY_OF])} if RETRY_OF in trial.user_attrs else {}
        planned = trial.user_attrs.get(INFO, {}).get("mlflow_run_id")  # set by its claim
        run_id = open_trial_run(self.ctx.tracker, config, self.ctx.sweep, seed, tags=retry, run_id=planned)
        self.live[trial.number].run_id = run_id
        if run_id != planned:  # created at once (or a trial of study.ask): a process recovering it closes this run
            self._guard(trial.number, lambda: trial.set_user_attr(INFO, {"seed": config.seed, "mlflow_run_id": run_id}))
        self.ctx.observer.event(TrialEvent.start(config.number, config.params))

    def _guard(self, number: int, write: Any) -> None:
        """A write to this process's trial; if another process has failed it meanwhile (this
        process's lease ran out), the trial is lost here and stops at its next epoch."""
        try:
            write()
        except UpdateFinishedTrialError:
            self.live[number].lost = True

    def decide(self, number: int, epoch: int, metrics: dict[str, float]) -> bool:
        """True if the pruner stops this trial after this epoch. Reproducible mode asks the
        in-memory shadow study only, so a waiting worker gets its answer at once."""
        live = self.live[number]
        value = metrics[self.spec.objective.metric]
        if len(self.spec.goals) > 1:  # no pruner compares several objectives: each trial runs to its end
            if live.shadow is None:
                live.epochs[epoch] = value
            return live.lost
        if live.shadow is None:  # the live study decides: it must hold this epoch first
            self._guard(number, lambda: live.trial.report(value, epoch))
            live.epochs[epoch] = value
            return live.lost or live.trial.should_prune()
        live.shadow.report(value, epoch)
        return live.lost or live.shadow.should_prune()

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
        self.heartbeat.progress(live.trial._trial_id, epoch, live.epochs[epoch])
        # pruners (ASHA) keep per-trial state in system attrs: carry new values to the real trial
        for key, val in live.shadow.study._storage.get_trial_system_attrs(live.shadow._trial_id).items():
            if key not in live.carried or live.carried[key] != val:
                live.carried[key] = val
                self._guard(
                    number,
                    lambda key=key, val=val: self.study._storage.set_trial_system_attr(live.trial._trial_id, key, val),
                )

    def _finish(self, outcome: Outcome) -> None:
        live = self.live[outcome.number]
        if outcome.state == "interrupted":  # its worker process died: the trial is retried
            self.heartbeat.release(live.trial._trial_id)
            self._retry_lost([(self.study._storage.get_trial(live.trial._trial_id), outcome.reason or "")])
            self.live.pop(outcome.number)
            return
        metric = self.spec.objective.metric
        reason = outcome.reason
        fallback = outcome.info.get("fuse_fallback")
        if fallback and fallback not in self.noted:
            self.noted.add(fallback)
            self.ctx.observer.note(
                f"a fused task trained its trials one at a time (trial {outcome.number} among them): {fallback}"
            )
        if outcome.state == "failed" and (reason or "").startswith(OOM) and not live.lost:
            reason = self._retry_oom(live, reason or OOM)
        if outcome.state == "pruned":
            reason = (
                f"{reason} by the {self.spec.search.pruner.type} pruner ({metric}={outcome.history[-1][metric]:.4g})"
            )
        values = objective_values(self.spec, outcome.history, outcome.info) if outcome.state == "complete" else None
        if outcome.state == "complete" and values is None:  # a footprint the trial could not measure
            outcome.state, reason = "failed", f"objectives not measured: {', '.join(g.metric for g in self.spec.goals)}"
        live.run_id = self.ctx.tracker.created(live.run_id)  # its MLflow id, if the sender made it already
        info = {
            "seed": live.config.seed,
            "reason": reason,
            "mlflow_run_id": live.run_id,
            "history": outcome.history,
            **outcome.info,
        }
        if values is not None:
            info["values"] = dict(zip([g.metric for g in self.spec.goals], values))
            info["value"] = info["values"][metric]  # the primary objective's (the table's value)
        frozen = None
        self.heartbeat.release(live.trial._trial_id)  # first: no beat writes its epochs meanwhile
        if not live.lost:
            try:  # its epochs, info, state and value: one transaction
                frozen = writes.finish(
                    self.study, live.trial._trial_id, TELL[outcome.state], values, live.epochs, {INFO: info}
                )
            except UpdateFinishedTrialError:
                live.lost = True
        self.live.pop(outcome.number)
        if frozen is None:  # another process failed it and retries it: this attempt is void
            close_trial_run(
                self.ctx.tracker,
                live.run_id,
                "interrupted",
                "its lease ran out while it trained; another process retried it",
            )
            return
        close_trial_run(self.ctx.tracker, live.run_id, outcome.state, reason, outcome.error, outcome.info)
        log_sweep_dataset(self.ctx.tracker, self.spec, self.ctx.sweep, outcome.info)
        finished = record(frozen)
        self._check_breaker(finished)
        if outcome.state == "complete":
            checkpoints.publish(self.spec, self.ctx.tracker, finished, self.ctx.out_dir)
            # free the disk as the sweep goes, not only at its end
            self.kept = checkpoints.keep_better(self.spec, self.kept, finished, self.ctx.out_dir)
        self.ctx.observer.event(TrialEvent.end(finished))

    def records(self) -> list[TrialRecord]:
        """Every trial of the study (earlier invocations' and other processes' included)."""
        return [record(t) for t in self.study.get_trials(deepcopy=False)]
