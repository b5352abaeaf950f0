"""Optuna backend: one coordinator (this process) asks, prunes and tells; workers only train.

Reproducible mode (default): trials are proposed in batches of ``search.batch_size`` by a
sampler re-seeded from (sweep seed, first trial number of the batch), and each trial is pruned
against the trials of earlier batches only (a "shadow" in-memory study holding them). The
sampler's input and every pruning decision are then functions of trial numbers and results,
never of timing, so ``parallel: 1`` and ``parallel: N`` give the same trial table.
``reproducible: false`` asks a new trial whenever a worker is free and prunes against
everything reported so far: more throughput, no such guarantee.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper import space as sp
from sweeper.checkpoint import trial_path
from sweeper.seeding import threads_per_trial, trial_seed
from sweeper.spec import SweepSpec
from sweeper.tracking import Tracker, git_revision
from sweeper.workers import Outcome, Task

Events = Callable[[dict[str, Any]], None]
INFO = "sweeper"  # user attr: seed, reason, run id, per-epoch history, provenance
INTERRUPTED = "sweeper_interrupted"  # system attr of a trial whose process died
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
STATE = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
         TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}
TELL = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}

optuna.logging.set_verbosity(optuna.logging.ERROR)  # sweeper shows trials in its own table


def storage_url(spec: SweepSpec, out_dir: Path) -> str:
    return spec.search.storage or f"sqlite:///{(out_dir / 'optuna.db').resolve()}"


def make_storage(url: str) -> optuna.storages.RDBStorage:
    # sqlite: wait up to 60 s for a lock rather than fail when another process writes
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


class _Grid(optuna.samplers.GridSampler):
    """GridSampler without its study.stop(), which only works inside study.optimize; the
    coordinator caps the budget at the grid's size instead."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def make_sampler(spec: SweepSpec, seed: int) -> optuna.samplers.BaseSampler:
    search = spec.search
    if search.sampler == "grid":
        return _Grid({path: sp.grid_values(path, p) for path, p in search.space.items()}, seed=seed)
    factories = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                 "cmaes": optuna.samplers.CmaEsSampler, "gp": optuna.samplers.GPSampler}
    return factories[search.sampler](seed=seed)


def make_pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    p = spec.search.pruner
    if p.type == "median":  # epochs are 1-based steps: the first prune can come at min_epochs
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.min_epochs)
    if p.type == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_epochs, reduction_factor=p.reduction_factor)
    if p.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=p.min_epochs, max_resource=spec.train.epochs,
                                              reduction_factor=p.reduction_factor)
    return optuna.pruners.NopPruner()


def sampler_seed(spec: SweepSpec, first_number: int) -> int:
    """The sampler's seed for the trials proposed from ``first_number`` on."""
    return int(np.random.SeedSequence([spec.seed, first_number]).generate_state(1)[0])


def open_study(spec: SweepSpec, out_dir: Path) -> optuna.Study:
    return optuna.create_study(study_name=spec.name, storage=make_storage(storage_url(spec, out_dir)),
                               sampler=make_sampler(spec, sampler_seed(spec, 0)), pruner=make_pruner(spec),
                               direction=spec.objective.direction, load_if_exists=True)


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed process: mark them failed and queue their params again."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # FrozenTrial exposes no public id; storage calls need it
        study._storage.set_trial_system_attr(t._trial_id, INTERRUPTED, True)
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
        numbers.append(t.number)
    return numbers


def counted(study: optuna.Study) -> int:
    """Trials that count toward n_trials: finished, excluding those lost to a killed process."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if not t.system_attrs.get(INTERRUPTED))


def record(t: FrozenTrial) -> dict[str, Any]:
    """A trial as summary.json and the progress table show it."""
    info = t.user_attrs.get(INFO, {})
    reason = info.get("reason")
    if t.system_attrs.get(INTERRUPTED):
        reason = "interrupted: its process stopped; the same params were queued again"
    return {"number": t.number, "state": STATE.get(t.state, t.state.name.lower()), "params": t.params,
            "value": t.value, "seed": info.get("seed"), "reason": reason, "epochs": len(info.get("history", [])),
            "seconds": info.get("seconds"), "device": info.get("device"),
            "mlflow_run_id": info.get("mlflow_run_id"), "history": info.get("history", [])}


@dataclass
class _Live:
    trial: optuna.Trial  # in the real study
    task: Task
    run_id: str | None
    shadow: optuna.Trial | None  # reproducible mode: the same trial in the shadow study


class Coordinator:
    """Asks trials from the sampler, answers pruning questions, tells results, logs them."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, out_dir: Path, tracker: Tracker,
                 parent_run_id: str | None, events: Events) -> None:
        self.spec, self.out_dir, self.tracker, self.parent, self.events = spec, out_dir, tracker, parent_run_id, events
        self.study = study
        self.live: dict[int, _Live] = {}
        self.pending: list[Task] = []
        self.snapshot: list[FrozenTrial] = []  # finished trials before the current batch
        self.git_rev = git_revision() or "unknown"
        self.sampler_seed = sampler_seed(spec, 0)  # re-seeded per batch in reproducible mode
        self.threads = threads_per_trial(spec)

    def run(self, budget: int | None, executor: Any) -> None:
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
        size = int(np.prod([len(sp.grid_values(p, v)) for p, v in self.spec.search.space.items()]))
        return max(0, min(budget if budget is not None else size, size - counted(self.study)))

    def _new_batch(self, size: int) -> None:
        first = len(self.study.get_trials(deepcopy=False))
        self.sampler_seed = sampler_seed(self.spec, first)
        self.study.sampler = make_sampler(self.spec, self.sampler_seed)
        self.snapshot = self.study.get_trials(deepcopy=True, states=FINISHED)
        self.pending = [self._ask() for _ in range(size)]

    def _ask(self) -> Task:
        trial = self.study.ask()
        values = sp.suggest(self.spec.search.space, trial)
        seed = trial_seed(self.spec.seed, trial.number)
        shadow = None
        if self.spec.search.reproducible:
            view = optuna.create_study(study_name=self.spec.name, direction=self.spec.objective.direction,
                                       pruner=make_pruner(self.spec))
            view.add_trials(self.snapshot)  # numbers 0..b-1, as in the real study
            shadow = view.ask()
        task = Task(trial.number, seed, values, self.spec.with_values(values).model_dump(mode="json"),
                    self.threads, str(trial_path(self.out_dir, trial.number)))
        self.live[trial.number] = _Live(trial, task, None, shadow)
        return task

    def _start(self, executor: Any, task: Task) -> None:
        live = self.live[task.number]
        # for `sweeper export RUN_ID`: where the trained weights are, where exports go
        where = {"checkpoint": str(Path(task.checkpoint).resolve()), "out_dir": str(self.out_dir.resolve())}
        live.run_id = self.tracker.start_task(self.parent, task, self.spec.seed, self.git_rev, self.sampler_seed,
                                              extra=where)
        self.events({"event": "start", "number": task.number, "params": task.params})
        executor.submit(task)

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
        self.tracker.log_epoch(live.run_id, epoch, metrics)
        self.events({"event": "epoch", "number": number, "epoch": epoch, "metrics": metrics})
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
        info = {"seed": live.task.seed, "reason": reason, "mlflow_run_id": live.run_id,
                "history": outcome.history, **outcome.info}
        live.trial.set_user_attr(INFO, info)
        value = outcome.history[-1][metric] if outcome.state == "complete" else None
        frozen = self.study.tell(live.trial, value, state=TELL[outcome.state])
        self.tracker.end_trial(live.run_id, outcome.state, reason, outcome.error, outcome.info)
        if outcome.state == "complete":
            self._keep_best_checkpoint()
        self.events({"event": "end", "record": record(frozen)})

    def _keep_best_checkpoint(self) -> None:
        """Delete the checkpoints of completed trials that are not the best (unless
        export.keep_checkpoints is ``all``)."""
        if self.spec.export.keep_checkpoints == "all":
            return
        best = self.study.best_trial  # the study knows its direction
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.number != best.number:
                trial_path(self.out_dir, t.number).unlink(missing_ok=True)
