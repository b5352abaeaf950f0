"""run_sweep(spec): check -> warm start -> search (any backend) -> keep checkpoints -> best ->
export -> record. Nothing here depends on which backend searches."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from sweeper.errors import UserError
from sweeper.pluginhost.binding import check_plugins
from sweeper.search import backend, checkpoints
from sweeper.search.backend import Observer, SearchContext, SearchResult
from sweeper.search.trial_runs import SweepInfo, end_sweep_run, git_revision, start_sweep_run
from sweeper.spec import SweepSpec
from sweeper.track.mlflow import Tracker, resolve_uri
from sweeper.track.records import TrialRecord
from sweeper.trial.checkpoint import trial_path

STATE_FILE = "sweep.json"  # in --out: the MLflow run a re-run of the sweep resumes into


class SweepState(BaseModel):
    """<out>/sweep.json: what a re-run needs beyond the backend's own storage."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = 1
    tracking_uri: str | None = None
    parent_run_id: str | None = None

    @classmethod
    def read(cls, out_dir: Path) -> SweepState:
        path = out_dir / STATE_FILE
        try:
            return cls.model_validate_json(path.read_text()) if path.exists() else cls()
        except ValidationError:
            raise UserError(f"{path}: not the sweep state sweeper writes; remove it to start the sweep's "
                            f"MLflow record afresh") from None


def default_out_dir(spec: SweepSpec) -> Path:
    return Path("runs") / spec.name


def tracker_for(spec: SweepSpec) -> Tracker:
    if not spec.tracking.enabled:
        return Tracker(None)
    return Tracker(resolve_uri(spec.tracking.mlflow_uri), spec.tracking.experiment or spec.name)


def run_sweep(spec: SweepSpec, out_dir: Path, observer: Observer) -> dict[str, Any]:
    """Run (or resume) the sweep into ``out_dir``; returns the summary also written there."""
    import torch

    check_plugins(spec)
    if spec.train.device == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device: 'cuda' was asked for but this machine has no CUDA device; "
                        "use 'auto' or 'cpu'")
    searcher = backend.load(spec.search.backend)
    searcher.check(spec, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    tracker = tracker_for(spec)
    previous = SweepState.read(out_dir)
    parent = start_sweep_run(tracker, spec, previous.parent_run_id if previous.tracking_uri == tracker.uri else None)
    (out_dir / STATE_FILE).write_text(SweepState(tracking_uri=tracker.uri, parent_run_id=parent).model_dump_json())
    observer.started(spec, out_dir)

    warm = None
    if spec.search.lr_finder.enabled:
        from sweeper.search import warm_start

        warm = warm_start.prepare(spec, out_dir)
        warm_start.log(tracker, parent, warm, out_dir)
        observer.note(warm.note)
        spec = warm.spec  # the LR finder may have narrowed the space
    ctx = SearchContext(out_dir, tracker, SweepInfo(parent, spec.seed, str(out_dir.resolve()), git_revision()),
                        observer, enqueue=list(warm.enqueue) if warm else [])
    started = time.perf_counter()
    try:
        result = searcher.run(spec, ctx)
    except BaseException as exc:  # the sweep's run says it stopped; a re-run resumes it
        with contextlib.suppress(Exception):  # the original error is what the user must see
            tracker.end_run(parent, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    checkpoints.prune(spec, result.records, out_dir)
    summary = summarize(spec, result, out_dir, tracker, parent)
    summary["search_seconds"] = time.perf_counter() - started  # this invocation's search, wall time
    if warm is not None:
        summary["lr_finder"] = warm.summary()
    files = [out_dir / "spec.yaml"]
    if summary["best"] is not None and spec.export.formats:
        handed, exported = handoff(spec, summary["best"], out_dir, tracker.uri, parent)
        summary.update(handed)
        files += exported
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    end_sweep_run(tracker, parent, summary, [summary_path, *files])
    return summary


def summarize(spec: SweepSpec, result: SearchResult, out_dir: Path, tracker: Tracker,
              parent: str | None) -> dict[str, Any]:
    """summary.json: the resolved spec, the best trial and every trial, whichever backend ran them."""
    records: list[TrialRecord] = result.records
    counts: dict[str, int] = {}
    for r in records:
        counts[r.state] = counts.get(r.state, 0) + 1
    best = None
    top = checkpoints.best(spec, records)
    if top is not None:
        best = {"number": top.number, "params": top.params, "value": top.value, "seed": top.seed,
                "mlflow_run_id": top.mlflow_run_id, "metrics": top.history[-1] if top.history else {},
                "checkpoint": str(trial_path(out_dir, top.number))}
    return {"name": spec.name, "out_dir": str(out_dir), "objective": spec.objective.model_dump(),
            "storage": result.storage, "counts": counts, "best": best,
            "mlflow": {"tracking_uri": tracker.uri, "experiment": tracker.experiment, "parent_run_id": parent},
            "spec": spec.model_dump(mode="json"), "trials": [r.model_dump(mode="json") for r in records]}


def handoff(spec: SweepSpec, best: dict[str, Any], out_dir: Path, tracking_uri: str | None,
            parent: str | None) -> tuple[dict[str, Any], list[Path]]:
    """Export the best trial's model to every format of ``spec.export`` (export.json) and
    register it under the sweep's run. Returns the summary's ``export`` and ``registry``
    entries and the files to log; a failure is recorded there, never fatal to the sweep."""
    from sweeper import export
    from sweeper.export import publish
    from sweeper.trial.build import rebuild

    try:
        model, data = rebuild(spec.with_values(best["params"]), Path(best["checkpoint"]))
    except Exception as exc:
        return {"export": {"error": f"rebuilding trial {best['number']} from {best['checkpoint']} failed: "
                                    f"{type(exc).__name__}: {exc}"}}, []
    source = {"trial": best["number"], "mlflow_run_id": best["mlflow_run_id"], "checkpoint": best["checkpoint"],
              "objective": {spec.objective.metric: best["value"]}}
    handed: dict[str, Any] = {"export": export.export_model(model, data, out_dir, spec.export, source=source)}
    if parent is not None:
        try:
            handed["registry"] = publish.register(model, data, spec, tracking_uri, parent, best["value"])
        except Exception as exc:  # the sweep and its files are done: keep them
            handed["registry"] = {"error": f"registering the model in MLflow failed: {type(exc).__name__}: {exc}"}
    return handed, export.artifacts(handed["export"])
