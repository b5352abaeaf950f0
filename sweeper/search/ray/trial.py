"""The worker side of the Ray backend: one Tune trial runs the shared trial code
(``trial.execute``) with a ``decide`` that logs each epoch to MLflow and reports it to Tune.

``ray.tune.report`` is synchronous for function trainables: it returns only once the scheduler
let the trial go on; a trial Tune stops never gets past it (Ray ends the thread), and the driver
closes its MLflow run (see driver.py). The trial code itself never imports ray.

With ``checkpoint_every`` (search.ray.max_failures > 0, or PBT), every so many epochs the report
carries the training state (model.pt, see trial/checkpoint.py) and meta.json; the last report
always does. A trial that Tune starts with a checkpoint continues from it: its own (a retry
after its worker died) in the same MLflow run, or a PBT donor's (an exploit) in a new run that
starts with the donor's history.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.search.trial_runs import EXPLOITED, SweepInfo, close_trial_run, log_sweep_dataset, open_trial_run
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import TrialState
from sweeper.track.journal import FOLDER as JOURNAL
from sweeper.track.mlflow import Tracker
from sweeper.trial.build import ProcessCache, TrialConfig
from sweeper.trial.outcome import Outcome

NUMBER = "sweeper.number"  # config key: the trial's number (OptunaSearch: its Optuna trial number)
# Beside model.pt in each Tune checkpoint: whose state it is (trial id and number, MLflow run),
# its epoch, restarts, PBT exploits and the per-epoch history of its lineage.
META = "meta.json"
MODEL = "model.pt"


# This Ray worker process's data set and compiled forwards: Tune runs trial after trial in one
# worker process (search.ray.reuse_actors), and a function trainable has no object of its own that
# lives as long as its process. Only ``trainable`` uses it (no callback of the driver does).
WORKER_CACHE = ProcessCache()


class TrialError(RuntimeError):
    """Raised in a worker after a trial failed on its own (non-finite loss, plugin error):
    Tune marks the trial ERROR (Optuna's sampler sees FAIL)."""


@dataclass(frozen=True)
class Context:
    """What every trial needs besides its sampled params (shipped to the workers)."""

    spec: SweepSpec
    tracking_uri: str | None
    experiment: str | None
    sweep: SweepInfo
    threads: int  # torch CPU threads per trial
    sampler_seed: int | None
    checkpoint_every: int = 0  # epochs between reported checkpoints; 0: only the final one


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


def read_meta(checkpoint: Any) -> dict[str, Any] | None:
    """A Tune checkpoint's meta.json, read through its filesystem (a local path, s3://, ...)."""
    try:
        with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/{META}") as f:
            return json.loads(f.read())
    except OSError:  # not there (pyarrow raises FileNotFoundError)
        return None


def trainable(config: dict[str, Any], context: Context) -> None:
    """One Tune trial: the shared trial code, its epochs reported to Tune; it starts from the
    checkpoint Tune hands it, if any (its own after a failure, a PBT donor's after an exploit)."""
    import ray
    from ray import tune

    from sweeper.trial.execute import execute, saves_state

    trial_id = tune.get_context().get_trial_id()
    number = trial_number(config, trial_id)
    node_id = ray.get_runtime_context().get_node_id()
    # its writes wait in the sweep's folder while MLflow is away (a folder of this machine)
    tracker = Tracker(context.tracking_uri, context.experiment, Path(context.sweep.out_dir) / JOURNAL)
    with tempfile.TemporaryDirectory(prefix="sweeper-trial-") as tmp:
        out, start = Path(tmp) / "out", Path(tmp) / "start"  # what this trial reports; where it starts
        out.mkdir()
        previous = _fetch(tune.get_checkpoint(), start)
        task = _trial_config(context, number, trial_params(context.spec.search.space, config), Path(tmp), previous)
        spec = task.spec
        lineage = _open_run(tracker, context, task, previous, trial_id, {"ray_node_id": node_id})
        run_id = lineage["mlflow_run_id"]
        ids = {"sweeper_number": number, "mlflow_run_id": run_id or "", "node_id": node_id}
        last: dict[str, Any] = {}

        def checkpoint(epoch: int) -> Any:
            """model.pt (saved by the worker at this epoch) and meta.json, as a Tune checkpoint."""
            (out / META).write_text(json.dumps({**lineage, "epoch": epoch}))
            return tune.Checkpoint.from_directory(out)  # report() copies it to Tune's storage

        def decide(_: int, epoch: int, metrics: dict[str, float]) -> bool:
            # MLflow first: a trial Tune stops never returns from report(). A worker killed between
            # the two logs this epoch again when it resumes (same values: the resume is bitwise).
            tracker.log_metrics(run_id, epoch, metrics)
            lineage["history"].append(metrics)
            if epoch < spec.train.epochs:
                tune.report(
                    {**metrics, "epoch": epoch, **ids},  # returns only if Tune lets it go on
                    checkpoint=checkpoint(epoch) if saves_state(task, epoch) else None,
                )
            else:
                last.update(metrics, epoch=epoch)  # reported below, together with the final checkpoint
            return False  # Tune stops trials itself (see the module docstring)

        (outcome,) = execute([task], decide, cache=WORKER_CACHE)
        close_trial_run(tracker, run_id, outcome.state, outcome.reason, outcome.error, outcome.info)
        log_sweep_dataset(tracker, task.spec, context.sweep, outcome.info)
        if outcome.state != TrialState.COMPLETE:
            raise TrialError(outcome.reason)
        last = last or {**lineage["history"][-1], "epoch": spec.train.epochs}  # resumed with nothing left to do
        # done: Tune stops the trial here; without it PBT could pause it at this result and resume it later
        tune.report(_done(last, ids, outcome), checkpoint=checkpoint(spec.train.epochs))


def _trial_config(
    context: Context, number: int, params: dict[str, Any], folder: Path, previous: dict[str, Any] | None
) -> TrialConfig:
    """The trial's config: its model.pt saved in ``folder``/out, resumed from ``folder``/start
    when Tune handed it a checkpoint (``previous``: its meta.json; new hyperparameters when it
    is a PBT donor's, another trial's)."""
    from ray import tune

    from sweeper.trial.seeding import trial_seed

    return TrialConfig(
        number,
        trial_seed(context.spec.seed, number),
        params,
        context.spec.with_values(params),
        context.threads,
        str(folder / "out" / MODEL),
        checkpoint_every=context.checkpoint_every,
        resume=str(folder / "start" / MODEL) if previous else None,
        new_hyperparameters=previous is not None and previous["trial_id"] != tune.get_context().get_trial_id(),
    )


def _done(last: dict[str, Any], ids: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The complete trial's last report to Tune: its last epoch's metrics, ids and footprint."""
    return {
        **last,
        **ids,
        **outcome.info.get("footprint", {}),
        "sweeper_state": TrialState.COMPLETE.value,
        "seconds": outcome.info["seconds"],
        "device": outcome.info["device"],
        "done": True,
    }


def _fetch(checkpoint: Any, folder: Path) -> dict[str, Any] | None:
    """Copy the checkpoint Tune handed this trial to ``folder``; its meta.json, or None."""
    if checkpoint is None:
        return None
    checkpoint.to_directory(str(folder))
    meta = folder / META
    return json.loads(meta.read_text()) if meta.exists() else None


def _open_run(
    tracker: Tracker,
    context: Context,
    task: TrialConfig,
    previous: dict[str, Any] | None,
    trial_id: str,
    tags: dict[str, str],
) -> dict[str, Any]:
    """The trial's MLflow run and lineage: a new run; the same run again when the trial resumes
    from its own checkpoint; a new run that starts with the donor's history after a PBT exploit."""
    tags = {**tags, "ray_trial_id": trial_id, "pid": str(os.getpid())}  # pid: the process to look at
    lineage: dict[str, Any] = {
        "trial_id": trial_id,
        "number": task.number,
        "params": task.params,
        "restarts": 0,
        "exploits": [],
        "history": [],
    }
    if previous is None:
        run_id = open_trial_run(tracker, task, context.sweep, context.sampler_seed, tags)
    elif previous["trial_id"] == trial_id:  # after its worker died (or a PBT pause): the same run goes on
        run_id = previous["mlflow_run_id"] or None
        lineage.update(restarts=previous["restarts"] + 1, exploits=previous["exploits"], history=previous["history"])
        tracker.resume_run(
            run_id, {**tags, "restarts": str(lineage["restarts"]), "resumed_from_epoch": str(previous["epoch"])}
        )
    else:  # a PBT exploit: the donor's state with this trial's new hyperparameters, in a new run
        for old in tracker.open_children(context.sweep.parent_run_id, {"ray_trial_id": trial_id}):
            close_trial_run(
                tracker,
                old,
                EXPLOITED,
                f"PBT: continued in a new run from trial {previous['number']}'s "
                f"checkpoint of epoch {previous['epoch']}, with new hyperparameters",
            )
        exploit = {"epoch": previous["epoch"], "donor": previous["number"], "params": task.params}
        lineage.update(exploits=[*previous["exploits"], exploit], history=previous["history"])
        run_id = open_trial_run(
            tracker,
            task,
            context.sweep,
            context.sampler_seed,
            {
                **tags,
                "pbt_donor": str(previous["number"]),
                "pbt_donor_trial_id": previous["trial_id"],
                "pbt_epoch": str(previous["epoch"]),
            },
            exploits=lineage["exploits"],
        )
        tracker.log_history(run_id, previous["history"])  # epochs 1..epoch: the donor's lineage
    lineage["mlflow_run_id"] = run_id
    return lineage
