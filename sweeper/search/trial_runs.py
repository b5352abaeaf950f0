"""The sweep's MLflow run and its trials' nested runs, recorded the same way by both backends:
what a trial run holds (params, provenance tags, trial.json), how its end is recorded, and the
sweep's parent run. Everything goes through the generic Tracker."""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.pluginhost.binding import provenance
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import TrialState
from sweeper.track.mlflow import Tracker
from sweeper.track.records import TRIAL_JSON, TRIAL_JSON_VERSION, TrialJson
from sweeper.trial.build import TrialConfig
from sweeper.trial.seeding import derive

# MLflow run status for a trial's final state; the others (complete, pruned, exploited) FINISHED
STATUS: dict[str, str] = {TrialState.FAILED: "FAILED", TrialState.INTERRUPTED: "KILLED"}
# The end of a PBT trial's run that continues in a new run (not a TrialState: the trial goes on)
EXPLOITED = "exploited"


@functools.cache
def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout.strip() or "unknown") if out.returncode == 0 else "unknown"


@dataclass(frozen=True)
class SweepInfo:
    """What every trial run records about its sweep (plain data: it travels to Ray actors)."""

    parent_run_id: str | None
    sweep_seed: int
    out_dir: str  # absolute
    git_rev: str


def flat_params(spec: SweepSpec) -> dict[str, str]:
    """The parts of a resolved spec that define a trial, as dotted MLflow params."""
    out = {}
    for section in ("dataset", "model", "optimizer", "schedule"):
        ref = getattr(spec, section)
        out[f"{section}.plugin"] = ref.plugin
        out.update({f"{section}.args.{k}": json.dumps(v) if not isinstance(v, str) else v for k, v in ref.args.items()})
    out.update({f"train.{k}": str(v) for k, v in spec.train.model_dump().items()})
    return out


def trial_json(
    config: TrialConfig, sweep: SweepInfo, sampler_seed: int | None, exploits: list[dict[str, Any]] | None = None
) -> TrialJson:
    """The one writer of trial.json's content (see track/records.py: TrialJson)."""
    from sweeper.trial.checkpoint import trial_path

    return TrialJson(
        schema_version=TRIAL_JSON_VERSION,
        number=config.number,
        seed=config.seed,
        params=config.params,
        spec=config.spec,
        threads=config.threads or 1,
        sweep_seed=sweep.sweep_seed,
        sampler_seed=sampler_seed,
        data_seed=derive(sweep.sweep_seed, "data"),
        plugins=provenance(config.spec),
        git_rev=sweep.git_rev,
        checkpoint=str(trial_path(Path(sweep.out_dir), config.number)),
        out_dir=sweep.out_dir,
        exploits=exploits or [],
    )


def open_trial_run(
    tracker: Tracker,
    config: TrialConfig,
    sweep: SweepInfo,
    sampler_seed: int | None,
    tags: dict[str, str] | None = None,
    exploits: list[dict[str, Any]] | None = None,
    run_id: str | None = None,
) -> str | None:
    """A trial's run, nested under the sweep's: params, provenance tags and trial.json (``run_id``:
    its placeholder from Tracker.new_run_id, created without waiting)."""
    if not tracker.enabled:
        return None
    record = trial_json(config, sweep, sampler_seed, exploits)
    run_id = tracker.start_run(
        run_name(config.number),
        parent=sweep.parent_run_id,
        run_id=run_id,
        params=flat_params(config.spec),
        tags={
            "kind": "trial",
            "trial": str(config.number),
            "seed": str(config.seed),
            "git_rev": sweep.git_rev,
            "sweep_seed": str(sweep.sweep_seed),
            "plugins": json.dumps(record.plugins),
            **(tags or {}),
        },
    )
    tracker.log_dict(run_id, record.model_dump(mode="json"), TRIAL_JSON)
    return run_id


def run_name(number: int) -> str:
    """A trial run's name, zero-padded so that the MLflow UI sorts trials by number."""
    return f"trial-{number:05d}"


_datasets_logged: set[tuple[str, str]] = set()  # (parent run, fingerprint) logged by this process


def log_sweep_dataset(tracker: Tracker, spec: SweepSpec, sweep: SweepInfo, info: dict[str, Any]) -> None:
    """The sweep's data set as an input of its run (the MLflow UI's Dataset column), once a
    process, from a trial's info (its fingerprint and sizes): MLflow keeps one input of a run
    per data set name and digest, so other processes' logging it again changes nothing."""
    digest, parent = info.get("data_fingerprint"), sweep.parent_run_id
    if not tracker.enabled or not digest or parent is None or (parent, digest) in _datasets_logged:
        return
    _datasets_logged.add((parent, digest))
    tracker.log_dataset(
        parent,
        spec.dataset.plugin,
        digest,
        {"plugin": spec.dataset.plugin, "args": spec.dataset.args, "seed": derive(sweep.sweep_seed, "data")},
        info.get("data_profile") or {},
    )


def close_trial_run(
    tracker: Tracker,
    run_id: str | None,
    state: TrialState | str,
    reason: str | None,
    error: str | None = None,
    info: dict[str, Any] | None = None,
    status: str | None = None,
) -> None:
    """The trial's end: state (a TrialState, or EXPLOITED), reason and run info as tags, the
    traceback as error.txt; the run's MLflow status follows the state unless ``status`` is given."""
    if run_id is None:
        return
    info = dict(info or {})
    sizes = info.pop("footprint", None)  # metrics of the trained model: columns in the MLflow UI
    tracker.set_tags(run_id, {"state": str(state), **({"reason": reason} if reason else {}), **info})
    if sizes:
        tracker.log_metrics(run_id, 0, sizes)
    if error:
        tracker.log_text(run_id, error, "error.txt")
    tracker.end_run(run_id, status or STATUS.get(state, "FINISHED"))


def start_sweep_run(tracker: Tracker, spec: SweepSpec, resume_run_id: str | None) -> str | None:
    """The sweep's parent run: the run of the sweep being resumed, or a new one."""
    if not tracker.enabled:
        return None
    if resume_run_id:
        tracker.resume_run(resume_run_id)
        return resume_run_id
    run_id = tracker.start_run(
        spec.name,
        tags={"kind": "sweep", "git_rev": git_revision()},
        params={
            "seed": spec.seed,
            "sampler": spec.search.sampler,
            "pruner": spec.search.pruner.type,
            "n_trials": spec.search.n_trials,
            "objective": spec.objective.metric,
            "direction": spec.objective.direction,
            **(
                {"objectives": ", ".join(f"{g.metric} ({g.direction})" for g in spec.goals)}
                if len(spec.goals) > 1
                else {}
            ),
            **space_params(spec),
        },
    )
    tracker.log_dict(run_id, spec.model_dump(mode="json"), "spec.json")
    return run_id


def space_params(spec: SweepSpec) -> dict[str, str]:
    """The search space as params of the sweep's run: ``space.<path>`` = its range or choices."""
    return {f"space.{path}": json.dumps(param) for path, param in sp.as_json(spec.search.space).items()}


def end_sweep_run(
    tracker: Tracker, run_id: str | None, summary: dict[str, Any], files: list[Path], plots: list[Path] | None = None
) -> None:
    """Best metrics, trial counts and the best trial on the sweep's run; its files (``plots`` in
    its plots/ folder); FINISHED."""
    if run_id is None:
        return
    best = summary.get("best") or {}
    metrics = {f"best_{k}": v for k, v in {**(best.get("metrics") or {}), **(best.get("footprint") or {})}.items()}
    metrics.update(best.get("test_metrics") or {})  # the chosen trial on the held-out test split: test_*
    refit = summary.get("refit") or {}  # export.refit: the retrained model on the test split
    metrics.update({f"refit_{k}": v for k, v in (refit.get("test_metrics") or {}).items()})
    metrics.update({f"trials_{state}": n for state, n in summary["counts"].items()})
    tracker.log_metrics(run_id, 0, metrics)
    front = summary.get("pareto_front")
    tracker.set_tags(
        run_id,
        {
            "best_trial": best.get("number"),
            "best_run_id": best.get("mlflow_run_id"),
            "review_trials": str(len(summary.get("trials", []))),  # what report.html covers
            **({"pareto_front": ",".join(str(p["number"]) for p in front)} if front else {}),
        },
    )
    tracker.log_files(run_id, files)
    tracker.log_files(run_id, plots or [], "plots")
    tracker.end_run(run_id)
