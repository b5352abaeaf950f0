"""The worker side of the Ray backend: one Tune trial runs the shared trial function
(``workers.execute``) with a ``decide`` that logs each epoch to MLflow and reports it to Tune.

``ray.tune.report`` is synchronous for function trainables: it returns only once the scheduler
let the trial go on; a trial Tune stops never gets past it (Ray ends the thread), and the driver
closes its MLflow run (see backends/ray.py). The trainer itself never imports ray.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper import space as sp
from sweeper.spec import SweepSpec
from sweeper.tracking import Tracker

NUMBER = "sweeper.number"  # config key: the trial's number (OptunaSearch: its Optuna trial number)


class TrialError(RuntimeError):
    """Raised in a worker after a trial failed on its own (non-finite loss, plugin error):
    Tune marks the trial ERROR (Optuna's sampler sees FAIL)."""


# --- the worker side ------------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    """What every trial needs besides its sampled params (plain data: shipped to the workers)."""

    spec: dict[str, Any]
    tracking_uri: str | None
    experiment: str | None
    parent_run_id: str | None
    git_rev: str
    threads: int  # torch CPU threads per trial
    sampler_seed: int | None


def trial_number(config: dict[str, Any], trial_id: str) -> int:
    """OptunaSearch puts Optuna's trial number in the config; the basic generator's trial ids
    end in a 5-digit counter (``2f1e_00003``)."""
    return int(config[NUMBER]) if NUMBER in config else int(trial_id.rsplit("_", 1)[1])


def trial_params(space: dict[str, sp.Param], config: dict[str, Any]) -> dict[str, Any]:
    """The config's searched values, without conditional ones whose condition fails (the basic
    generator samples every parameter; OptunaSearch only the active ones)."""
    chosen: dict[str, Any] = {}
    for path, param in sp.ordered(space):
        if path in config and sp.active(param, chosen):
            chosen[path] = config[path]
    return chosen


def trainable(config: dict[str, Any], context: Context) -> None:
    """One Tune trial: the shared trial function, its epochs reported to Tune."""
    import ray
    from ray import tune

    from sweeper.seeding import trial_seed
    from sweeper.workers import Task, execute

    base = SweepSpec.model_validate(context.spec)
    number = trial_number(config, tune.get_context().get_trial_id())
    params = trial_params(base.search.space, config)
    spec = base.with_values(params)
    node_id = ray.get_runtime_context().get_node_id()
    tracker = Tracker(context.tracking_uri, context.experiment)
    with tempfile.TemporaryDirectory(prefix="sweeper-trial-") as tmp:
        task = Task(number, trial_seed(base.seed, number), params, spec.model_dump(mode="json"),
                    context.threads, str(Path(tmp) / "model.pt"))
        run_id = tracker.start_task(context.parent_run_id, task, base.seed, context.git_rev, context.sampler_seed,
                                    tags={"ray_node_id": node_id, "ray_trial_id": tune.get_context().get_trial_id()})
        ids = {"sweeper_number": number, "mlflow_run_id": run_id or "", "node_id": node_id}
        last: dict[str, Any] = {}

        def decide(_: int, epoch: int, metrics: dict[str, float]) -> bool:
            tracker.log_epoch(run_id, epoch, metrics)
            if epoch < spec.train.epochs:
                tune.report({**metrics, "epoch": epoch, **ids})  # returns only if Tune lets it go on
            else:
                last.update(metrics, epoch=epoch)  # reported below, together with the checkpoint
            return False  # Tune stops trials itself (see the module docstring)

        outcome = execute(task, decide)
        tracker.end_trial(run_id, outcome.state, outcome.reason, outcome.error, outcome.info)
        if outcome.state != "complete":
            raise TrialError(outcome.reason)
        tune.report({**last, **ids, "sweeper_state": "complete", "seconds": outcome.info["seconds"],
                     "device": outcome.info["device"]}, checkpoint=tune.Checkpoint.from_directory(tmp))
