"""Ray Tune backend: the same spec and trial function as the Optuna backend, scheduled by Tune.

Driver (this process): joins a Ray cluster or starts a local one, builds the searcher (Optuna's
samplers through ``OptunaSearch``; random/grid through Ray's basic generator) and the scheduler
(backends/ray_schedulers.py), runs the Tuner or restores an interrupted one, and turns Tune's
results into the same per-trial records as the Optuna backend.

Workers (Ray actors) run backends/ray_trial.py. A trial Tune stops never returns from its
``report``, so the driver closes the MLflow runs of trials Tune stopped (state ``pruned``).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from sweeper import space as sp
from sweeper.backends.ray_schedulers import checkpoint_every, checkpoints_kept, make_scheduler
from sweeper.backends.ray_trial import NUMBER, Context, read_meta, trainable, trial_number, trial_params
from sweeper.errors import UserError
from sweeper.spec import SweepSpec
from sweeper.tracking import Tracker

STATE_FILE = "ray_sweep.json"  # in --out: the MLflow parent run a re-run resumes into
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "auto")
# Keys the worker adds to each result besides the trainer's metrics (not part of the history).
OWN_KEYS = ("epoch", "done", "trial_id", "sweeper_number", "sweeper_state", "mlflow_run_id", "node_id",
            "seconds", "device", "should_checkpoint")
EVENTS: Callable[[dict[str, Any]], None] | None = None  # the observer's event sink, set by run()


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


def is_remote(address: str | None) -> bool:
    """True when the address names another machine (one where this machine's disk is not)."""
    import socket

    if not address:
        return False
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host in LOCAL_HOSTS:
        return False
    try:  # an address of this machine can be bound to (a Ray job's RAY_ADDRESS is the head's own IP)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
        return False
    except OSError:
        return True


def storage_path(spec: SweepSpec, out_dir: Path, address: str | None, nodes: int = 1) -> str:
    """Tune's storage: a URI as given, else an absolute local path (default <out>/ray), which
    only a single-node cluster on this machine can use."""
    path = spec.search.ray.storage_path
    if path and "://" in path:
        return path
    if is_remote(address) or nodes > 1:
        where = f"the Ray cluster at {address}" if is_remote(address) else f"this {nodes}-node Ray cluster"
        raise UserError(
            f"search.ray.storage_path: {path or 'the default <out>/ray'!r} is a path on this machine, but "
            f"{where} runs trials on other machines, which cannot write there or "
            f"read each other's checkpoints; expected shared storage that every node reaches: an "
            f"s3://bucket/prefix or gs://bucket/prefix URI, or file:///mnt/shared/... on a file system "
            f"mounted at that path on every node")
    return str(Path(path).resolve() if path else (out_dir / "ray").resolve())


def _check_tracking(tracker: Tracker, address: str | None) -> None:
    uri = tracker.uri or ""
    if tracker.enabled and is_remote(address) and not uri.startswith(("http://", "https://", "databricks")):
        raise UserError(
            f"tracking.mlflow_uri: {uri!r} is a store on this machine, but the trials run on the Ray "
            f"cluster at {address} and log from there; expected an MLflow server every node reaches, "
            f"e.g. http://mlflow.internal:5000 (or tracking.enabled: false)")


def _absolute_uri(uri: str | None) -> str | None:
    """Workers run in other folders: a relative sqlite path must be made absolute."""
    if uri and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def use_auth_token() -> None:
    """Ray does not turn token authentication on for an explicit address: do as `ray start
    --head` does and use the token when one is configured (a cluster without auth ignores it)."""
    token = os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
        (Path.home() / ".ray" / "auth_token").is_file()
    if "RAY_AUTH_MODE" not in os.environ and token:
        os.environ["RAY_AUTH_MODE"] = "token"


def _connect(spec: SweepSpec, address: str | None) -> None:
    import ray

    # Tune passes this to the trial actors: keep relative paths (data roots) as in the spec. Not a
    # runtime_env: in a Ray job, a driver's own runtime_env replaces the job's working_dir.
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables (sweeper shows its own)
    quiet = {"log_to_driver": False, "logging_level": "WARNING"}
    if address is None:  # a new local Ray for this sweep ("local": never a cluster found on the machine);
        # ray.init turns token authentication on for it
        from sweeper.seeding import cpu_cores

        ray.init(address="local", num_cpus=spec.search.ray.num_cpus or cpu_cores(), include_dashboard=False,
                 object_store_memory=spec.search.ray.object_store_mb * 2**20, **quiet)
        return
    use_auth_token()
    ray.init(address=address, **quiet)


def _mode(spec: SweepSpec) -> str:
    return "max" if spec.objective.direction == "maximize" else "min"


def make_searcher(spec: SweepSpec) -> tuple[Any, dict[str, Any]]:
    """(search_alg, param_space): OptunaSearch for Optuna's samplers, else the basic generator."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from sweeper.backends import optuna as ob

    search = spec.search
    if search.sampler not in ("random", "grid"):
        from ray.tune.search.optuna import OptunaSearch

        seed = ob.sampler_seed(spec, 0)
        return OptunaSearch(DefineByRun(search.space), metric=spec.objective.metric, mode=_mode(spec),
                            sampler=ob.make_sampler(spec, seed)), {}
    space: dict[str, Any] = {}
    for path, p in search.space.items():
        if search.sampler == "grid":
            space[path] = tune.grid_search(sp.grid_values(path, p))
        elif isinstance(p, sp.CategoricalParam):
            space[path] = tune.choice(p.choices)
        elif isinstance(p, sp.IntParam):  # randint's upper bound is exclusive, qrandint's inclusive
            space[path] = tune.lograndint(p.low, p.high + 1) if p.log else \
                tune.qrandint(p.low, p.high, p.step) if p.step != 1 else tune.randint(p.low, p.high + 1)
        else:
            space[path] = tune.loguniform(p.low, p.high) if p.log else \
                tune.quniform(p.low, p.high, p.step) if p.step else tune.uniform(p.low, p.high)
    return BasicVariantGenerator(random_state=spec.seed), space


def record(spec: SweepSpec, number: int, config: dict[str, Any], last: dict[str, Any],
           history: list[dict[str, float]], error: Any = None) -> dict[str, Any]:
    """A trial as summary.json and the progress table show it (same keys as optuna.record)."""
    from sweeper.seeding import trial_seed

    metric = spec.objective.metric
    epochs = int(last.get("epoch") or 0)
    if error is not None:
        found = re.search(r"TrialError: (.+)", str(error))
        state, reason = "failed", (found.group(1) if found else str(error).strip().splitlines()[-1])[:500]
    elif last.get("sweeper_state") == "complete":
        state, reason = "complete", None
    else:
        shown = f" ({metric}={last[metric]:.4g})" if metric in last else ""
        state, reason = "pruned", f"stopped at epoch {epochs} by the {spec.search.pruner.type} scheduler{shown}"
    return {"number": number, "state": state, "params": trial_params(spec.search.space, config),
            "value": last.get(metric) if state == "complete" else None, "seed": trial_seed(spec.seed, number),
            "reason": reason, "epochs": epochs, "seconds": last.get("seconds", last.get("time_total_s")),
            "device": last.get("device"), "mlflow_run_id": last.get("mlflow_run_id") or None,
            "node_id": last.get("node_id"), "node_ip": last.get("node_ip"), "history": history}


def _events_callback(spec: SweepSpec) -> Any:
    """Relays Tune's trial events to the observer (EVENTS is looked up at call time because
    Tune pickles its callbacks with the experiment state)."""
    from ray import tune

    spec_data = spec.model_dump(mode="json")

    def emit(event: dict[str, Any]) -> None:
        from sweeper.backends import ray as me

        if me.EVENTS is not None:
            me.EVENTS(event)

    class Events(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            emit({"event": "start", "number": trial_number(trial.config, trial.trial_id)})

        def on_trial_result(self, iteration, trials, trial, result, **info):
            emit({"event": "epoch", "number": result["sweeper_number"], "epoch": result["epoch"], "metrics": result})

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._end(trial, None)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._end(trial, trial.error_message or "error")

        def _end(self, trial: Any, error: Any) -> None:
            number = trial_number(trial.config, trial.trial_id)
            last = trial.last_result or {}
            emit({"event": "end", "record": record(SweepSpec.model_validate(spec_data), number, trial.config,
                                                   last, [], error)})

    return Events()


def _history(result: Any) -> list[dict[str, float]]:
    """The trainer's per-epoch metrics of one Tune result, one row per epoch (the last report of
    an epoch wins). Tune rewrites a trial's result files when it restarts, so after a restart this
    holds only the epochs since; ``_result_record`` prefers the checkpoint's full history."""
    from ray.tune.result import AUTO_RESULT_KEYS

    frame = result.metrics_dataframe
    rows: dict[int, dict[str, float]] = {}
    for row in ([] if frame is None else frame.to_dict("records")):
        if row.get("epoch") is None or (isinstance(row["epoch"], float) and math.isnan(row["epoch"])):
            continue
        rows[int(row["epoch"])] = {k: float(v) for k, v in row.items()
                                   if k not in AUTO_RESULT_KEYS and k not in OWN_KEYS and "/" not in k
                                   and isinstance(v, (int, float)) and not math.isnan(v)}
    return [rows[e] for e in sorted(rows)]


def run(spec: SweepSpec, out_dir: Path, tracker: Tracker, observer: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """Run or resume the sweep on Ray; returns (trial records, parent run id, Tune experiment path)."""
    global EVENTS
    address = spec.search.ray.address or os.environ.get("RAY_ADDRESS") or None
    storage = storage_path(spec, out_dir, address)
    _check_tracking(tracker, address)
    import ray
    from ray import tune

    from sweeper.backends import optuna as ob
    from sweeper.seeding import threads_per_trial
    from sweeper.tracking import git_revision

    # Tune snapshots its experiment state (what a re-run restores) every 10 s or more by default;
    # a small sweep's state is a few kB, so every 2 s loses less work to a killed driver.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
    # With num_to_keep set, Tune also snapshots after a trial's checkpoints replace each other (so a
    # restore never names a deleted one) and warns each time when epochs are short; the snapshot is
    # a few kB here, and the warning would flood the sweep's output.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    _connect(spec, address)
    EVENTS = observer.event
    try:
        storage_path(spec, out_dir, address, nodes=sum(1 for n in ray.nodes() if n["Alive"]))
        experiment = f"{storage.rstrip('/')}/{spec.name}"
        state_file = out_dir / STATE_FILE
        previous = json.loads(state_file.read_text()) if state_file.exists() else {}
        parent = tracker.start_sweep(spec, previous.get("parent_run_id") if previous.get("uri") == tracker.uri else None)
        state_file.write_text(json.dumps({"uri": tracker.uri, "parent_run_id": parent, "experiment": experiment}))

        restoring = tune.Tuner.can_restore(experiment)
        interrupted = tracker.open_trials(parent) if restoring else []
        for run_id in interrupted:  # trials the stopped sweep was running: Tune runs them again
            tracker.end_trial(run_id, "interrupted", "the sweep stopped while this trial ran; the re-run "
                                                     "restarted it")
        observer.started(spec, out_dir, 0, spec.search.n_trials, [])
        if restoring:
            observer.note(f"resuming the Ray Tune experiment at {experiment} ({len(interrupted)} trial(s) restarted)")
        context = Context(spec.model_dump(mode="json"), _absolute_uri(tracker.uri), tracker.experiment, parent,
                          git_revision() or "unknown", threads_per_trial(spec),
                          None if spec.search.sampler in ("random", "grid") else ob.sampler_seed(spec, 0),
                          checkpoint_every(spec))
        resources = {"cpu": spec.search.resources.cpu, "gpu": spec.search.resources.gpu}
        fn = tune.with_resources(tune.with_parameters(trainable, context=context), resources)
        searcher, param_space = make_searcher(spec)
        if restoring:
            tuner = tune.Tuner.restore(experiment, trainable=fn, param_space=param_space,
                                       resume_unfinished=True, resume_errored=False)
        else:
            tuner = tune.Tuner(fn, param_space=param_space, tune_config=_tune_config(spec, searcher),
                               run_config=_run_config(spec, storage))
        if spec.search.pruner.type == "pbt":
            # PBT draws its exploit partners and mutations from Python's global RNG (in this process);
            # which trial exploits which still depends on the order results arrive in.
            random.seed(spec.seed)
        grid = tuner.fit()
        records = sorted((_result_record(spec, r) for r in grid), key=lambda r: r["number"])
        _close_runs(tracker, parent, records)
        _fetch_best_checkpoint(spec, grid, records, out_dir)
    finally:
        EVENTS = None
        ray.shutdown()  # a local Ray stops here; a cluster is only disconnected from
    return records, parent, experiment


def _tune_config(spec: SweepSpec, searcher: Any) -> Any:
    from ray import tune

    search = spec.search
    samples = 1 if search.sampler == "grid" else (search.n_trials or -1)  # grid: every point once
    return tune.TuneConfig(metric=spec.objective.metric, mode=_mode(spec),
                           search_alg=searcher, scheduler=make_scheduler(spec), num_samples=samples,
                           max_concurrent_trials=search.ray.max_concurrent_trials, reuse_actors=search.ray.reuse_actors,
                           time_budget_s=search.timeout, trial_dirname_creator=trial_dirname)


def _run_config(spec: SweepSpec, storage: str) -> Any:
    from ray import tune

    return tune.RunConfig(name=spec.name, storage_path=storage, verbose=0, callbacks=[_events_callback(spec)],
                          failure_config=tune.FailureConfig(max_failures=spec.search.ray.max_failures),
                          checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_kept(spec)))


def _result_record(spec: SweepSpec, result: Any) -> dict[str, Any]:
    number = int(Path(result.path).name.split("-")[1])  # see trial_dirname
    rec = record(spec, number, result.config, result.metrics or {}, _history(result), result.error)
    meta = read_meta(result.checkpoint) if result.checkpoint else None
    if meta and meta["epoch"] == rec["epochs"]:
        # the trial's lineage: under PBT, the epochs before an exploit are the donor's
        rec["history"] = meta["history"]
        rec.update({k: meta[k] for k in ("restarts", "exploits") if meta[k]})
    return rec


def _close_runs(tracker: Tracker, parent: str | None, records: list[dict[str, Any]]) -> None:
    """Trial runs left open: trials Tune stopped (pruned), and earlier attempts of restarted trials."""
    by_run = {r["mlflow_run_id"]: r for r in records if r["mlflow_run_id"]}
    for run_id in tracker.open_trials(parent):
        r = by_run.get(run_id)
        if r is not None:
            tracker.end_trial(run_id, r["state"], r["reason"])
        else:
            tracker.end_trial(run_id, "interrupted", "its worker stopped; Tune ran the trial again")


def _fetch_best_checkpoint(spec: SweepSpec, grid: Any, records: list[dict[str, Any]], out_dir: Path) -> None:
    """Copy the best trial's checkpoint from Tune's storage to <out>/checkpoints (for export)."""
    from sweeper.checkpoint import trial_path
    from sweeper.runner import best_record

    best = best_record(spec, records)
    if best is None:
        return
    result = next(r for r in grid if int(Path(r.path).name.split("-")[1]) == best["number"])
    dest = trial_path(out_dir, best["number"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as folder:
        shutil.copyfile(Path(folder) / "model.pt", dest)
