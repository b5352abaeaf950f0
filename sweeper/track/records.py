"""The records that cross module boundaries, typed once: a trial as the table and summary.json
show it (TrialRecord), what a running sweep tells its display (TrialEvent), and trial.json
(TrialJson), the artifact on each trial's MLflow run from which `sweeper replay` and
`sweeper export RUN_ID` rebuild the trial. Both backends build the same records; every reader
validates what it reads."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sweeper.errors import UserError
from sweeper.spec import SweepSpec
from sweeper.states import FailureKind, TrialState
from sweeper.track.mlflow import Tracker

TRIAL_JSON = "trial.json"
TRIAL_JSON_VERSION: Final = 1  # bump on an incompatible change of TrialJson's fields


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrialRecord(_Record):
    """One trial, as summary.json and the progress table show it (either backend)."""

    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None = None  # the objective's value of the last epoch (complete trials)
    values: dict[str, float] = {}  # complete trials: every objective's value, by metric (spec.goals)
    footprint: dict[str, float] = {}  # its trained model's params (and latency_ms): trial/footprint.py
    seed: int | None = None
    reason: str | None = None  # why it was pruned or failed
    failure: FailureKind | None = None  # a failure the search answers (a retry); None: the trial's own
    epochs: int = 0
    seconds: float | None = None  # training time in its worker (a fused trial: its fused model's)
    device_seconds: float | None = None  # seconds × devices it held (GPUs, or CPU threads): search.budget
    fused_with: list[int] = []  # the trials it trained with as one fused model (itself included)
    device: str | None = None
    mlflow_run_id: str | None = None
    history: list[dict[str, float]] = []  # per-epoch metrics
    node_id: str | None = None  # the Ray node it ran on (backend ray)
    node_ip: str | None = None
    restarts: int = 0  # times it continued from its own checkpoint (backend ray)
    exploits: list[dict[str, Any]] = []  # PBT: {epoch, donor, params} per exploit

    @model_validator(mode="before")
    @classmethod
    def _failure_of_older_records(cls, data: Any) -> Any:
        """A failed record without ``failure`` (summary.json and Optuna trials of an older sweeper)
        said it in its reason's prefix: "oom: ..." (out of memory), "interrupted: ..." (its
        process died or lost its lease)."""
        if not isinstance(data, dict) or data.get("failure") is not None or data.get("state") != TrialState.FAILED:
            return data
        reason, oom = data.get("reason") or "", FailureKind.OUT_OF_MEMORY.value
        if reason == oom or reason.startswith(f"{oom}:"):
            return {**data, "failure": FailureKind.OUT_OF_MEMORY}
        if reason.startswith(TrialState.INTERRUPTED.value):
            return {**data, "failure": FailureKind.LOST_WORKER}
        return data

    def scores(self, spec: SweepSpec) -> dict[str, float] | None:
        """A complete trial's objective values by metric (what the Pareto front and export.choose
        compare); None for other trials. Records of an older sweeper hold ``value`` alone."""
        if self.state != TrialState.COMPLETE:
            return None
        if self.values:
            return dict(self.values)
        return {spec.objective.metric: self.value} if self.value is not None and len(spec.goals) == 1 else None


def goal_values(spec: SweepSpec, last: dict[str, float], footprint: dict[str, float]) -> dict[str, float]:
    """A complete trial's objective values: its last epoch's metrics and its model's footprint."""
    found = {**footprint, **last}
    return {g.metric: float(found[g.metric]) for g in spec.goals if g.metric in found}


def objective_values(spec: SweepSpec, history: list[dict[str, float]], info: dict[str, Any]) -> list[float] | None:
    """A complete trial's values, one per objective in the spec's order (the study's), from its
    history and its info's footprint; None when one was not measured."""
    found = goal_values(spec, history[-1], info.get("footprint", {})) if history else {}
    return [found[g.metric] for g in spec.goals] if len(found) == len(spec.goals) else None


class TrialEvent(_Record):
    """What a running sweep tells its observer: a trial started, finished an epoch, or ended."""

    kind: Literal["start", "epoch", "end"]
    number: int
    params: dict[str, Any] = {}
    epoch: int | None = None
    metrics: dict[str, float] = {}
    record: TrialRecord | None = None  # kind "end"

    @classmethod
    def start(cls, number: int, params: dict[str, Any] | None = None) -> TrialEvent:
        return cls(kind="start", number=number, params=params or {})

    @classmethod
    def epoch_end(cls, number: int, epoch: int, metrics: dict[str, float]) -> TrialEvent:
        return cls(kind="epoch", number=number, epoch=epoch, metrics=metrics)

    @classmethod
    def end(cls, record: TrialRecord) -> TrialEvent:
        return cls(kind="end", number=record.number, record=record)


class TrialJson(_Record):
    """trial.json: everything `sweeper replay` needs to train the trial again, and
    `sweeper export RUN_ID` needs to rebuild its model; the same keys on both backends."""

    schema_version: Literal[1]
    number: int
    seed: int  # the trial's seed (the "trial" stream of the sweep seed)
    params: dict[str, Any]
    spec: SweepSpec  # the sweep's spec with the params applied
    threads: int  # torch CPU threads it trained with (float results depend on them)
    sweep_seed: int
    sampler_seed: int | None  # the search algorithm's seed when it proposed the trial
    data_seed: int  # what the data set plugin was given
    plugins: dict[str, str]  # "model.cnn": "dist==version", per plugin the trial used
    git_rev: str
    checkpoint: str  # where the sweep keeps (or kept) its final training state
    out_dir: str  # the sweep's output folder
    exploits: list[dict[str, Any]] = []  # PBT: the exploits of its lineage when its run started


def read_trial_json(data: Any, run_id: str) -> TrialJson:
    """Validate a trial.json read from run ``run_id``; a UserError names the bad field."""
    if isinstance(data, dict) and "schema_version" not in data:
        raise UserError(
            f"run {run_id}: its trial.json has no schema_version: it was written by an older sweeper "
            f"(before version {TRIAL_JSON_VERSION}); replay or export it with that sweeper"
        )
    try:
        return TrialJson.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
            + ("" if e["type"] == "missing" else f" (got {e.get('input')!r:.80})")
            for e in exc.errors()[:3]
        )
        raise UserError(
            f"run {run_id}: its trial.json is not valid: {problems}; it is not the file sweeper "
            f"wrote (expected schema version {TRIAL_JSON_VERSION})"
        ) from None


def load_trial(tracker: Tracker, run_id: str) -> tuple[Any, TrialJson]:
    """A trial's MLflow run and its validated trial.json; a UserError when either is missing or
    the file is not what sweeper wrote."""
    try:
        run = tracker.get_run(run_id)
        data = tracker.read_json(run_id, TRIAL_JSON)
    except LookupError as exc:
        raise UserError(
            f"{exc}: not a sweeper trial run with {TRIAL_JSON}; list trial runs in the MLflow UI "
            f"(the nested runs of a sweep)"
        ) from None
    return run, read_trial_json(data, run_id)
