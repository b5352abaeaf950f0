"""``sweeper export RUN_ID``: export any finished trial later, from its MLflow run and checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.spec import EXPORT_FORMATS
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.records import load_trial
from sweeper.trial.build import rebuild


def parse_formats(values: list[str] | None) -> list[str] | None:
    """``--formats onnx --formats pt2`` or ``--formats onnx,pt2``; None: the spec's formats."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORT_FORMATS]
    if unknown or not names:
        raise UserError(f"--formats {','.join(values)}: unknown format {', '.join(unknown) or '(none)'}; "
                        f"expected one or more of: {', '.join(EXPORT_FORMATS)}")
    return list(dict.fromkeys(names))


def find_checkpoint(tracker: Tracker, run_id: str, local: Path, out: Path, published: str | None) -> Path | None:
    """The trial's checkpoint from this machine: where it was trained (this machine), where its
    sweep published it (search.artifact_root, a shared mount), or its run's MLflow artifact."""
    if local.exists():
        return local
    if published and not published.startswith("mlflow-artifacts:") and Path(published).exists():
        return Path(published)
    if published:
        try:
            return tracker.download(run_id, published.removeprefix("mlflow-artifacts:"), out / "checkpoint")
        except LookupError:
            return None
    return None


def export_trial(run_id: str, tracking_uri: str, formats: list[str] | None, out: Path | None) -> dict[str, Any]:
    """Rebuild the trial of MLflow run ``run_id`` from its checkpoint, export and verify it into
    ``out`` (default ``<sweep out>/export-trial-<N>``), log the files to that run under export/."""
    from sweeper import export

    tracker = Tracker(tracking_uri)
    run, record = load_trial(tracker, run_id)
    number, state = record.number, run.data.tags.get(f"{TAG}state")
    if state != "complete":
        raise UserError(f"run {run_id} is trial {number}, which {state or 'has not finished'}: only a completed "
                        f"trial has a checkpoint to export")
    home = Path(record.out_dir)
    out = out or (home if home.is_dir() else Path(".")) / f"export-trial-{number}"
    checkpoint = find_checkpoint(tracker, run_id, Path(record.checkpoint), out,
                                 run.data.tags.get(f"{TAG}checkpoint"))
    if checkpoint is None:
        raise UserError(f"{record.checkpoint}: the checkpoint of trial {number} (run {run_id}) is gone; a sweep "
                        f"keeps only the best trial's checkpoint unless its spec sets export.keep_checkpoints: all")
    model, data = rebuild(record.spec, checkpoint)
    source = {"trial": number, "mlflow_run_id": run_id, "checkpoint": str(checkpoint)}
    report = export.export_model(model, data, out, record.spec.export, names=formats, source=source)
    tracker.log_files(run_id, export.artifacts(report), "export")
    return report
