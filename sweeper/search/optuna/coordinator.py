"""The Optuna coordinator (this process) asks, prunes and tells; workers only train.

Reproducible mode (default): trials are proposed in batches of ``search.batch_size`` by a
sampler re-seeded from the sweep's "sampler" stream at the batch's first trial number, and each
trial is pruned against the trials of earlier batches only (a "shadow" in-memory study holding
them). The sampler's input and every pruning decision are then functions of trial numbers and
results, never of timing, so ``parallel: 1`` and ``parallel: N`` give the same trial table.
``reproducible: false`` asks a new trial whenever a worker is free and prunes against
everything reported so far: more throughput, no such guarantee.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from sweeper.search import checkpoints
from sweeper.search.backend import SearchContext
from sweeper.search.optuna.study import FINISHED, INFO, TELL, counted, make_pruner, make_sampler, record
from sweeper.search.pool import Executor
from sweeper.search.trial_runs import close_trial_run, open_trial_run
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.track.records import TrialEvent, TrialRecord
from sweeper.trial.build import TrialConfig
from sweeper.trial.checkpoint import trial_path
from sweeper.trial.execute import Outcome
from sweeper.trial.seeding import sampler_seed, threads_per_trial, trial_seed


@dataclass
class _Live:
    trial: optuna.Trial  # in the real study
    config: TrialConfig
    run_id: str | None
    shadow: optuna.Trial | None  # reproducible mode: the same trial in the shadow study


class Coordinator:
    """Asks trials from the sampler, answers pruning questions, tells results, logs them."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, ctx: SearchContext) -> None:
        self.spec, self.study, self.ctx = spec, study, ctx
        self.live: dict[int, _Live] = {}
        self.pending: list[TrialConfig] = []
        self.snapshot: list[FrozenTrial] = []  # finished trials before the current batch
        self.sampler_seed = sampler_seed(spec.seed, 0)  # re-seeded per batch in reproducible mode
        self.threads = threads_per_trial(spec)
        self.best = checkpoints.best(spec, self.records())  # whose checkpoint is kept so far

    def run(self, budget: int | None, executor: Executor) -> None:
        """Run ``budget`` more trials (None: until the timeout) on ``executor``."""
        deadline = time.monotonic() + self.spec.search.timeout if self.spec.search.timeout else None
        left = self._grid_cap(budget)
        while True:
            open_budget = (left is None or left > 0) and (deadline is None or time.monotonic() < deadline)
            if self.spec.search.reproducible:
                if open_budget and not self.live and not self.pending:
                    size = self.spec.search.batch_size if left is None else min(left, self.spec.search.batch_size)
                    self._new_batch(size)
                    left = None if left is None else left - size
            elif open_budget and executor.slots > len(self.pending):
                self.pending.append(self._ask())
                left = None if left is None else left - 1
                continue
            while self.pending and executor.slots:
                self._start(executor, self.pending.pop(0))
            if not self.live:
                return
            for outcome in executor.results():
                self._finish(outcome)

    def _grid_cap(self, budget: int | None) -> int | None:
        if self.spec.search.sampler != "grid":
            return budget
        size = sp.grid_size(self.spec.search.space)
        return max(0, min(budget if budget is not None else size, size - counted(self.study)))

    def _new_batch(self, size: int) -> None:
        first = len(self.study.get_trials(deepcopy=False))
        self.sampler_seed = sampler_seed(self.spec.seed, first)
        self.study.sampler = make_sampler(self.spec, self.sampler_seed)
        self.snapshot = self.study.get_trials(deepcopy=True, states=FINISHED)
        self.pending = [self._ask() for _ in range(size)]

    def _ask(self) -> TrialConfig:
        trial = self.study.ask()
        values = sp.suggest(self.spec.search.space, trial)
        shadow = None
        if self.spec.search.reproducible:
            view = optuna.create_study(study_name=self.spec.name, direction=self.spec.objective.direction,
                                       pruner=make_pruner(self.spec))
            view.add_trials(self.snapshot)  # numbers 0..b-1, as in the real study
            shadow = view.ask()
        config = TrialConfig(trial.number, trial_seed(self.spec.seed, trial.number), values,
                             self.spec.with_values(values), self.threads,
                             str(trial_path(self.ctx.out_dir, trial.number)))
        self.live[trial.number] = _Live(trial, config, None, shadow)
        return config

    def _start(self, executor: Executor, config: TrialConfig) -> None:
        live = self.live[config.number]
        live.run_id = open_trial_run(self.ctx.tracker, config, self.ctx.sweep, self.sampler_seed)
        self.ctx.observer.event(TrialEvent.start(config.number, config.params))
        executor.submit(config)

    def decide(self, number: int, epoch: int, metrics: dict[str, float]) -> bool:
        """True if the pruner stops this trial after this epoch. Reproducible mode asks the
        in-memory shadow study only, so a waiting worker gets its answer at once."""
        live = self.live[number]
        value = metrics[self.spec.objective.metric]
        if live.shadow is None:  # the live study decides: it must hold this epoch first
            live.trial.report(value, epoch)
            return live.trial.should_prune()
        live.shadow.report(value, epoch)
        return live.shadow.should_prune()

    def record(self, number: int, epoch: int, metrics: dict[str, float]) -> None:
        """The slow part of an epoch (storage, MLflow, display), done after the worker has its answer."""
        live = self.live[number]
        self.ctx.tracker.log_metrics(live.run_id, epoch, metrics)
        self.ctx.observer.event(TrialEvent.epoch_end(number, epoch, metrics))
        if live.shadow is None:
            return
        live.trial.report(metrics[self.spec.objective.metric], epoch)
        # pruners (ASHA) keep per-trial state in system attrs: carry new values to the real trial
        for key, val in live.shadow.study._storage.get_trial_system_attrs(live.shadow._trial_id).items():
            if live.trial.system_attrs.get(key) != val:
                self.study._storage.set_trial_system_attr(live.trial._trial_id, key, val)

    def _finish(self, outcome: Outcome) -> None:
        live = self.live.pop(outcome.number)
        metric = self.spec.objective.metric
        reason = outcome.reason
        if outcome.state == "pruned":
            reason = f"{reason} by the {self.spec.search.pruner.type} pruner " \
                     f"({metric}={outcome.history[-1][metric]:.4g})"
        info = {"seed": live.config.seed, "reason": reason, "mlflow_run_id": live.run_id,
                "history": outcome.history, **outcome.info}
        live.trial.set_user_attr(INFO, info)
        value = outcome.history[-1][metric] if outcome.state == "complete" else None
        frozen = self.study.tell(live.trial, value, state=TELL[outcome.state])
        close_trial_run(self.ctx.tracker, live.run_id, outcome.state, reason, outcome.error, outcome.info)
        finished = record(frozen)
        if outcome.state == "complete":  # free the disk as the sweep goes, not only at its end
            self.best = checkpoints.keep_better(self.spec, self.best, finished, self.ctx.out_dir)
        self.ctx.observer.event(TrialEvent.end(finished))

    def records(self) -> list[TrialRecord]:
        """Every trial of the study (earlier invocations' included), as TrialRecords."""
        return [record(t) for t in self.study.get_trials(deepcopy=False)]
