"""Which trial checkpoints a sweep keeps in <out>/checkpoints, the same rule for both backends:
the best completed trial's always (export rebuilds the model from it; with objectives, those of
the Pareto front), every completed trial's with export.keep_checkpoints: all (so `sweeper export RUN_ID` reaches
each of them).

A sweep that many machines serve (search.storage set) also publishes each completed trial's
checkpoint where every machine reads it: under search.artifact_root (a shared mount), else as
the trial run's MLflow artifact ``checkpoint/trial-NNNNN.pt``. ``fetch`` finds it from any machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.spec import SweepSpec
from sweeper.spec.objectives import choose, pareto_front
from sweeper.states import TrialState
from sweeper.track.mlflow import Tracker
from sweeper.track.records import TrialRecord
from sweeper.trial.checkpoint import trial_path

ARTIFACT_FOLDER = "checkpoint"  # in a trial's MLflow run


def published_path(spec: SweepSpec, number: int) -> Path | None:
    """A trial's checkpoint under search.artifact_root, or None without one."""
    root = spec.search.artifact_root
    return None if root is None else Path(root) / spec.name / trial_path(Path("."), number).name


def publish(spec: SweepSpec, tracker: Tracker, record: TrialRecord, out_dir: Path) -> None:
    """Make a completed trial's checkpoint reachable from every machine serving the sweep."""
    local = trial_path(out_dir, record.number)
    if not local.exists() or (spec.search.storage is None and spec.search.artifact_root is None):
        return
    shared = published_path(spec, record.number)
    if shared is not None:
        shared.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, shared.with_suffix(".part"))
        shared.with_suffix(".part").replace(shared)  # readers never see half a file
        tracker.set_tags(record.mlflow_run_id, {"checkpoint": str(shared)})
    elif tracker.enabled:
        tracker.log_files(record.mlflow_run_id, [local], ARTIFACT_FOLDER)
        tracker.set_tags(record.mlflow_run_id, {"checkpoint": f"mlflow-artifacts:{ARTIFACT_FOLDER}/{local.name}"})


def fetch(spec: SweepSpec, tracker: Tracker, record: TrialRecord, out_dir: Path) -> Path:
    """The trial's checkpoint on this machine: trained here, or fetched from where it was published."""
    local = trial_path(out_dir, record.number)
    if local.exists():
        return local
    shared = published_path(spec, record.number)
    if shared is not None and shared.exists():
        return shared
    if tracker.enabled and record.mlflow_run_id:
        try:
            return tracker.download(record.mlflow_run_id, f"{ARTIFACT_FOLDER}/{local.name}", local.parent)
        except LookupError:
            pass
    raise UserError(
        f"the checkpoint of trial {record.number} is neither in {local.parent} nor published "
        f"(search.artifact_root, or its MLflow run): was it trained on another machine of a sweep "
        f"without search.storage?"
    )


def best(spec: SweepSpec, records: list[TrialRecord]) -> TrialRecord | None:
    """The sweep's best trial: the completed trial with the best objective value (the lowest
    number on ties); with objectives, the point of the Pareto front export.choose picks."""
    complete = sorted((r for r in records if r.state == TrialState.COMPLETE), key=lambda r: r.number)
    return choose(spec.goals, spec.export.choose, complete, lambda r: r.scores(spec))


def front(spec: SweepSpec, records: list[TrialRecord]) -> list[TrialRecord]:
    """The completed trials no other one beats on every objective (by number)."""
    complete = sorted((r for r in records if r.state == TrialState.COMPLETE), key=lambda r: r.number)
    return pareto_front(spec.goals, complete, lambda r: r.scores(spec))


def standing(spec: SweepSpec, records: list[TrialRecord]) -> dict[str, Any]:
    """What summary.json and the report say of a sweep's trials (so far): the objectives, the
    count of each state, the best trial (with objectives: the point export.choose picks) and the
    Pareto front (None with one objective)."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    top = best(spec, records)
    entry = (
        None
        if top is None
        else {
            "number": top.number,
            "params": top.params,
            "value": top.value,
            "values": top.scores(spec),
            "seed": top.seed,
            "mlflow_run_id": top.mlflow_run_id,
            "metrics": top.history[-1] if top.history else {},
            "footprint": top.footprint,
        }
    )
    pareto = (
        [
            {"number": r.number, "values": r.scores(spec), "params": r.params, "mlflow_run_id": r.mlflow_run_id}
            for r in front(spec, records)
        ]
        if len(spec.goals) > 1
        else None
    )
    return {
        "objective": spec.objective.model_dump(),
        "objectives": [g.model_dump() for g in spec.goals],
        "pareto_front": pareto,
        "choose": spec.export.choose.model_dump() if spec.export.choose else None,
        "counts": counts,
        "best": entry,
    }


def kept(spec: SweepSpec, records: list[TrialRecord]) -> list[int]:
    """Trial numbers whose checkpoint the sweep keeps: every complete trial's, or the best's
    (with objectives: the Pareto front's, so `sweeper export RUN_ID` reaches any point of it)."""
    if spec.export.keep_checkpoints == "all":
        return sorted(r.number for r in records if r.state == TrialState.COMPLETE)
    if len(spec.goals) > 1:
        return [r.number for r in front(spec, records)]
    top = best(spec, records)
    return [] if top is None else [top.number]


def keep_better(spec: SweepSpec, kept_so_far: list[TrialRecord], new: TrialRecord, out_dir: Path) -> list[TrialRecord]:
    """The rule applied as a sweep goes, one completed trial at a time: returns the trials kept
    among ``kept_so_far`` and ``new`` and deletes the others' checkpoints (unless all are kept)."""
    pool = sorted([*kept_so_far, new], key=lambda r: r.number)  # ties: the lower number
    keep = set(kept(spec, pool))
    if spec.export.keep_checkpoints != "all":
        for loser in (r for r in pool if r.number not in keep):
            trial_path(out_dir, loser.number).unlink(missing_ok=True)
            if (shared := published_path(spec, loser.number)) is not None:
                shared.unlink(missing_ok=True)
    return [r for r in pool if r.number in keep]


def prune(spec: SweepSpec, records: list[TrialRecord], out_dir: Path) -> None:
    """Delete the checkpoints of finished trials that are not kept."""
    keep = set(kept(spec, records))
    for r in records:
        if r.state.finished and r.number not in keep:
            trial_path(out_dir, r.number).unlink(missing_ok=True)
            if (shared := published_path(spec, r.number)) is not None:  # other processes' beaten trials
                shared.unlink(missing_ok=True)
