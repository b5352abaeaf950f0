"""The Optuna study of a sweep: its storage, sampler and pruner built from the spec, recovery of
trials a killed process left running, and a finished trial as a TrialRecord."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from sweeper.errors import UserError
from sweeper.plan.strategy import last_rung
from sweeper.search.optuna import rdb
from sweeper.search.optuna.engine import CREATE_ATTEMPTS, engine_kwargs, racing, riding_out, shared_engine
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.states import TrialState
from sweeper.track.records import TrialRecord
from sweeper.trial.seeding import sampler_seed, trial_seed

INFO = "sweeper"  # user attr: seed, reason, run id, per-epoch history, provenance
INTERRUPTED = "sweeper_interrupted"  # system attr of a trial whose process died: why
# sweeper's state of a trial from Optuna's, and back: the one map between the two vocabularies (an
# interrupted trial is FAIL in Optuna, marked INTERRUPTED: see ``interrupted``)
STATES = {
    OptunaState.COMPLETE: TrialState.COMPLETE,
    OptunaState.PRUNED: TrialState.PRUNED,
    OptunaState.FAIL: TrialState.FAILED,
    OptunaState.RUNNING: TrialState.RUNNING,
    OptunaState.WAITING: TrialState.WAITING,
}
OPTUNA_STATES = {ours: theirs for theirs, ours in STATES.items()}
FINISHED = tuple(theirs for theirs in STATES if theirs.is_finished())  # Optuna's: complete, pruned, fail
UNFINISHED = (OptunaState.WAITING, OptunaState.RUNNING)
# user attrs set when a trial is created; a retry copies them
SLOT = "sweeper_slot"  # the trial's place in the budget: its seed (and, reproducible, its batch) follow
BATCH = "sweeper_batch"  # reproducible mode: the batch that proposed it
RETRY_OF = "sweeper_retry_of"  # the number of the trial it retries
ATTEMPT = "sweeper_attempt"  # a retry: the how-manieth attempt at its slot (the first has none: 1)
RESUME = "sweeper_resume"  # a retry of a preempted trial: the training state file it continues from
PREEMPTIONS = "sweeper_preemptions"  # how many of its slot's attempts were preempted (not lost)
ACCUMULATE = "sweeper_accumulate"  # a retry after out-of-memory: the train.accumulate it runs with
# a promoted trial (from the family round, or search.pruner.promote's): the number of the paused
# trial it continues (from that trial's saved state, RESUME), and that trial's slot, whose seed it
# keeps; PAUSED_AT: the epoch a pruner paused it at (absent for the family round's)
PROMOTED_FROM = "sweeper_promoted_from"
SEED_SLOT = "sweeper_seed_slot"
PAUSED_AT = "sweeper_paused_at"
# user attr of an earlier sweep's trial added as an observation (earlier.py): {source, trial}. The
# sampler learns from it; it is not one of this sweep's trials (no slot, not in its records)
EARLIER = "sweeper_earlier"
OWNER = "sweeper_owner"  # system attr: the member (host:pid:tag) holding the trial's lease

optuna.logging.set_verbosity(optuna.logging.ERROR)  # sweeper shows trials in its own table


def seed(spec: SweepSpec, trial: FrozenTrial | optuna.Trial) -> int:
    """The trial's seed: a function of its slot (a retry keeps its attempt's; a promoted trial,
    the paused one's)."""
    attrs = trial.user_attrs
    return trial_seed(spec.seed, attrs.get(SEED_SLOT, attrs.get(SLOT, trial.number)))


def storage_url(spec: SweepSpec, out_dir: Path) -> str:
    return spec.search.storage or f"sqlite:///{(out_dir / 'optuna.db').resolve()}"


def make_storage(url: str, spec: SweepSpec) -> optuna.storages.RDBStorage:
    """The study's storage. Leases are Optuna heartbeats (its trial_heartbeats table, the
    database's clock); sweeper renews and checks them itself (lease.py), since Optuna does only
    inside study.optimize."""

    def create() -> optuna.storages.RDBStorage:
        server = not url.startswith("sqlite")
        # a server's storage opens on the process's pool from its first statement (its table
        # checks take 2 connections at once): an engine of its own would hold more, for a moment
        kwargs = {"pool": shared_engine(url).pool} if server else engine_kwargs(url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = rdb.RidingStorage(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=spec.search.heartbeat_s,
                grace_period=spec.search.lease_s,
            )
        if server:  # the process's engine, which waits for a restarting server
            rdb.on_engine(storage, shared_engine(url))
        return storage

    try:  # "already exists": another process created Optuna's tables just now; a restart of a
        # server this process used already (a queue's worker visiting its next sweep): waited for
        return riding_out(
            lambda _: racing(create, lambda exc: "already exists" in str(exc)),
            sqlalchemy.engine.make_url(url),
            f"search.storage {safe_url(url)}",
        )
    except ModuleNotFoundError as exc:  # a database driver (psycopg) is not installed
        raise UserError(
            f"search.storage: {exc.name} is needed for {url.split(':')[0]}; install sweeper[postgres]"
        ) from None
    except Exception as exc:  # unreachable server, unknown database, bad credentials
        raise UserError(
            f"search.storage: cannot open {safe_url(url)}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None


def safe_url(url: str) -> str:
    """A storage URL without its password, for messages."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


class _Grid(optuna.samplers.GridSampler):
    """GridSampler without its study.stop(), which only works inside study.optimize; the
    coordinator caps the budget at the grid's size instead."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def make_sampler(spec: SweepSpec, seed: int) -> optuna.samplers.BaseSampler:
    search = spec.search
    if search.sampler == "grid":
        return _Grid({path: sp.grid_values(path, p) for path, p in search.space.items()}, seed=seed)
    if search.sampler == "nsga2":
        if search.population:
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=search.population)
        return optuna.samplers.NSGAIISampler(seed=seed)
    factories = {
        "tpe": optuna.samplers.TPESampler,
        "random": optuna.samplers.RandomSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "gp": optuna.samplers.GPSampler,
    }
    return factories[search.sampler](seed=seed)


def directions(spec: SweepSpec) -> list[Literal["maximize", "minimize"]]:
    """The study's directions: one per objective, in the spec's order (a trial's values too)."""
    return [g.direction for g in spec.goals]


class _CutsThatSave:
    """A successive-halving pruner that judges no rung past ``last_rung``
    (sweeper.plan.strategy.rungs: a later cut saves under 1/reduction_factor of a trial). Its rung
    bookkeeping stays Optuna's; mixed in before the Optuna class, so ``isinstance`` still holds."""

    last_rung: int

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        if trial.last_step is not None and trial.last_step > self.last_rung:
            return False
        return super().prune(study, trial)  # type: ignore[misc]


class _SuccessiveHalving(_CutsThatSave, optuna.pruners.SuccessiveHalvingPruner):
    def __init__(self, min_resource: int, reduction_factor: int, epochs: int) -> None:
        super().__init__(min_resource=min_resource, reduction_factor=reduction_factor)
        self.last_rung = last_rung(reduction_factor, epochs)


class _Hyperband(_CutsThatSave, optuna.pruners.HyperbandPruner):
    def __init__(self, min_resource: int, reduction_factor: int, epochs: int) -> None:
        super().__init__(min_resource=min_resource, max_resource=epochs, reduction_factor=reduction_factor)
        self.last_rung = last_rung(reduction_factor, epochs)


def make_pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    p, epochs = spec.search.pruner, spec.train.epochs
    if p.type == "median":  # epochs are 1-based steps: the first prune can come at min_epochs
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.min_epochs)
    if p.type == "asha":
        return _SuccessiveHalving(p.min_epochs, p.reduction_factor, epochs)
    if p.type == "hyperband":
        return _Hyperband(p.min_epochs, p.reduction_factor, epochs)
    return optuna.pruners.NopPruner()


def open_study(spec: SweepSpec, out_dir: Path) -> optuna.Study:
    url = storage_url(spec, out_dir)
    for attempt in range(CREATE_ATTEMPTS):
        try:
            study = optuna.create_study(
                study_name=spec.name,
                storage=make_storage(url, spec),
                sampler=make_sampler(spec, sampler_seed(spec.seed, 0)),
                pruner=make_pruner(spec),
                directions=directions(spec),
                load_if_exists=True,
            )
            describe(study, spec)
            return study
        except optuna.exceptions.DuplicatedStudyError:
            if attempt + 1 == CREATE_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def describe(study: optuna.Study, spec: SweepSpec) -> None:
    """What optuna-dashboard (`sweeper dashboard`) shows of the sweep: the objective's name (not
    "Objective 0") and the search space, as the study's user attrs. Written once per study."""
    if study.metric_names is None:
        with warnings.catch_warnings():  # set_metric_names is experimental in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([g.metric for g in spec.goals])
    if "search_space" not in study.user_attrs:
        study.set_user_attr("search_space", sp.as_json(spec.search.space))
        study.set_user_attr("objective", spec.objective.model_dump())
        study.set_user_attr("objectives", [g.model_dump() for g in spec.goals])


def state(t: FrozenTrial) -> TrialState:
    """The trial's state in sweeper's words (an interrupted trial is failed: it does not count)."""
    return STATES.get(t.state, TrialState.FAILED)


def interrupted(t: FrozenTrial) -> bool:
    """A trial lost with its process (or lease): it was retried and does not count."""
    return bool(t.system_attrs.get(INTERRUPTED))


def earlier(t: FrozenTrial) -> bool:
    """An earlier sweep's trial, added as an observation (search.warm_start)."""
    return EARLIER in t.user_attrs


def counted(study: optuna.Study) -> int:
    """Trials that count toward n_trials: finished, excluding those lost to a killed process."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if not interrupted(t) and not earlier(t))


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of the sweep (earlier invocations' and other processes' included; not the
    observations an earlier sweep gave: ``earlier``)."""
    return [record(t) for t in study.get_trials(deepcopy=False) if not earlier(t)]


def record(t: FrozenTrial) -> TrialRecord:
    """A trial as summary.json and the progress table show it."""
    info: dict[str, Any] = t.user_attrs.get(INFO, {})
    reason = info.get("reason")
    if interrupted(t):
        reason = f"interrupted: {t.system_attrs[INTERRUPTED]}; retried with the same parameters"
    history = info.get("history", [])
    values = info.get("values", {}) if t.state == OptunaState.COMPLETE else {}
    value = t.values[0] if t.values and len(t.values) == 1 else info.get("value")
    return TrialRecord(
        number=t.number,
        state=state(t),
        params=t.params,
        value=value,
        values=values,
        footprint=info.get("footprint", {}),
        seed=info.get("seed"),
        reason=reason,
        failure=info.get("failure"),
        epochs=len(history),
        seconds=info.get("seconds"),
        device_seconds=info.get("device_seconds"),
        device=info.get("device"),
        mlflow_run_id=info.get("mlflow_run_id"),
        history=history,
        fused_with=info.get("fused_with", []),
    )
