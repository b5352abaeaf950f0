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
    checkpoint = Path(record.checkpoint)
    if not checkpoint.exists():
        raise UserError(f"{checkpoint}: the checkpoint of trial {number} (run {run_id}) is gone; a sweep keeps "
                        f"only the best trial's checkpoint unless its spec sets export.keep_checkpoints: all")
    out = out or Path(record.out_dir) / f"export-trial-{number}"
    model, data = rebuild(record.spec, checkpoint)
    source = {"trial": number, "mlflow_run_id": run_id, "checkpoint": str(checkpoint)}
    report = export.export_model(model, data, out, record.spec.export, names=formats, source=source)
    tracker.log_files(run_id, export.artifacts(report), "export")
    return report
