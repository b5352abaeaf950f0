"""The Optuna study of a sweep: its storage, sampler and pruner built from the spec, recovery of
trials a killed process left running, and a finished trial as a TrialRecord."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.track.records import TrialRecord
from sweeper.trial.seeding import sampler_seed

INFO = "sweeper"  # user attr: seed, reason, run id, per-epoch history, provenance
INTERRUPTED = "sweeper_interrupted"  # system attr of a trial whose process died
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
STATE = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
         TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}
TELL = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
SQLITE_LOCK_TIMEOUT_S = 60  # sqlite: wait this long for another process's write lock rather than fail

optuna.logging.set_verbosity(optuna.logging.ERROR)  # sweeper shows trials in its own table


def storage_url(spec: SweepSpec, out_dir: Path) -> str:
    return spec.search.storage or f"sqlite:///{(out_dir / 'optuna.db').resolve()}"


def make_storage(url: str) -> optuna.storages.RDBStorage:
    kwargs = {"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}} if url.startswith("sqlite") else {}
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


def open_study(spec: SweepSpec, out_dir: Path) -> optuna.Study:
    return optuna.create_study(study_name=spec.name, storage=make_storage(storage_url(spec, out_dir)),
                               sampler=make_sampler(spec, sampler_seed(spec.seed, 0)), pruner=make_pruner(spec),
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


def record(t: FrozenTrial) -> TrialRecord:
    """A trial as summary.json and the progress table show it."""
    info: dict[str, Any] = t.user_attrs.get(INFO, {})
    reason = info.get("reason")
    if t.system_attrs.get(INTERRUPTED):
        reason = "interrupted: its process stopped; the same params were queued again"
    history = info.get("history", [])
    return TrialRecord(number=t.number, state=STATE.get(t.state, "failed"), params=t.params, value=t.value,
                       seed=info.get("seed"), reason=reason, epochs=len(history), seconds=info.get("seconds"),
                       device=info.get("device"), mlflow_run_id=info.get("mlflow_run_id"), history=history)
