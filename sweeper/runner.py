"""run_sweep(spec): resolve -> search -> best -> export -> record."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from sweeper import resolve
from sweeper.errors import UserError
from sweeper.spec import SweepSpec
from sweeper.tracking import Tracker
from sweeper.workers import InlineExecutor, ProcessPool

PARENT_RUN = "mlflow_parent_run"  # study user attr: {"uri", "run_id"} of the sweep's parent run


class Observer(Protocol):
    """Receives a sweep's progress (the CLI's rich display, or nothing in quiet mode)."""

    def started(self, spec: SweepSpec, out_dir: Path, done: int, remaining: int | None,
                requeued: list[int]) -> None: ...
    def event(self, event: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...


def default_out_dir(spec: SweepSpec) -> Path:
    return Path("runs") / spec.name


def run_sweep(spec: SweepSpec, out_dir: Path, observer: Observer) -> dict[str, Any]:
    """Run (or resume) the sweep into ``out_dir``; returns the summary also written there."""
    import torch

    resolve.check_plugins(spec)
    if spec.train.device == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device: 'cuda' was asked for but this machine has no CUDA device; "
                        "use 'auto' or 'cpu'")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))

    tracker = Tracker.for_spec(spec)
    started = time.perf_counter()
    warm = None
    if spec.search.backend == "ray":
        from sweeper.backends import ray as ray_backend

        records, parent, storage = ray_backend.run(spec, out_dir, tracker, observer)
    else:
        records, parent, storage, warm = _run_optuna(spec, out_dir, tracker, observer)
        spec = warm.spec if warm is not None else spec  # the LR finder may have narrowed the space
    summary = summarize(spec, records, out_dir, tracker, parent, storage)
    summary["search_seconds"] = time.perf_counter() - started  # this invocation's search, wall time
    if warm is not None:
        summary["lr_finder"] = {"note": warm.note, "policy": spec.search.lr_finder.policy,
                                "findings": [{"config": f.config, "suggestion": f.result.suggestion,
                                              "steps": f.result.steps, "seconds": f.result.seconds,
                                              "plot": str(f.plot)} for f in warm.findings]}
    artifacts = [out_dir / "spec.yaml"]
    if summary["best"] is not None and spec.export.formats:
        handed, files = handoff(spec, summary["best"], out_dir, tracker.uri, parent)
        summary.update(handed)
        artifacts += files
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    tracker.end_sweep(parent, summary, [summary_path, *artifacts])
    return summary


def _run_optuna(spec: SweepSpec, out_dir: Path, tracker: Tracker, observer: Observer):
    """The Optuna backend's search; returns (trial records, parent run id, storage URL, warm start)."""
    from sweeper.backends import optuna as backend

    study = backend.open_study(spec, out_dir)
    requeued = backend.recover_interrupted(study)
    previous = study.user_attrs.get(PARENT_RUN) or {}
    parent = tracker.start_sweep(spec, previous.get("run_id") if previous.get("uri") == tracker.uri else None)
    if parent and previous.get("run_id") != parent:
        study.set_user_attr(PARENT_RUN, {"uri": tracker.uri, "run_id": parent})

    done = backend.counted(study)
    remaining = None if spec.search.n_trials is None else max(0, spec.search.n_trials - done)
    observer.started(spec, out_dir, done, remaining, requeued)
    warm = None
    if spec.search.lr_finder.enabled:
        spec, warm = _warm_start(spec, study, out_dir, tracker, parent)
        observer.note(warm.note)
    if remaining != 0:
        coordinator = backend.Coordinator(spec, study, out_dir, tracker, parent, observer.event)
        n = spec.search.parallel
        executor = (InlineExecutor(coordinator.decide, coordinator.record) if n == 1
                    else ProcessPool(n, coordinator.decide, coordinator.record))
        try:
            coordinator.run(remaining, executor)
        finally:
            executor.close()
    records = [backend.record(t) for t in study.get_trials(deepcopy=False)]
    return records, parent, backend.storage_url(spec, out_dir), warm


def _warm_start(spec: SweepSpec, study: Any, out_dir: Path, tracker: Tracker, parent: str | None):
    """LR range tests before the search (cached in out_dir); returns the spec to search with."""
    from sweeper import warm_start
    from sweeper.seeding import configure_torch, threads_per_trial
    from sweeper.trainer import resolve_device

    configure_torch(threads=threads_per_trial(spec), deterministic=spec.train.deterministic)
    warm = warm_start.prepare(spec, out_dir, resolve_device(spec.train.device))
    if not study.get_trials(deepcopy=False):  # a resumed sweep has enqueued them already
        for params in warm.enqueue:
            study.enqueue_trial(params)
    tracker.log_lr_finder(parent, warm, out_dir / warm_start.CACHE)
    return warm.spec, warm


def best_record(spec: SweepSpec, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The completed trial with the best value, or None."""
    complete = [r for r in records if r["state"] == "complete" and r["value"] is not None]
    if not complete:
        return None
    pick = max if spec.objective.direction == "maximize" else min
    return pick(complete, key=lambda r: r["value"])


def summarize(spec: SweepSpec, records: list[dict[str, Any]], out_dir: Path, tracker: Tracker,
              parent: str | None, storage: str) -> dict[str, Any]:
    """summary.json from the per-trial records of either backend (see optuna.record)."""
    from sweeper.checkpoint import trial_path

    counts: dict[str, int] = {}
    for r in records:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    best = None
    b = best_record(spec, records)
    if b is not None:
        best = {k: b[k] for k in ("number", "params", "value", "seed", "mlflow_run_id")}
        best["metrics"] = b["history"][-1] if b["history"] else {}
        best["checkpoint"] = str(trial_path(out_dir, b["number"]))
    return {"name": spec.name, "out_dir": str(out_dir), "objective": spec.objective.model_dump(),
            "storage": storage, "counts": counts, "best": best,
            "mlflow": {"tracking_uri": tracker.uri, "experiment": tracker.experiment, "parent_run_id": parent},
            "spec": spec.model_dump(mode="json"), "trials": records}


def rebuild(trial_spec: SweepSpec, checkpoint_file: Path) -> tuple[Any, Any]:
    """A trial's trained model (on the CPU) and its data, from the trial's spec and checkpoint."""
    import torch

    from sweeper import checkpoint
    from sweeper.trial import build_model, load_data

    data, _ = load_data(trial_spec, torch.device("cpu"))
    model = build_model(trial_spec, data)
    model.load_state_dict(checkpoint.load(checkpoint_file)["model"])
    return model.eval(), data


def handoff(spec: SweepSpec, best: dict[str, Any], out_dir: Path, tracking_uri: str | None,
            parent: str | None) -> tuple[dict[str, Any], list[Path]]:
    """Export the best trial's model to every format of ``spec.export`` (export.json) and
    register it under the sweep's run. Returns the summary's ``export`` and ``registry``
    entries and the files to log; a failure is recorded there, never fatal to the sweep."""
    from sweeper import export
    from sweeper.export import publish

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
