"""Optuna backend: embedded sqlite storage by default, or many workers on one database.

A worker runs ``study.optimize`` with the same objective whether it is the main process
(``parallel: 1``) or one of several spawned processes; side effects (MLflow, checkpoints)
happen here, around the trainer, never inside it.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper import checkpoint, resolve
from sweeper import space as sp
from sweeper.errors import TrialFailed, TrialPruned
from sweeper.seeding import trial_seed
from sweeper.spec import SweepSpec
from sweeper.tracking import Tracker, git_revision
from sweeper.trainer import resolve_device
from sweeper.trial import TrialConfig, run_trial

Events = Callable[[dict[str, Any]], None]
INFO = "sweeper"  # user attr holding seed, reason, run id and per-epoch history
INTERRUPTED = "sweeper_interrupted"  # system attr of a trial whose process died
STATE = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
         TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}

optuna.logging.set_verbosity(optuna.logging.ERROR)  # failures are shown in sweeper's own table


def storage_url(spec: SweepSpec, out_dir: Path) -> str:
    return spec.search.storage or f"sqlite:///{(out_dir / 'optuna.db').resolve()}"


def make_storage(url: str) -> optuna.storages.RDBStorage:
    # sqlite: wait up to 60 s for a lock instead of failing when several workers write at once.
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def make_sampler(spec: SweepSpec, seed: int) -> optuna.samplers.BaseSampler:
    search = spec.search
    if search.sampler == "grid":
        grid = {path: sp.grid_values(path, p) for path, p in search.space.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
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


def open_study(spec: SweepSpec, out_dir: Path, worker_index: int = 0) -> optuna.Study:
    storage = make_storage(storage_url(spec, out_dir))
    try:
        existing = len(storage.get_all_trials(storage.get_study_id_from_name(spec.name), deepcopy=False))
    except KeyError:  # a new study
        existing = 0
    # A fresh sampler seed per worker and per resume: a resumed or parallel sampler must not
    # replay the random start-up points of the first one.
    seed = int(np.random.SeedSequence([spec.seed, existing, worker_index]).generate_state(1)[0])
    return optuna.create_study(study_name=spec.name, storage=storage, sampler=make_sampler(spec, seed),
                               pruner=make_pruner(spec), direction=spec.objective.direction,
                               load_if_exists=True)


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Trials left RUNNING by a killed process: mark them failed and queue their params again."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_system_attr(t._trial_id, INTERRUPTED, True)
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
        numbers.append(t.number)
    return numbers


def counted(study: optuna.Study) -> int:
    """Trials that count toward n_trials: finished, excluding those lost to a killed process."""
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(1 for t in study.get_trials(deepcopy=False, states=done) if not t.system_attrs.get(INTERRUPTED))


def record(t: FrozenTrial) -> dict[str, Any]:
    """A trial as summary.json and the progress table show it."""
    info = t.user_attrs.get(INFO, {})
    reason = info.get("reason")
    if t.system_attrs.get(INTERRUPTED):
        reason = "interrupted: its process stopped; the same params were queued again"
    seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
    return {"number": t.number, "state": STATE.get(t.state, t.state.name.lower()), "params": t.params,
            "value": t.value, "seed": info.get("seed"), "reason": reason, "epochs": len(info.get("history", [])),
            "seconds": seconds, "device": info.get("device"), "mlflow_run_id": info.get("mlflow_run_id"),
            "history": info.get("history", [])}


def checkpoint_path(out_dir: Path, number: int) -> Path:
    return out_dir / "checkpoints" / f"trial-{number:05d}.pt"


class Objective:
    """Optuna objective: one trial, with tracking and checkpointing around the trainer."""

    def __init__(self, spec: SweepSpec, out_dir: Path, tracker: Tracker, parent_run_id: str | None,
                 worker_index: int, events: Events) -> None:
        self.spec, self.out_dir, self.tracker, self.parent = spec, out_dir, tracker, parent_run_id
        self.device = resolve_device(spec.train.device, worker_index)
        self.events = events
        self.git_rev = git_revision() or "unknown"

    def __call__(self, trial: optuna.Trial) -> float:
        spec, metric = self.spec, self.spec.objective.metric
        seed = trial_seed(spec.seed, trial.number)
        history: list[dict[str, float]] = []
        info: dict[str, Any] = {"seed": seed, "device": str(self.device), "history": history}
        state, error, run_id = "failed", None, None

        def report(epoch: int, metrics: dict[str, float]) -> None:
            history.append(metrics)
            self.tracker.log_epoch(run_id, epoch, metrics)
            self.events({"event": "epoch", "number": trial.number, "epoch": epoch, "metrics": metrics})
            trial.report(metrics[metric], epoch)
            if trial.should_prune():
                raise TrialPruned(f"pruned at epoch {epoch} by the {spec.search.pruner.type} pruner "
                                  f"({metric}={metrics[metric]:.4g})")

        try:
            values = sp.suggest(spec.search.space, trial)
            config = TrialConfig(trial.number, seed, values, spec.with_values(values))
            self.events({"event": "start", "number": trial.number, "params": values})
            run_id = info["mlflow_run_id"] = self.tracker.start_trial(
                self.parent, trial.number, seed, config.spec,
                tags={"device": str(self.device), "git_rev": self.git_rev, "sweep_seed": str(spec.seed),
                      "plugins": json.dumps(resolve.provenance(config.spec))})
            trained = run_trial(config, report, self.device)
            checkpoint.save(checkpoint_path(self.out_dir, trial.number), model=trained.model,
                            optimizer=trained.optimizer, scheduler=trained.scheduler,
                            epoch=len(trained.history), extra={"trial": trial.number, "params": values})
            state = "complete"
            return trained.history[-1][metric]
        except TrialPruned as exc:
            state, info["reason"] = "pruned", str(exc)
            raise optuna.TrialPruned(str(exc)) from None
        except Exception as exc:
            info["reason"] = reason_of(exc)
            error = traceback.format_exc()
            raise
        finally:
            trial.set_user_attr(INFO, info)
            self.tracker.end_trial(run_id, state, info.get("reason"), error)


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, TrialFailed):
        return text[:500]
    return f"{type(exc).__name__}: {text}"[:500]


def keep_best_checkpoint(out_dir: Path, study: optuna.Study) -> None:
    """Delete the checkpoints of completed trials that are not the best (from one snapshot of
    the storage, so concurrent workers never delete the current best)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        return
    pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    best = pick(done, key=lambda t: t.value)
    for t in done:
        if t.number != best.number:
            checkpoint_path(out_dir, t.number).unlink(missing_ok=True)


def run_worker(spec: SweepSpec, out_dir: Path, parent_run_id: str | None, n_trials: int | None,
               worker_index: int, events: Events) -> None:
    """Run up to ``n_trials`` trials (None: until the timeout) of the sweep's study."""
    study = open_study(spec, out_dir, worker_index)
    objective = Objective(spec, out_dir, Tracker.for_spec(spec), parent_run_id, worker_index, events)

    def finished(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            keep_best_checkpoint(out_dir, study)
        events({"event": "end", "record": record(trial)})

    study.optimize(objective, n_trials=n_trials, timeout=spec.search.timeout, catch=(Exception,),
                   callbacks=[finished], gc_after_trial=False)
