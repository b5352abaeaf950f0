"""The Ray backend's driver (this process): builds the searcher (Optuna's samplers through
``OptunaSearch``; random/grid through Ray's basic generator) and the scheduler (schedulers.py),
runs the Tuner or restores an interrupted one, relays Tune's trial events to the observer, and
turns Tune's results into the same TrialRecords as the Optuna backend.

Workers (Ray actors) run trial.py. A trial Tune stops never returns from its ``report``, so the
driver closes the MLflow runs of trials Tune stopped (state ``pruned``).
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from sweeper.search import checkpoints, faults
from sweeper.search.backend import SearchContext, SearchResult
from sweeper.search.ray import cluster
from sweeper.search.ray.schedulers import checkpoint_every, checkpoints_kept, make_scheduler
from sweeper.search.ray.space import param_space
from sweeper.search.ray.trial import MODEL, NUMBER, Context, read_meta, trainable, trial_number, trial_params
from sweeper.search.trial_runs import close_trial_run
from sweeper.spec import Objective, SweepSpec
from sweeper.spec import space as sp
from sweeper.spec.objectives import FOOTPRINT_METRICS
from sweeper.states import TrialState
from sweeper.track.mlflow import Tracker
from sweeper.track.records import TrialEvent, TrialRecord, goal_values
from sweeper.trial.checkpoint import trial_path
from sweeper.trial.seeding import derive, sampler_seed, threads_per_trial, trial_seed

# Keys the worker adds to each result besides the trainer's metrics (not part of the history).
OWN_KEYS = (
    "epoch",
    "done",
    "trial_id",
    "sweeper_number",
    "sweeper_state",
    "mlflow_run_id",
    "node_id",
    "seconds",
    "device",
    "should_checkpoint",
    *FOOTPRINT_METRICS,
)  # the footprint: the last result's
QUIET_LOGGERS = ("ray.tune.execution.tune_controller", "ray.tune.tune", "ray.tune.analysis.experiment_analysis")
# Tune snapshots its experiment state (what a re-run restores) every 10 s or more by default; a
# small sweep's state is a few kB, so every 2 s loses less work to a killed driver.
SNAPSHOT_EVERY_S = "2"


class StaleCopyFilter(logging.Filter):
    """Drops Tune's error for a snapshot copy that raced the next snapshot. Tune writes its state
    into a staging folder (a temporary file, then a rename) and copies the folder to the storage in
    the background; a forced snapshot writes while the previous copy still runs, so that copy can
    miss the renamed temporary file (FileNotFoundError) and Tune logs a traceback. The copy started
    right after it takes the new state, so nothing is lost; any other error still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, FileNotFoundError)


STATE_LOGGER = "ray.tune.execution.experiment_state"


class TuneRun:
    """What one Tune run's callbacks (``Events``, ``Breaker``) share with this driver: the
    observer's event sink, the trials ended in this run (in the order Tune reported them) and
    the circuit breaker's error once it trips (faults.breaker_trips). ``run`` makes one for the
    run's lifetime (``with TuneRun(...)``) and gives it to the callbacks it builds.

    Tune pickles its callbacks with the experiment (tuner.pkl), and ``Tuner.restore`` (a re-run
    after a stop) calls the unpickled copies, which Tune's public API offers no way to replace:
    so a TuneRun unpickles as the run this driver process is serving, not as a stale copy of the
    run it was saved from (outside a run: a detached one that tells nobody)."""

    _serving: ClassVar[TuneRun | None] = None  # the run of this driver process, while it lasts

    def __init__(self, spec: SweepSpec, events: Callable[[TrialEvent], None] | None = None) -> None:
        self.spec, self.events = spec, events
        self.ended: list[TrialRecord] = []
        self.stopped: str | None = None

    def emit(self, event: TrialEvent) -> None:
        """Relay a trial's event to the observer; the circuit breaker watches the ends."""
        if self.events is not None:
            self.events(event)
        if event.kind == "end" and event.record is not None:
            self.ended.append(event.record)
            self.stopped = self.stopped or faults.breaker_trips(self.spec, self.ended)

    def __enter__(self) -> TuneRun:
        TuneRun._serving = self
        return self

    def __exit__(self, *exc: object) -> None:
        TuneRun._serving = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _serving_run, (self.spec,)


def _serving_run(spec: SweepSpec) -> TuneRun:
    """What a pickled TuneRun reads back as (see TuneRun)."""
    return TuneRun._serving or TuneRun(spec)


class DefineByRun:
    """OptunaSearch's search space: sweeper's own ``suggest`` on Optuna's trial (conditional
    parameters included). A module-level class, so the searcher's saved state pickles."""

    def __init__(self, space: dict[str, sp.Param]) -> None:
        self.space = space

    def __call__(self, trial: Any) -> dict[str, Any]:
        sp.suggest(self.space, trial)
        return {NUMBER: trial.number}


def trial_dirname(trial: Any) -> str:
    return f"trial-{trial_number(trial.config, trial.trial_id):05d}-{trial.trial_id}"


def _mode(goal: Objective) -> str:
    return "max" if goal.direction == "maximize" else "min"


def make_searcher(spec: SweepSpec) -> tuple[Any, dict[str, Any]]:
    """(search_alg, param_space): OptunaSearch for Optuna's samplers, else the basic generator."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    search = spec.search
    if search.sampler not in ("random", "grid"):
        from ray.tune.search.optuna import OptunaSearch

        from sweeper.search.optuna.study import make_sampler

        goals = spec.goals  # several: Optuna's multi-objective study, told every value at the trial's end
        metric: str | list[str] = [str(g.metric) for g in goals] if len(goals) > 1 else str(spec.objective.metric)
        mode = [_mode(g) for g in goals] if len(goals) > 1 else _mode(spec.objective)
        return OptunaSearch(
            DefineByRun(search.space), metric=metric, mode=mode, sampler=make_sampler(spec, sampler_seed(spec.seed, 0))
        ), {}
    return (
        BasicVariantGenerator(random_state=derive(spec.seed, "sweep")),
        param_space(search.space, grid=search.sampler == "grid"),
    )


def record(
    spec: SweepSpec,
    number: int,
    config: dict[str, Any],
    last: dict[str, Any],
    history: list[dict[str, float]],
    error: Any = None,
) -> TrialRecord:
    """A trial as summary.json and the progress table show it, from its last Tune result."""
    metric = spec.objective.metric
    epochs = int(last.get("epoch") or 0)
    state, reason = end_state(spec, last, error)
    values = goal_values(spec, last, {}) if state == TrialState.COMPLETE else {}
    if state == TrialState.COMPLETE and len(values) < len(spec.goals):
        state, reason = TrialState.FAILED, f"objectives not measured: {', '.join(g.metric for g in spec.goals)}"
        values = {}
    return TrialRecord(
        number=number,
        state=state,
        params=trial_params(spec.search.space, config),
        value=last.get(metric) if state == TrialState.COMPLETE else None,
        values=values,
        footprint={k: float(last[k]) for k in FOOTPRINT_METRICS if k in last},
        seed=trial_seed(spec.seed, number),
        reason=reason,
        epochs=epochs,
        seconds=last.get("seconds", last.get("time_total_s")),
        device=last.get("device"),
        mlflow_run_id=last.get("mlflow_run_id") or None,
        node_id=last.get("node_id"),
        node_ip=last.get("node_ip"),
        history=history,
    )


def end_state(spec: SweepSpec, last: dict[str, Any], error: Any) -> tuple[TrialState, str | None]:
    """How a Tune trial ended, and why, from its last result (and Tune's error, if any): the one
    map from Tune's ends to TrialState. A trial that raised (trial.TrialError, or its worker
    gave up) failed; one whose worker reported the end of its last epoch completed; any other
    was stopped by the scheduler: pruned."""
    if error is not None:
        found = re.search(r"TrialError: (.+)", str(error))
        return TrialState.FAILED, (found.group(1) if found else str(error).strip().splitlines()[-1])[:500]
    if last.get("sweeper_state") == TrialState.COMPLETE:
        return TrialState.COMPLETE, None
    metric, epochs = spec.objective.metric, int(last.get("epoch") or 0)
    shown = f" ({metric}={last[metric]:.4g})" if metric in last else ""
    return TrialState.PRUNED, f"stopped at epoch {epochs} by the {spec.search.pruner.type} scheduler{shown}"


def _events_callback(state: TuneRun) -> Any:
    """Relays Tune's trial events to the run's state (the observer, the circuit breaker)."""
    from ray import tune

    spec, emit = state.spec, state.emit

    class Events(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            emit(TrialEvent.start(trial_number(trial.config, trial.trial_id)))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            metrics = {k: v for k, v in result.items() if isinstance(v, (int, float)) and k not in OWN_KEYS}
            emit(TrialEvent.epoch_end(result["sweeper_number"], result["epoch"], metrics))

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._end(trial, None)

        def on_trial_error(self, iteration, trials, trial, **info):
            # the error's text: Tune has just written it to the trial's local error file
            path = trial.error_file
            self._end(trial, Path(path).read_text() if path and Path(path).exists() else "error")

        def _end(self, trial: Any, error: Any) -> None:
            number = trial_number(trial.config, trial.trial_id)
            emit(TrialEvent.end(record(spec, number, trial.config, trial.last_result or {}, [], error)))

    return Events()


def _breaker(state: TuneRun) -> Any:
    """Stops the whole Tune run once the circuit breaker has tripped (see faults.py)."""
    from ray import tune

    class Breaker(tune.Stopper):
        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            return False

        def stop_all(self) -> bool:
            return state.stopped is not None

    return Breaker()


def _history(result: Any) -> list[dict[str, float]]:
    """The trainer's per-epoch metrics of one Tune result, one row per epoch (the last report of
    an epoch wins). Tune rewrites a trial's result files when it restarts, so after a restart this
    holds only the epochs since; ``_result_record`` prefers the checkpoint's full history."""
    from ray.tune.result import AUTO_RESULT_KEYS

    frame = result.metrics_dataframe
    rows: dict[int, dict[str, float]] = {}
    for row in [] if frame is None else frame.to_dict("records"):
        if row.get("epoch") is None or (isinstance(row["epoch"], float) and math.isnan(row["epoch"])):
            continue
        rows[int(row["epoch"])] = {
            k: float(v)
            for k, v in row.items()
            if k not in AUTO_RESULT_KEYS
            and k not in OWN_KEYS
            and "/" not in k
            and isinstance(v, (int, float))
            and not math.isnan(v)
        }
    return [rows[e] for e in sorted(rows)]


def run(spec: SweepSpec, ctx: SearchContext) -> SearchResult:
    """Run or resume the sweep on Ray Tune."""
    addr = cluster.address(spec)  # RayBackend.check has vetted it and the storage before any connection
    import ray

    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", SNAPSHOT_EVERY_S)
    # With num_to_keep set, Tune also snapshots after a trial's checkpoints replace each other (so a
    # restore never names a deleted one) and warns each time when epochs are short; the snapshot is
    # a few kB here, and the warning would flood the sweep's output.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune logs each failed trial's traceback (and, after a stop, the trials it could not read) at
    # ERROR; sweeper records them itself (the trial table, error.txt in the trial's MLflow run)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    state_logger = logging.getLogger(STATE_LOGGER)
    if not any(isinstance(f, StaleCopyFilter) for f in state_logger.filters):
        state_logger.addFilter(StaleCopyFilter())
    cluster.connect(spec, addr)
    with TuneRun(spec, ctx.observer.event) as state:
        try:
            return _fit(spec, ctx, state, addr)
        finally:
            ray.shutdown()  # a local Ray stops here; a cluster is only disconnected from


def _fit(spec: SweepSpec, ctx: SearchContext, state: TuneRun, addr: str | None) -> SearchResult:
    """Build (or restore) the Tuner and fit it; the records of every trial."""
    import ray
    from ray import tune

    tracker = ctx.tracker
    storage = cluster.storage_path(spec, ctx.out_dir, addr, nodes=sum(1 for n in ray.nodes() if n["Alive"]))
    experiment = f"{storage.rstrip('/')}/{spec.name}"
    restoring = tune.Tuner.can_restore(experiment)
    interrupted = tracker.open_children(ctx.sweep.parent_run_id) if restoring else []
    for run_id in interrupted:  # trials the stopped sweep was running: Tune runs them again
        close_trial_run(
            tracker,
            run_id,
            TrialState.INTERRUPTED,
            "the sweep stopped while this trial ran; the re-run restarted it",
        )
    if restoring:
        ctx.observer.note(f"resuming the Ray Tune experiment at {experiment} ({len(interrupted)} trial(s) restarted)")
    context = Context(
        spec,
        tracker.uri,
        tracker.experiment,
        ctx.sweep,
        threads_per_trial(spec),
        None if spec.search.sampler in ("random", "grid") else sampler_seed(spec.seed, 0),
        checkpoint_every(spec),
    )
    gpu = spec.search.resources.gpu
    if gpu is None:  # unset: one GPU per rank of a trial where the cluster has GPUs (see ResourcesSpec)
        gpu = spec.train.devices if ray.cluster_resources().get("GPU", 0) > 0 else 0
    resources = {"cpu": spec.search.resources.cpu, "gpu": gpu}
    fn = tune.with_resources(tune.with_parameters(trainable, context=context), resources)
    searcher, space = make_searcher(spec)
    if restoring:
        tuner = tune.Tuner.restore(
            experiment, trainable=fn, param_space=space, resume_unfinished=True, resume_errored=False
        )
    else:
        tuner = tune.Tuner(
            fn,
            param_space=space,
            tune_config=_tune_config(spec, searcher),
            run_config=_run_config(spec, storage, state),
        )
    if spec.search.pruner.type == "pbt":
        # PBT draws its exploit partners and mutations from Python's global RNG (in this process);
        # which trial exploits which still depends on the order results arrive in.
        random.seed(derive(spec.seed, "sweep"))
    if len(spec.goals) > 1:  # epochs report the trainer's metrics; the footprint comes with the last result
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    grid: Any = tuner.fit()  # a ResultGrid: iterable by index
    # a trial Tune created but never started (the circuit breaker stopped the run) has no config
    records = sorted((_result_record(spec, r) for r in grid if r.config is not None), key=lambda r: r.number)
    _close_runs(tracker, ctx.sweep.parent_run_id, records)
    _fetch_checkpoints(spec, grid, records, ctx.out_dir)
    stopped = faults.breaker(spec, state.ended, spec.search.n_trials - len(records) if spec.search.n_trials else None)
    if state.stopped is not None and stopped is not None:
        raise stopped
    return SearchResult(records, experiment)


def _tune_config(spec: SweepSpec, searcher: Any) -> Any:
    from ray import tune

    search = spec.search
    samples = 1 if search.sampler == "grid" else (search.n_trials or -1)  # grid: every point once
    return tune.TuneConfig(
        metric=spec.objective.metric,
        mode=_mode(spec.objective),
        search_alg=searcher,
        scheduler=make_scheduler(spec),
        num_samples=samples,
        max_concurrent_trials=search.ray.max_concurrent_trials,
        reuse_actors=search.ray.reuse_actors,
        time_budget_s=search.timeout,
        trial_dirname_creator=trial_dirname,
    )


def _run_config(spec: SweepSpec, storage: str, state: TuneRun) -> Any:
    from ray import tune

    return tune.RunConfig(
        name=spec.name,
        storage_path=storage,
        verbose=0,
        callbacks=[_events_callback(state)],
        stop=_breaker(state),
        failure_config=tune.FailureConfig(max_failures=spec.search.ray.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_kept(spec)),
    )


def _number(result: Any) -> int:
    return int(Path(result.path).name.split("-")[1])  # see trial_dirname


def _result_record(spec: SweepSpec, result: Any) -> TrialRecord:
    rec = record(spec, _number(result), result.config, result.metrics or {}, _history(result), result.error)
    meta = read_meta(result.checkpoint) if result.checkpoint else None
    if meta and meta["epoch"] == rec.epochs:
        # the trial's lineage: under PBT, the epochs before an exploit are the donor's
        rec = rec.model_copy(
            update={"history": meta["history"], "restarts": meta["restarts"], "exploits": meta["exploits"]}
        )
    return rec


def _close_runs(tracker: Tracker, parent: str | None, records: list[TrialRecord]) -> None:
    """Trial runs left open: trials Tune stopped (pruned), and earlier attempts of restarted trials."""
    by_run = {r.mlflow_run_id: r for r in records if r.mlflow_run_id}
    for run_id in tracker.open_children(parent):
        r = by_run.get(run_id)
        if r is not None:
            close_trial_run(tracker, run_id, r.state, r.reason)
        else:
            close_trial_run(tracker, run_id, TrialState.INTERRUPTED, "its worker stopped; Tune ran the trial again")


def _fetch_checkpoints(spec: SweepSpec, grid: Any, records: list[TrialRecord], out_dir: Path) -> None:
    """Copy the final training state of the trials the sweep keeps (search/checkpoints.py) from
    Tune's storage to <out>/checkpoints, where export and `sweeper export RUN_ID` find them."""
    results = {_number(r): r for r in grid}
    for number in checkpoints.kept(spec, records):
        result = results.get(number)
        if result is None or result.checkpoint is None:  # a trial of an earlier, interrupted invocation
            continue
        dest = trial_path(out_dir, number)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with result.checkpoint.as_directory() as folder:
            shutil.copyfile(Path(folder) / MODEL, dest)
