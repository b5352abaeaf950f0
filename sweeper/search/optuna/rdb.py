"""The one module that reaches into Optuna beyond its public API (the adapter): the rest of sweeper
uses these functions and Optuna's public API only.

Why: Optuna's public calls take one transaction a write, and a live ``optuna.Trial`` has no system
attrs since Optuna 5, while a sweep served by many processes needs a trial claimed, renewed and
finished in one transaction each (the trial's row read FOR UPDATE, its state checked in the same
transaction, as Optuna's ``set_trial_state_values`` does): a trial is claimed and finished once
whatever the number of processes. Optuna's own calls (a transaction each, and a trial made one
more each epoch) were a large part of a trial's orchestration
(docs/speed.md#orchestration-timed-directly).

What it relies on, each present in Optuna 4.6.0 and 5.1.0, the ends of pyproject.toml's range
(tests/test_optuna_adapter.py exercises every function against a real sqlite and PostgreSQL
storage, and runs again on each end: constraints/optuna-lowest.txt and -newest.txt):

- ``Study._storage`` and ``Study._study_id``; ``FrozenTrial._trial_id`` and ``Trial._trial_id``:
  the handles of a study and a trial in their storage;
- ``Study._thread_local.cached_all_trials``: the study's cache of its trials, cleared as
  ``study.tell`` clears it;
- InMemoryStorage's ``_lock``, ``_studies``, ``_max_trial_id``, ``_trial_id_to_study_id_and_number``
  and ``_update_cache`` (``add_shared``: a view's trials added as its create_new_trial adds a
  template, less the deep copy);
- the ``_CachedStorage`` wrapper's ``_backend`` (the RDBStorage behind a study's storage);
- ``optuna.storages._rdb.models`` (StudyModel, TrialModel, its param, attribute, value (and
  ``value_to_stored_repr``), intermediate value and heartbeat models) and ``_rdb.storage._create_scoped_session``;
- the rows Optuna writes for a new trial (``create``: as RDBStorage's ``_get_prepared_new_trial``
  writes them), RDBStorage's ``_set_trial_attr_without_commit``,
  ``_set_trial_value_without_commit`` (it takes the TrialModel since Optuna 4.6, the trial's id
  before: hence the range's floor), ``_get_stale_trial_ids`` and ``_get_trials`` (study id, states,
  trial ids, an id above which every trial is read: how Optuna's cache reads);
- RDBStorage's ``engine`` and ``scoped_session`` attributes (``on_engine``: the storage moved onto
  the process's shared engine);
- public storage methods reached through ``_storage`` (get_trial, get_trial_system_attrs,
  set_trial_system_attr, set_trial_user_attr, set_trial_state_values, record_heartbeat): Optuna 5
  removed ``Trial.system_attrs`` and ``Trial.set_system_attr``, and a lost trial of another
  process has no ``optuna.Trial`` here.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from datetime import datetime
from typing import Any

import optuna
import sqlalchemy as sa
from optuna import distributions
from optuna.distributions import BaseDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import orm
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sweeper.search.optuna.engine import riding_out

__all__ = [
    "beat",
    "claim",
    "create",
    "expired",
    "fail",
    "finish",
    "finished_trials",
    "running",
    "record_heartbeat",
    "set_system_attr",
    "set_user_attr",
    "states_after",
    "stored",
    "study_id",
    "system_attrs",
    "trial_id",
    "unfinished",
    "waiting",
    "whole",
]


# --- handles and reads (any Optuna storage) -------------------------------------------------------


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    """The trial's id in its storage (``_trial_id``), the key of every write below."""
    return int(trial._trial_id)


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage (``_study_id``): optuna-dashboard's URL of the study."""
    return int(study._study_id)


def _storage(study: optuna.Study) -> BaseStorage:
    return study._storage


def stored(study: optuna.Study, trial_id: int) -> FrozenTrial:
    """The trial as stored now, system attrs included (a live ``optuna.Trial`` has none since Optuna 5)."""
    return _storage(study).get_trial(trial_id)


def add_shared(view: optuna.Study, trials: list[FrozenTrial]) -> None:
    """Add finished ``trials`` to an in-memory study (a view, batches.py and finished.py) as
    ``view.add_trials`` does, less its deep copy of each: the view's trials share their params,
    distributions, attrs and epochs with ``trials``. Nothing changes those in place (InMemoryStorage
    copies a trial before it writes to it, and a finished trial takes no writes), and the copy was
    most of a view's cost: 1 ms a trial, 3 s a batch at 3,000 trials (benchmarks/sampling_cost.py).
    Relies on InMemoryStorage's ``_lock``, ``_studies``, ``_max_trial_id``,
    ``_trial_id_to_study_id_and_number`` and ``_update_cache``, which its create_new_trial uses."""
    storage, sid = _storage(view), study_id(view)
    assert isinstance(storage, optuna.storages.InMemoryStorage), "a view lives in memory"
    with storage._lock:
        held = storage._studies[sid].trials
        for t in trials:
            assert t.state.is_finished(), "a view shares finished trials only"
            t._validate()
            shared = copy.copy(t)
            storage._max_trial_id += 1
            shared.number, shared._trial_id = len(held), storage._max_trial_id
            storage._trial_id_to_study_id_and_number[shared._trial_id] = (sid, shared.number)
            held.append(shared)
            storage._update_cache(shared._trial_id, sid)
    view._thread_local.cached_all_trials = None


def system_attrs(trial: optuna.Trial) -> dict[str, Any]:
    """A live trial's system attrs as stored (``Trial.system_attrs`` was removed in Optuna 5)."""
    return dict(_storage(trial.study).get_trial_system_attrs(trial_id(trial)))


def set_system_attr(study: optuna.Study, trial_id: int, key: str, value: Any) -> None:
    """A system attr of any unfinished trial of the study (``Trial.set_system_attr`` was removed in
    Optuna 5). UpdateFinishedTrialError when the trial has finished."""
    _storage(study).set_trial_system_attr(trial_id, key, value)


def set_user_attr(study: optuna.Study, trial_id: int, key: str, value: Any) -> None:
    """A user attr of an unfinished trial that this process holds no ``optuna.Trial`` of (a lost
    trial of another process). UpdateFinishedTrialError when the trial has finished."""
    _storage(study).set_trial_user_attr(trial_id, key, value)


def record_heartbeat(study: optuna.Study, trial_id: int) -> None:
    """The trial's heartbeat, now (the database's clock): Optuna writes it only inside study.optimize."""
    _rdb(study).record_heartbeat(trial_id)


def fail(study: optuna.Study, trial_id: int) -> bool:
    """A RUNNING trial made FAIL; False if it has finished (or another process failed it) meanwhile."""
    try:
        return _storage(study).set_trial_state_values(trial_id, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False


def expired(study: optuna.Study) -> set[int]:
    """The ids of the study's RUNNING trials whose heartbeat is older than the storage's
    ``grace_period`` (Optuna's own check, ``_get_stale_trial_ids``: the database's clock)."""
    return set(_rdb(study)._get_stale_trial_ids(study_id(study)))


def waiting(study: optuna.Study) -> list[FrozenTrial]:
    """The study's WAITING trials, read from the storage itself (Optuna's cache would read every
    running trial again with them): their ids (one statement), then, if any, the trials whole."""
    ids = {tid for tid, _ in _listed(study, [TrialState.WAITING], models.TrialUserAttributeModel, "")}
    return [t for t in _whole(study, ids, [TrialState.WAITING]) if t._trial_id in ids]


def running(study: optuna.Study, key: str) -> list[tuple[int, Any]]:
    """(id, system attr ``key`` or None) of the study's RUNNING trials: one statement of two
    columns (lease.py: which trials' owners stopped)."""
    return _listed(study, [TrialState.RUNNING], models.TrialSystemAttributeModel, key)


def unfinished(study: optuna.Study, key: str) -> list[tuple[int, Any]]:
    """(id, user attr ``key`` or None) of the study's WAITING and RUNNING trials: one statement of
    two columns (the proposer: which batches still run)."""
    return _listed(study, [TrialState.WAITING, TrialState.RUNNING], models.TrialUserAttributeModel, key)


def count_without(study: optuna.Study, key: str) -> int:
    """How many of the study's trials have no true system attr ``key``: one statement of two
    columns, where a read of every trial whole took 16 s at 10,000 trials (store.py)."""
    return sum(not value for _, value in _listed(study, list(TrialState), models.TrialSystemAttributeModel, key))


def whole(study: optuna.Study, ids: set[int]) -> list[FrozenTrial]:
    """The trials of ``ids``, whole, in whatever state."""
    return [t for t in _whole(study, ids, None) if t._trial_id in ids]


def _listed(study: optuna.Study, states: list[TrialState], attrs: Any, key: str) -> list[tuple[int, Any]]:
    """(id, attr ``key`` of the ``attrs`` model, or None) of the study's trials in ``states``."""
    sid, table = study_id(study), models.TrialModel

    def read(_: bool) -> list[tuple[int, Any]]:
        with _create_scoped_session(_rdb(study).scoped_session) as session:
            rows = session.execute(
                sa.select(table.trial_id, attrs.value_json)
                .select_from(table)
                .outerjoin(attrs, sa.and_(attrs.trial_id == table.trial_id, attrs.key == key))
                .where(table.study_id == sid, table.state.in_(states))
            ).all()
        return [(tid, None if value is None else json.loads(value)) for tid, value in rows]

    names = " and ".join(s.name for s in states)
    return riding_out(read, _rdb(study).engine.url, f"the study's {names} trials")


def _whole(study: optuna.Study, ids: set[int], states: list[TrialState] | None) -> list[FrozenTrial]:
    """The trials of ``ids`` (in ``states``), and any with a larger id (in them): Optuna's
    ``_get_trials``, the trials in a set or above an id."""
    if not ids:
        return []
    return _rdb(study)._get_trials(study_id(study), states, set(ids), max(ids))


def states_after(study: optuna.Study, after: int) -> list[tuple[int, bool]]:
    """(id, finished) of the study's trials with an id above ``after``, by id: one statement of
    two columns (finished.py: what was read before need not be read again)."""
    sid, table = study_id(study), models.TrialModel

    def read(_: bool) -> list[tuple[int, bool]]:
        with _create_scoped_session(_rdb(study).scoped_session) as session:
            rows = (
                session.query(table.trial_id, table.state)
                .filter(table.study_id == sid, table.trial_id > after)
                .order_by(table.trial_id)
                .all()
            )
        return [(tid, state.is_finished()) for tid, state in rows]

    return riding_out(read, _rdb(study).engine.url, "the study's trials (ids and states)")


def finished_trials(study: optuna.Study, ids: set[int]) -> list[FrozenTrial]:
    """The finished trials among ``ids``, whole, and any with a larger id that finished since."""
    return _whole(study, ids, [s for s in TrialState if s.is_finished()])


# --- transactions (RDBStorage) ----------------------------------------------------------------------


def _riding(name: str) -> Any:
    """RDBStorage's method ``name``, run again through a restart of the server (``riding_out``)."""
    base = getattr(RDBStorage, name)

    @functools.wraps(base)
    def method(self: RDBStorage, *args: Any, **kwargs: Any) -> Any:
        return riding_out(lambda _: base(self, *args, **kwargs), self.engine.url, f"the study's storage ({name})")

    return method


def on_engine(storage: RDBStorage, engine: sa.Engine) -> None:
    """``storage``'s statements run on ``engine`` (the process's shared one: engine.shared_engine)
    instead of on the engine it made, which is disposed (its pool closed unless it is
    ``engine``'s): one pool per process and server."""
    if storage.engine is engine:
        return
    own, storage.engine = storage.engine, engine
    storage.scoped_session = orm.scoped_session(orm.sessionmaker(bind=engine))
    own.dispose(close=own.pool is not engine.pool)  # a pool they share stays open


class RidingStorage(RDBStorage):
    """Optuna's RDBStorage whose reads, and writes that may run twice (an attr or an epoch's
    value set again to the same), ride out a restart of the server. Creating a trial and ending
    one are not among them: rdb.create is one transaction a cut leaves undone or done, and
    rdb.finish and rdb.claim check what a cut try left."""

    get_all_trials = _riding("get_all_trials")
    _get_trials = _riding("_get_trials")  # what Optuna's cache in front of it reads trials with
    _get_best_trial_id = _riding("_get_best_trial_id")
    _get_stale_trial_ids = _riding("_get_stale_trial_ids")
    get_trial = _riding("get_trial")
    get_n_trials = _riding("get_n_trials")
    get_best_trial = _riding("get_best_trial")
    get_all_studies = _riding("get_all_studies")
    get_study_id_from_name = _riding("get_study_id_from_name")
    get_study_name_from_id = _riding("get_study_name_from_id")
    get_study_directions = _riding("get_study_directions")
    get_study_user_attrs = _riding("get_study_user_attrs")
    get_study_system_attrs = _riding("get_study_system_attrs")
    get_trial_id_from_study_id_trial_number = _riding("get_trial_id_from_study_id_trial_number")
    get_trial_number_from_id = _riding("get_trial_number_from_id")
    get_trial_params = _riding("get_trial_params")
    get_trial_param = _riding("get_trial_param")
    get_trial_user_attrs = _riding("get_trial_user_attrs")
    get_trial_system_attrs = _riding("get_trial_system_attrs")
    set_study_user_attr = _riding("set_study_user_attr")
    set_study_system_attr = _riding("set_study_system_attr")
    set_trial_user_attr = _riding("set_trial_user_attr")
    set_trial_system_attr = _riding("set_trial_system_attr")
    set_trial_intermediate_value = _riding("set_trial_intermediate_value")
    record_heartbeat = _riding("record_heartbeat")


def _rdb(study: optuna.Study) -> RDBStorage:
    storage = _storage(study)
    rdb = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache
    assert isinstance(rdb, RDBStorage), type(rdb)
    return rdb


def create(study: optuna.Study, templates: list[FrozenTrial]) -> list[FrozenTrial]:
    """New trials (templates made by ``optuna.trial.create_trial``: WAITING with params and attrs;
    RUNNING, claimed at birth, with their owner's attrs and a first heartbeat; or an earlier
    sweep's finished trial with its values and epochs) in one
    transaction, as ``study.add_trial`` makes one: the study's row locked while their numbers are
    counted, each parameter's distribution checked against the study's. Returns them with their
    storage ids and numbers. Their rows are written as Optuna's ``_get_prepared_new_trial`` writes
    them, less its queries: it finds the trial again and flushes for every parameter and attribute
    (a batch of 4 trials: about 30 statements, 5 ms a trial; docs/speed.md)."""
    sid = study_id(study)

    def write(cut: bool) -> list[tuple[int, int]]:  # cut: an earlier try's commit may have gone through
        if cut and (found := _made_already(study, templates)) is not None:
            return found
        with _create_scoped_session(_rdb(study).scoped_session) as session:
            models.StudyModel.find_or_raise_by_id(sid, session, for_update=True)
            checked = _distributions(session, sid, templates)  # before anything is written
            first = session.query(sa.func.count(models.TrialModel.trial_id)).filter_by(study_id=sid).scalar()
            made = [
                models.TrialModel(
                    study_id=sid,
                    number=first + i,
                    state=t.state,
                    datetime_start=t.datetime_start,
                    datetime_complete=t.datetime_complete,
                )
                for i, t in enumerate(templates)
            ]
            session.add_all(made)
            session.flush()  # their ids
            for row, template in zip(made, templates):
                session.add_all(_rows(row.trial_id, template, checked))
                if template.state == TrialState.RUNNING:
                    session.add(models.TrialHeartbeatModel(trial_id=row.trial_id))
            return [(m.trial_id, m.number) for m in made]

    numbered = riding_out(write, _rdb(study).engine.url, "creating the batch's trials")
    out = []
    for template, (new_id, number) in zip(templates, numbered):
        trial = copy.deepcopy(template)
        trial._trial_id, trial.number = new_id, number
        out.append(trial)
    return out


def _made_already(study: optuna.Study, templates: list[FrozenTrial]) -> list[tuple[int, int]] | None:
    """The (id, number) of trials the study holds with each template's params and user attrs
    (what a cut try's commit made), None if it holds none of them."""
    held = {
        json.dumps([t.params, t.user_attrs], sort_keys=True, default=str): t for t in study.get_trials(deepcopy=False)
    }
    found = [held.get(json.dumps([t.params, t.user_attrs], sort_keys=True, default=str)) for t in templates]
    if not all(found):
        return None
    return [(t._trial_id, t.number) for t in found if t is not None]


def _distributions(session: Session, sid: int, templates: list[FrozenTrial]) -> set[str]:
    """The templates' parameter names, each distribution checked as Optuna checks a parameter it
    sets: against the study's first record of that name (or the batch's first)."""
    names = {name for t in templates for name in t.distributions}
    held: dict[str, BaseDistribution] = {}
    for name in names:
        record = (
            session.query(models.TrialParamModel)
            .join(models.TrialModel)
            .filter(models.TrialModel.study_id == sid, models.TrialParamModel.param_name == name)
            .first()
        )
        if record is not None:
            held[name] = distributions.json_to_distribution(record.distribution_json)
    for template in templates:
        for name, distribution in template.distributions.items():
            distributions.check_distribution_compatibility(held.setdefault(name, distribution), distribution)
    return names


def _rows(trial_id: int, template: FrozenTrial, checked: set[str]) -> list[Any]:
    """A new trial's parameter, value, intermediate value, user attr and system attr rows (an
    earlier sweep's trial, a lesson, comes finished: earlier.py)."""
    assert set(template.distributions) <= checked
    rows: list[Any] = [
        models.TrialParamModel(
            trial_id=trial_id,
            param_name=name,
            param_value=template.distributions[name].to_internal_repr(value),
            distribution_json=distributions.distribution_to_json(template.distributions[name]),
        )
        for name, value in template.params.items()
    ]
    for model, attrs in (
        (models.TrialUserAttributeModel, template.user_attrs),
        (models.TrialSystemAttributeModel, template.system_attrs),
    ):
        rows += [model(trial_id=trial_id, key=key, value_json=json.dumps(value)) for key, value in attrs.items()]
    for objective, value in enumerate(template.values or []):
        stored, kind = models.TrialValueModel.value_to_stored_repr(value)
        rows.append(models.TrialValueModel(trial_id=trial_id, objective=objective, value=stored, value_type=kind))
    for step, value in template.intermediate_values.items():
        kept, epoch_kind = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        rows.append(
            models.TrialIntermediateValueModel(
                trial_id=trial_id, step=step, intermediate_value=kept, intermediate_value_type=epoch_kind
            )
        )
    return rows


def claim(study: optuna.Study, trial_id: int, system_attrs: dict[str, Any], user_attrs: dict[str, Any]) -> bool:
    """WAITING -> RUNNING, with its first heartbeat and these attrs, in one transaction; False
    when another process claimed it first."""
    rdb = _rdb(study)

    def take(cut: bool) -> bool:  # cut: an earlier try's commit may have gone through
        try:
            with _create_scoped_session(rdb.scoped_session) as session:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
                if trial.state != TrialState.WAITING:
                    return cut and _holds(session, trial_id, system_attrs)  # the cut try's claim went through
                trial.state, trial.datetime_start = TrialState.RUNNING, datetime.now()
                for key, attr in system_attrs.items():
                    rdb._set_trial_attr_without_commit(session, models.TrialSystemAttributeModel, trial_id, key, attr)
                for key, attr in user_attrs.items():
                    rdb._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, attr)
                _heartbeat(session, trial_id)
        except IntegrityError:  # two processes created the heartbeat row at once: the other one won
            return False
        return True

    return riding_out(take, rdb.engine.url, f"trial {trial_id}: claiming it")


def _holds(session: Session, trial_id: int, system_attrs: dict[str, Any]) -> bool:
    """Whether the trial's system attrs are ``system_attrs`` (its owner's among them)."""
    model = models.TrialSystemAttributeModel
    stored = {row.key: json.loads(row.value_json) for row in session.query(model).filter(model.trial_id == trial_id)}
    return all(stored.get(key) == json.loads(json.dumps(value)) for key, value in system_attrs.items())


def beat(study: optuna.Study, trial_id: int, epochs: dict[int, float], renew: bool = True) -> None:
    """The values of ``epochs`` (step = epoch) a running trial has done since, and its heartbeat
    renewed if ``renew``, in one transaction. Nothing for a trial that has finished meanwhile."""
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
    with ``epochs``' values and ``user_attrs``, in one transaction; ``values``: one per objective
    of the study. UpdateFinishedTrialError when another process has finished the trial already."""
    if state == TrialState.PRUNED and epochs:
        last = epochs[max(epochs)]
        values = [last] if not math.isnan(last) else None
    if state == TrialState.COMPLETE and (
        not values or len(values) != len(study.directions) or any(math.isnan(v) for v in values)
    ):
        raise ValueError(f"a complete trial needs {len(study.directions)} values, not {values}")  # as study.tell
    study._thread_local.cached_all_trials = None  # as study.tell: the study's cache of its trials
    rdb = _rdb(study)

    def write(cut: bool) -> None:  # cut: an earlier try's commit may have gone through
        with _create_scoped_session(rdb.scoped_session) as session:
            trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
            if cut and trial.state == state:
                return  # the cut try's commit went through: the trial holds this end
            rdb.check_trial_is_updatable(trial_id, trial.state)
            _epochs(session, trial_id, epochs)
            for key, attr in user_attrs.items():
                rdb._set_trial_attr_without_commit(session, models.TrialUserAttributeModel, trial_id, key, attr)
            for objective, value in enumerate(values or []):
                rdb._set_trial_value_without_commit(session, trial, objective, float(value))
            trial.state, trial.datetime_complete = state, datetime.now()

    riding_out(write, rdb.engine.url, f"trial {trial_id}: writing its end")
    return riding_out(lambda _: stored(study, trial_id), rdb.engine.url, f"trial {trial_id}: reading it back")


def _epochs(session: Session, trial_id: int, epochs: dict[int, float]) -> None:
    """Intermediate values (step = epoch), written or replaced."""
    model = models.TrialIntermediateValueModel
    rows = {row.step: row for row in model.where_trial_id(trial_id, session)} if epochs else {}
    for step, value in epochs.items():
        kept, kind = model.intermediate_value_to_stored_repr(value)
        row = rows.get(step)
        if row is None:
            session.add(model(trial_id=trial_id, step=step, intermediate_value=kept, intermediate_value_type=kind))
        else:
            row.intermediate_value, row.intermediate_value_type = kept, kind


def _heartbeat(session: Session, trial_id: int) -> None:
    """As RDBStorage.record_heartbeat, in the caller's transaction (the database's clock)."""
    row = models.TrialHeartbeatModel.where_trial_id(trial_id, session, True)
    if row is None:
        session.add(models.TrialHeartbeatModel(trial_id=trial_id))
    else:
        row.heartbeat = session.execute(sa.func.now()).scalar_one()
