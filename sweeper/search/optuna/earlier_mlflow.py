"""An MLflow experiment as a source of lessons (``search.warm_start: [mlflow:EXPERIMENT]``): the
finished trials of the sweeps logged there, read from their trial runs (tagged
``sweeper.kind=trial``) at the spec's tracking URI. A trial run holds what a study holds of a
trial: its state (tag ``sweeper.state``), its parameters (as flat params, text: read back by the
type of the new space's entry of each path), its objective per epoch (metric history: a complete
trial's values are the last epoch's, a pruned trial's last reported value is its last step).

This also reads sweeps whose study (output folder, database) is gone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState as OptunaState

from sweeper.errors import UserError
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import TrialState
from sweeper.track.mlflow import TAG, redact, resolve_uri

PREFIX = "mlflow:"
STATES = {TrialState.COMPLETE.value: OptunaState.COMPLETE, TrialState.PRUNED.value: OptunaState.PRUNED}


@dataclass(frozen=True)
class Finished:
    """One finished trial of an earlier sweep, as its run logged it."""

    number: int
    state: OptunaState  # COMPLETE or PRUNED
    params: dict[str, Any]  # the new space's paths the run had, typed by that space
    values: list[float] | None  # complete: every objective's last value
    intermediate: dict[int, float]  # the first objective by epoch (pruned trials)
    device_seconds: float | None = None  # what it cost; a trial run does not log it (None)


def trials(spec: SweepSpec, index: int, experiment: str) -> list[Finished]:
    """The finished trials logged in ``experiment``, ordered by sweep (its run's start) then
    number. UserError naming ``search.warm_start[index]`` when there is no such experiment, it
    holds no trial run, or its sweeps measured another objective."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    where = f"search.warm_start[{index}]"
    uri = resolve_uri(spec.tracking.mlflow_uri)
    client = MlflowClient(uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise UserError(f"{where}: no MLflow experiment {experiment!r} at {redact(uri)} (tracking.mlflow_uri)")
        runs = client.search_runs(
            [found.experiment_id], filter_string=f"tags.`{TAG}kind` = 'sweep'", order_by=["attributes.start_time ASC"]
        )
        metrics = [g.metric for g in spec.goals]
        for run in runs:
            theirs = run.data.params.get("objective")
            if theirs is not None and theirs != metrics[0]:
                raise UserError(
                    f"{where}: the sweep {run.info.run_name!r} in MLflow experiment {experiment!r} measured "
                    f"{theirs}; this sweep measures {', '.join(metrics)}: its values do not compare"
                )
        out: list[Finished] = []
        for sweep in runs:
            children = client.search_runs(
                [found.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{sweep.info.run_id}' and tags.`{TAG}kind` = 'trial'",
            )
            done = [run for run in children if run.data.tags.get(f"{TAG}state") in STATES]
            for run in sorted(done, key=lambda run: int(run.data.tags.get(f"{TAG}trial", -1))):
                out.append(_finished(client, spec, run, metrics))
    except MlflowException as exc:
        raise UserError(f"{where}: MLflow at {redact(uri)} could not be read: {str(exc).splitlines()[0]}") from None
    if not out:
        raise UserError(f"{where}: MLflow experiment {experiment!r} holds no finished trial of a sweep")
    return out


def _finished(client: Any, spec: SweepSpec, run: Any, metrics: list[str]) -> Finished:
    state = STATES[run.data.tags[f"{TAG}state"]]
    logged = run.data.params
    params = {path: _typed(param, logged[path]) for path, param in spec.search.space.items() if path in logged}
    history = client.get_metric_history(run.info.run_id, metrics[0])
    intermediate = {int(m.step): float(m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))}
    last = {m: run.data.metrics.get(m) for m in metrics}
    values = [float(v) for v in last.values() if v is not None] if state == OptunaState.COMPLETE else None
    return Finished(int(run.data.tags[f"{TAG}trial"]), state, params, values, intermediate)


def _typed(param: sp.Param, text: str) -> Any:
    """A flat param's text (trial_runs.flat_params: JSON for a plugin argument, str() for a train
    setting) as the value the new space's entry takes; text it cannot read stays text (and fits no
    choice)."""
    if isinstance(param, sp.FloatParam | sp.IntParam):
        try:
            return float(text)
        except ValueError:
            return text
    for value in (text, {"True": "true", "False": "false", "None": "null"}.get(text, text)):
        try:
            return json.loads(value)
        except ValueError:
            continue
    return text
