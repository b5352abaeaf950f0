"""A sweep's trials as an in-memory Optuna study, whichever backend ran them (Ray has no study):
what Optuna's plots and importance evaluators read. Built from the trial records (summary.json's
``trials``) and the spec's search space."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState as OptunaState

from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import TrialState
from sweeper.track.records import TrialRecord

# the finished states a study holds (an interrupted attempt is not a trial of the study)
STATES = {
    TrialState.COMPLETE: OptunaState.COMPLETE,
    TrialState.PRUNED: OptunaState.PRUNED,
    TrialState.FAILED: OptunaState.FAIL,
}
PRIMITIVE = (type(None), bool, int, float, str)  # what Optuna's categorical choices may be


def distribution(param: Any) -> BaseDistribution:
    if isinstance(param, sp.FloatParam):
        return FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, sp.IntParam):
        return IntDistribution(param.low, param.high, log=param.log, step=param.step)
    return CategoricalDistribution([_choice(c) for c in param.choices])


def _choice(value: Any) -> Any:
    return value if isinstance(value, PRIMITIVE) else json.dumps(value, sort_keys=True)


def study_of(spec: SweepSpec, records: list[TrialRecord]) -> optuna.Study:
    """The finished trials (complete, pruned, failed) with their params, objective values (one
    per objective) and per-epoch objective (intermediate values), in trial number order."""
    metric, goals = spec.objective.metric, spec.goals
    spaces = {path: distribution(p) for path, p in spec.search.space.items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "a new study created in memory"
    study = optuna.create_study(study_name=spec.name, directions=[g.direction for g in goals])
    with warnings.catch_warnings():  # set_metric_names is experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([g.metric for g in goals])
    trials = []
    for r in sorted(records, key=lambda r: r.number):
        scores = r.scores(spec)
        if r.state not in STATES or (r.state == TrialState.COMPLETE and scores is None):
            continue
        params = {k: _choice(v) for k, v in r.params.items() if k in spaces}
        params = {k: v for k, v in params.items() if _within(spaces[k], v)}
        steps = {
            epoch: h[metric]
            for epoch, h in enumerate(r.history, 1)
            if isinstance(h.get(metric), (int, float)) and math.isfinite(h[metric])
        }
        trials.append(
            optuna.trial.create_trial(
                state=STATES[r.state],
                values=[scores[g.metric] for g in goals] if scores else None,
                params=params,
                distributions={k: spaces[k] for k in params},
                intermediate_values=steps,
                user_attrs={"number": r.number, "reason": r.reason or ""},
            )
        )
    study.add_trials(trials)
    return study


def _within(space: BaseDistribution, value: Any) -> bool:
    """A value the distribution holds (a spec edited since the trial ran may not), asked through
    Optuna's public API: a trial made with it is validated against its distribution."""
    try:
        optuna.trial.create_trial(state=OptunaState.WAITING, params={"p": value}, distributions={"p": space})
    except (ValueError, TypeError):
        return False
    return True
