"""Which trial checkpoints a sweep keeps in <out>/checkpoints, the same rule for both backends:
the best completed trial's always (export rebuilds the model from it), every completed trial's
with export.keep_checkpoints: all (so `sweeper export RUN_ID` reaches each of them).

A sweep that many machines serve (search.storage set) also publishes each completed trial's
checkpoint where every machine reads it: under search.artifact_root (a shared mount), else as
the trial run's MLflow artifact ``checkpoint/trial-NNNNN.pt``. ``fetch`` finds it from any machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sweeper.errors import UserError
from sweeper.spec import SweepSpec
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
    raise UserError(f"the checkpoint of trial {record.number} is neither in {local.parent} nor published "
                    f"(search.artifact_root, or its MLflow run): was it trained on another machine of a sweep "
                    f"without search.storage?")


def best(spec: SweepSpec, records: list[TrialRecord]) -> TrialRecord | None:
    """The completed trial with the best objective value (the lowest number on ties), or None."""
    complete = sorted((r for r in records if r.state == "complete"), key=lambda r: r.number)
    return spec.objective.best(complete, lambda r: r.value)


def kept(spec: SweepSpec, records: list[TrialRecord]) -> list[int]:
    """Trial numbers whose checkpoint the sweep keeps."""
    if spec.export.keep_checkpoints == "all":
        return sorted(r.number for r in records if r.state == "complete")
    top = best(spec, records)
    return [] if top is None else [top.number]


def keep_better(spec: SweepSpec, best: TrialRecord | None, new: TrialRecord, out_dir: Path) -> TrialRecord | None:
    """The rule applied as a sweep goes, one completed trial at a time: returns the best of
    ``best`` and ``new`` and deletes the other one's checkpoint (unless every one is kept)."""
    pair = sorted((r for r in (best, new) if r is not None), key=lambda r: r.number)  # ties: the lower number
    winner = spec.objective.best(pair, lambda r: r.value)
    loser = new if winner is best else best
    if loser is not None and spec.export.keep_checkpoints != "all":
        trial_path(out_dir, loser.number).unlink(missing_ok=True)
        if (shared := published_path(spec, loser.number)) is not None:
            shared.unlink(missing_ok=True)
    return winner


def prune(spec: SweepSpec, records: list[TrialRecord], out_dir: Path) -> None:
    """Delete the checkpoints of finished trials that are not kept."""
    keep = set(kept(spec, records))
    for r in records:
        if r.state in ("complete", "pruned", "failed") and r.number not in keep:
            trial_path(out_dir, r.number).unlink(missing_ok=True)
            if (shared := published_path(spec, r.number)) is not None:  # other processes' beaten trials
                shared.unlink(missing_ok=True)
