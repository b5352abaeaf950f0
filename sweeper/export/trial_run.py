"""``sweeper export RUN_ID``: export any finished trial later, from its MLflow run and checkpoint."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from sweeper.errors import UserError
from sweeper.spec import EXPORT_FORMATS
from sweeper.states import TrialState
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.records import TrialJson, load_trial
from sweeper.trial.build import rebuild
from sweeper.trial.checkpoint import CorruptCheckpoint


def parse_formats(values: list[str] | None) -> list[str] | None:
    """``--formats onnx --formats pt2`` or ``--formats onnx,pt2``; None: the spec's formats."""
    if not values:
        return None
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORT_FORMATS]
    if unknown or not names:
        raise UserError(
            f"--formats {','.join(values)}: unknown format {', '.join(unknown) or '(none)'}; "
            f"expected one or more of: {', '.join(EXPORT_FORMATS)}"
        )
    return list(dict.fromkeys(names))


def find_checkpoint(tracker: Tracker, run_id: str, local: Path, out: Path, published: str | None) -> Path | None:
    """The trial's checkpoint from this machine: where it was trained (this machine), where its
    sweep published it (search.artifact_root, a shared mount), or its run's MLflow artifact.
    ``local`` and ``published`` come from the run, which whoever can write to the MLflow server
    could have forged: ``local`` is checked by the caller (inside the sweep's folder), a published
    artifact must be a plain relative name (it is downloaded into ``out``)."""
    if local.exists():
        return local
    if published and not published.startswith("mlflow-artifacts:") and Path(published).exists():
        return Path(published)
    if published:
        artifact = PurePosixPath(published.removeprefix("mlflow-artifacts:"))
        if artifact.is_absolute() or ".." in artifact.parts:
            raise UserError(
                f"run {run_id}: its checkpoint tag names the artifact '{artifact}', which leaves the "
                f"run's artifacts; expected a path such as checkpoints/trial-00001.pt (pass "
                f"--checkpoint PATH to export from a file you choose)"
            )
        try:
            return tracker.download(run_id, str(artifact), out / "checkpoint")
        except LookupError:
            return None
    return None


def recorded_checkpoint(run_id: str, record: TrialJson) -> Path:
    """The checkpoint path trial.json names, if it lies inside the sweep's output folder that
    trial.json names (after symlinks and '..'); else a UserError."""
    home, named = Path(record.out_dir).resolve(), Path(record.checkpoint)
    if not named.resolve().is_relative_to(home):
        raise UserError(
            f"run {run_id}: its trial.json names the checkpoint '{record.checkpoint}', which is outside "
            f"the sweep's output folder '{record.out_dir}'; refusing to read it (a record from "
            f"the MLflow server is not trusted with paths): pass --checkpoint PATH to export from a "
            f"file you choose"
        )
    return named


def default_out(record: TrialJson) -> Path:
    """<sweep out>/export-trial-N when the folder trial.json names is a sweeper output folder on
    this machine (it holds spec.yaml); else ./export-trial-N. Never a path the record invents."""
    home = Path(record.out_dir)
    base = home if (home / "spec.yaml").is_file() else Path(".")
    return base / f"export-trial-{record.number}"


def export_trial(
    run_id: str, tracking_uri: str, formats: list[str] | None, out: Path | None, checkpoint: Path | None = None
) -> dict[str, Any]:
    """Rebuild the trial of MLflow run ``run_id`` from its checkpoint (or ``checkpoint``), export
    and verify it into ``out`` (default: see default_out), log the files to that run under export/."""
    from sweeper import export

    tracker = Tracker(tracking_uri)
    run, record = load_trial(tracker, run_id)
    number, state = record.number, run.data.tags.get(f"{TAG}state")
    if state != TrialState.COMPLETE:
        raise UserError(
            f"run {run_id} is trial {number}, which {state or 'has not finished'}: only a completed "
            f"trial has a checkpoint to export"
        )
    out = out or default_out(record)
    if checkpoint is not None:
        if not checkpoint.is_file():
            raise UserError(
                f"--checkpoint {checkpoint}: no such file; expected a checkpoint of trial {number} "
                f"(<sweep out>/checkpoints/trial-{number:05d}.pt)"
            )
    else:
        checkpoint = find_checkpoint(
            tracker, run_id, recorded_checkpoint(run_id, record), out, run.data.tags.get(f"{TAG}checkpoint")
        )
    if checkpoint is None:
        raise UserError(
            f"{record.checkpoint}: the checkpoint of trial {number} (run {run_id}) is gone; a sweep "
            f"keeps only the best trial's checkpoint unless its spec sets export.keep_checkpoints: all"
        )
    try:
        model, data, task = rebuild(record.spec, checkpoint)
    except CorruptCheckpoint as exc:
        raise UserError(f"{exc}; expected the checkpoint of trial {number} (run {run_id})") from None
    source = {"trial": number, "mlflow_run_id": run_id, "checkpoint": str(checkpoint)}
    report = export.export_model(model, data, out, record.spec.export, names=formats, source=source, task=task)
    tracker.log_files(run_id, export.artifacts(report), "export")
    return report
