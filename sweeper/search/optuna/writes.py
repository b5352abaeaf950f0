"""A trial's writes to the Optuna study, grouped into one transaction each where Optuna's public
calls take one a write: creating a batch's trials, claiming a trial (RUNNING, its owner, its
first heartbeat), the epochs it has done and its lease's renewal (``beat``), and finishing it
(every epoch's value, its info, its state and value). Each of Optuna's calls took 1-6 ms on this project's
2-core machine (sqlite), and a trial made about twelve of them, one more per epoch.

The rows are Optuna's, written with RDBStorage's own helpers (``_set_trial_attr_without_commit``,
``_set_trial_value_without_commit``) and models; the locking is that of Optuna's
``set_trial_state_values`` (the trial's row read FOR UPDATE, its state checked in the same
transaction), so a trial is claimed and finished once whatever the number of processes.
"""

from __future__ import annotations

import copy
import math
from datetime import datetime
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError

from sweeper.search.optuna.study import OWNER


def _rdb(study: optuna.Study) -> RDBStorage:
    storage = study._storage
    rdb = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache
    assert isinstance(rdb, RDBStorage), type(rdb)
    return rdb


def create(study: optuna.Study, templates: list[FrozenTrial]) -> list[FrozenTrial]:
    """New trials (templates made by ``optuna.trial.create_trial``: WAITING, params, attrs) in one
    transaction, as ``study.add_trial`` makes one: the study's row locked while their numbers are
    counted. Returns them with their storage ids and numbers."""
    rdb = _rdb(study)
    with _create_scoped_session(rdb.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study._study_id, session, for_update=True)
        made = [rdb._get_prepared_new_trial(study._study_id, t, session) for t in templates]
        session.flush()
        numbered = [(m.trial_id, m.number) for m in made]
    out = []
    for template, (trial_id, number) in zip(templates, numbered):
        trial = copy.deepcopy(template)
        trial._trial_id, trial.number = trial_id, number
        out.append(trial)
    return out


def claim(study: optuna.Study, trial_id: int, owner: str, user_attrs: dict[str, Any] | None = None) -> bool:
    """WAITING -> RUNNING for this process (``owner``) with its first heartbeat and
    ``user_attrs``; False when another process claimed it first."""
    rdb = _rdb(study)
    try:
        with _create_scoped_session(rdb.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            if trial.state != TrialState.WAITING:
                return False
            trial.state, trial.datetime_start = TrialState.RUNNING, datetime.now()
            rdb._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, OWNER, owner)
            for key, attr in (user_attrs or {}).items():
                rdb._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, attr)
            _heartbeat(session, trial_id)
    except IntegrityError:  # two processes created the heartbeat row at once: the other one won
        return False
    return True


def beat(study: optuna.Study, trial_id: int, epochs: dict[int, float], renew: bool = True) -> None:
    """The values of ``epochs`` a running trial has done since (what `sweeper status` shows),
    and its lease renewed if ``renew``. Nothing for a trial that has finished meanwhile."""
    rdb = _rdb(study)
    with _create_scoped_session(rdb.scoped_session, True) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
        if trial.state.is_finished():
            return
        _epochs(session, trial_id, epochs)
        if renew:
            _heartbeat(session, trial_id)


def finish(
    study: optuna.Study,
    trial_id: int,
    state: TrialState,
    values: list[float] | None,
    epochs: dict[int, float],
    user_attrs: dict[str, Any],
) -> FrozenTrial:
    """The trial's end, as ``study.tell`` records it (a pruned trial's value is its last epoch's),
    with ``epochs``' values and ``user_attrs``; ``values``: one per objective of the study.
    UpdateFinishedTrialError when another process has finished the trial already (its lease ran out)."""
    if state == TrialState.PRUNED and epochs:
        last = epochs[max(epochs)]
        values = [last] if not math.isnan(last) else None
    if state == TrialState.COMPLETE and (
        not values or len(values) != len(study.directions) or any(math.isnan(v) for v in values)
    ):
        raise ValueError(f"a complete trial needs {len(study.directions)} values, not {values}")  # as study.tell
    study._thread_local.cached_all_trials = None  # as study.tell: the study's cache of its trials
    rdb = _rdb(study)
    with _create_scoped_session(rdb.scoped_session) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
        rdb.check_trial_is_updatable(trial_id, trial.state)
        _epochs(session, trial_id, epochs)
        for key, attr in user_attrs.items():
            rdb._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, attr)
        for objective, value in enumerate(values or []):
            rdb._set_trial_value_without_commit(session, trial, objective, float(value))
        trial.state, trial.datetime_complete = state, datetime.now()
    return study._storage.get_trial(trial_id)


def _epochs(session: Any, trial_id: int, epochs: dict[int, float]) -> None:
    """Intermediate values (step = epoch), written or replaced."""
    model = models.TrialIntermediateValueModel
    rows = {row.step: row for row in model.where_trial_id(trial_id, session)} if epochs else {}
    for step, value in epochs.items():
        stored, kind = model.intermediate_value_to_stored_repr(value)
        row = rows.get(step)
        if row is None:
            session.add(model(trial_id=trial_id, step=step, intermediate_value=stored, intermediate_value_type=kind))
        else:
            row.intermediate_value, row.intermediate_value_type = stored, kind


def _heartbeat(session: Any, trial_id: int) -> None:
    """As RDBStorage.record_heartbeat, in the caller's transaction (the database's clock)."""
    row = models.TrialHeartbeatModel.where_trial_id(trial_id, session, True)
    if row is None:
        session.add(models.TrialHeartbeatModel(trial_id=trial_id))
    else:
        row.heartbeat = session.execute(sa.func.now()).scalar()
