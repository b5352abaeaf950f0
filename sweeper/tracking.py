"""MLflow: one parent run per sweep, one nested run per trial, one batched call per epoch.

Uses ``MlflowClient`` (explicit run ids, no global active run) so worker processes can log
their own trials under the same parent.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.spec import SweepSpec

if TYPE_CHECKING:
    from sweeper.workers import Task

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow's own default, in the current directory
TAG = "sweeper."


def tracking_uri(spec: SweepSpec) -> str:
    return spec.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def flat_params(spec: SweepSpec) -> dict[str, str]:
    """The parts of a resolved spec that define a trial, as dotted MLflow params."""
    out = {}
    for section in ("dataset", "model", "optimizer", "schedule"):
        ref = getattr(spec, section)
        out[f"{section}.plugin"] = ref.plugin
        out.update({f"{section}.args.{k}": json.dumps(v) if not isinstance(v, str) else v
                    for k, v in ref.args.items()})
    out.update({f"train.{k}": str(v) for k, v in spec.train.model_dump().items()})
    return out


class Tracker:
    """Logs a sweep; a disabled tracker (tracking.enabled: false) does nothing."""

    def __init__(self, uri: str | None, experiment: str | None) -> None:
        self.uri = uri
        self.experiment = experiment
        self._client = None
        if uri is not None:
            from mlflow.tracking import MlflowClient

            # MLflow logs its database set-up at INFO; the sweep's own display says what matters.
            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)

            self._client = MlflowClient(tracking_uri=uri)

    @classmethod
    def for_spec(cls, spec: SweepSpec) -> Tracker:
        if not spec.tracking.enabled:
            return cls(None, None)
        return cls(tracking_uri(spec), spec.tracking.experiment or spec.name)

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @functools.cached_property
    def _experiment_id(self) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        return found.experiment_id if found else self._client.create_experiment(self.experiment)

    def start_sweep(self, spec: SweepSpec, resume_run_id: str | None) -> str | None:
        """The sweep's parent run: a new one, or the run of the sweep being resumed."""
        if not self.enabled:
            return None
        if resume_run_id:
            self._client.update_run(resume_run_id, status="RUNNING")
            return resume_run_id
        run = self._client.create_run(self._experiment_id, run_name=spec.name,
                                      tags={f"{TAG}kind": "sweep", f"{TAG}git_rev": git_revision() or "unknown"})
        run_id = run.info.run_id
        self._client.log_dict(run_id, spec.model_dump(mode="json"), "spec.json")
        self._client.log_batch(run_id, params=_params({"seed": str(spec.seed), "sampler": spec.search.sampler,
                                                       "pruner": spec.search.pruner.type,
                                                       "n_trials": str(spec.search.n_trials),
                                                       "objective": spec.objective.metric}))
        return run_id

    def start_trial(self, parent_id: str | None, number: int, seed: int, spec: SweepSpec,
                    replay: dict[str, Any], tags: dict[str, str]) -> str | None:
        """A nested run under the sweep's run; ``replay`` (trial.json) is what `sweeper replay` needs."""
        if not self.enabled:
            return None
        from mlflow.entities import RunTag

        run = self._client.create_run(self._experiment_id, run_name=f"trial-{number}",
                                      tags={"mlflow.parentRunId": parent_id, f"{TAG}kind": "trial"})
        all_tags = {f"{TAG}trial": str(number), f"{TAG}seed": str(seed), **{f"{TAG}{k}": v for k, v in tags.items()}}
        self._client.log_batch(run.info.run_id, params=_params(flat_params(spec)),
                               tags=[RunTag(k, v) for k, v in all_tags.items()])
        self._client.log_dict(run.info.run_id, replay, "trial.json")
        return run.info.run_id

    def start_task(self, parent_id: str | None, task: Task, sweep_seed: int, git_rev: str,
                   sampler_seed: int | None, tags: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> str | None:
        """start_trial for a backend's Task: trial.json holds what `sweeper replay` needs."""
        if not self.enabled:
            return None
        from sweeper import resolve

        trial_spec = SweepSpec.model_validate(task.spec)
        plugins = resolve.provenance(trial_spec)
        replay = {"number": task.number, "seed": task.seed, "params": task.params, "spec": task.spec,
                  "threads": task.threads, "sweep_seed": sweep_seed, "git_rev": git_rev,
                  "sampler_seed": sampler_seed, "plugins": plugins, **(extra or {})}
        return self.start_trial(parent_id, task.number, task.seed, trial_spec, replay,
                                tags={"git_rev": git_rev, "sweep_seed": str(sweep_seed),
                                      "plugins": json.dumps(plugins), **(tags or {})})

    def open_trials(self, parent_id: str | None, tags: dict[str, str] | None = None) -> list[str]:
        """Run ids of the sweep's trial runs still marked RUNNING (with these sweeper tags, if given)."""
        if parent_id is None:
            return []
        exp = self._client.get_run(parent_id).info.experiment_id
        having = "".join(f" and tags.`{TAG}{k}` = '{v}'" for k, v in (tags or {}).items())
        runs = self._client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent_id}' "
                                                             f"and attributes.status = 'RUNNING'{having}")
        return [r.info.run_id for r in runs]

    def reopen_trial(self, run_id: str | None, tags: dict[str, str]) -> None:
        """A trial run goes on (its trial resumed from its checkpoint): RUNNING again, tagged."""
        if run_id is None:
            return
        from mlflow.entities import RunTag

        self._client.update_run(run_id, status="RUNNING")
        self._client.log_batch(run_id, tags=[RunTag(f"{TAG}{k}", v) for k, v in tags.items()])

    def log_history(self, run_id: str | None, history: list[dict[str, float]]) -> None:
        """Epochs 1..len(history) at once (a PBT trial's inherited start), within MLflow's
        1,000 metrics per batch."""
        if run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, epoch) for epoch, h in enumerate(history, 1) for k, v in h.items()]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(run_id, metrics=metrics[i:i + 1000])

    def log_epoch(self, run_id: str | None, epoch: int, metrics: dict[str, float]) -> None:
        if run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(run_id, metrics=[Metric(k, float(v), now, epoch) for k, v in metrics.items()])

    def end_trial(self, run_id: str | None, state: str, reason: str | None, error: str | None = None,
                  info: dict[str, Any] | None = None) -> None:
        if run_id is None:
            return
        from mlflow.entities import RunTag

        tags = {f"{TAG}state": state, **{f"{TAG}{k}": str(v) for k, v in (info or {}).items()}}
        if reason:
            tags[f"{TAG}reason"] = reason[:5000]
        self._client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        if error:
            self._client.log_text(run_id, error, "error.txt")
        status = {"failed": "FAILED", "interrupted": "KILLED"}.get(state, "FINISHED")
        self._client.set_terminated(run_id, status=status)

    def log_lr_finder(self, run_id: str | None, warm: Any, cache: Path) -> None:
        """The range tests on the sweep's run: curves as images, suggestions and policy as params."""
        if run_id is None:
            return
        from mlflow.entities import RunTag

        params = {"lr_finder.policy": warm.spec.search.lr_finder.policy}
        params.update({f"lr_finder.suggestion.{i}": str(f.result.suggestion) for i, f in enumerate(warm.findings)})
        self._client.log_batch(run_id, params=_params(params), tags=[RunTag(f"{TAG}lr_finder", warm.note[:5000])])
        for f in warm.findings:
            self._client.log_artifact(run_id, str(f.plot), "lr_finder")
        self._client.log_artifact(run_id, str(cache), "lr_finder")

    def end_sweep(self, run_id: str | None, summary: dict[str, Any], artifacts: list[Path]) -> None:
        if run_id is None:
            return
        from mlflow.entities import Metric

        best = summary.get("best") or {}
        now = int(time.time() * 1000)
        metrics = [Metric(f"best_{k}", float(v), now, 0) for k, v in (best.get("metrics") or {}).items()]
        counts = {f"trials_{state}": n for state, n in summary["counts"].items()}
        metrics += [Metric(k, float(v), now, 0) for k, v in counts.items()]
        tags = {f"{TAG}best_trial": str(best.get("number")), f"{TAG}best_run_id": str(best.get("mlflow_run_id"))}
        from mlflow.entities import RunTag

        self._client.log_batch(run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
        for path in artifacts:
            self._client.log_artifact(run_id, str(path))
        self._client.set_terminated(run_id, status="FINISHED")


def _params(values: dict[str, str]) -> list:
    from mlflow.entities import Param

    return [Param(k, str(v)[:6000]) for k, v in values.items()]  # MLflow caps a param at 6,000 chars


def trial_record(run_id: str, uri: str) -> tuple[Any, dict[str, Any]]:
    """A trial's MLflow run and its ``trial.json`` (what replay and export rebuild it from)."""
    import tempfile

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from sweeper.errors import UserError

    # one small JSON file: MLflow's download progress bar would only clutter the output
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
        with tempfile.TemporaryDirectory() as tmp:
            record = json.loads(Path(client.download_artifacts(run_id, "trial.json", tmp)).read_text())
    except (MlflowException, OSError) as exc:
        raise UserError(f"run {run_id} at {uri}: not a sweeper trial run with trial.json "
                        f"({str(exc).splitlines()[0]}); list trial runs in the MLflow UI") from None
    return run, record

