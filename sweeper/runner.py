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
        summary["export"] = export_best(spec, summary["best"], out_dir)
        artifacts += [Path(e["path"]) for e in summary["export"] if "path" in e]
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


def export_best(spec: SweepSpec, best: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """Rebuild the best trial's model from its checkpoint and export it; one entry per format
    (an entry with ``error`` when that format failed: the others still run)."""
    from sweeper import checkpoint, export
    from sweeper.trial import build_model, load_data

    import torch

    best_spec = spec.with_values(best["params"])
    data, _ = load_data(best_spec, torch.device("cpu"))
    model = build_model(best_spec, data)
    model.load_state_dict(checkpoint.load(Path(best["checkpoint"]))["model"])
    example = data.val_x[: min(64, data.val_x.shape[0])]
    results = []
    for fmt in spec.export.formats:
        try:
            results.append(export.torchscript(model, example, out_dir / "model.torchscript.pt", spec.export.atol))
        except Exception as exc:  # one failed format must not lose the sweep or the others
            results.append({"format": fmt, "error": f"{type(exc).__name__}: {exc}"})
    return results
