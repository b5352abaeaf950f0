"""run_sweep(spec): check -> warm start -> search (any backend) -> keep checkpoints -> best ->
export -> record. Nothing here depends on which backend searches."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from sweeper.errors import UserError
from sweeper.export import registrar
from sweeper.files import remove_stale_temps, write_atomic
from sweeper.phases import launched_at, phase
from sweeper.plan import budget_clock, sized_space
from sweeper.plan.resolve import resolve_sweep
from sweeper.plan.sized_space import Sized
from sweeper.pluginhost.base_point import base_point, family_points
from sweeper.search import backend, checkpoints, pool
from sweeper.search.backend import Observer, SearchContext, SearchResult
from sweeper.search.interim import InterimReview
from sweeper.search.state import Prepared, Role, SweepStore
from sweeper.search.trial_runs import SweepInfo, end_sweep_run, git_revision, start_sweep_run
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.track.journal import FOLDER as JOURNAL
from sweeper.track.mlflow import Tracker, redact, resolve_uri
from sweeper.track.records import TrialRecord
from sweeper.track.remote import RemoteTracker
from sweeper.track.sync import sync_tracker
from sweeper.trial.build import DataCache, ProcessCache
from sweeper.trial.checkpoint import trial_path

TRACKER_ATTEMPTS = 5
LOCK_FILE = "run.lock"  # in --out: held by the `sweeper run` using the folder
SIZED_FILE = "auto_space.json"  # in --out: the sizing of a derived space, read back on a resume
REFIT_FILE = "refit.pt"  # in --out: export.refit's model weights
PARAM: TypeAdapter[sp.Param] = TypeAdapter(sp.Param)


def default_out_dir(spec: SweepSpec) -> Path:
    return Path("runs") / spec.name


def tracker_for(spec: SweepSpec, out_dir: Path | None = None) -> Tracker:
    """The sweep's tracker; with ``out_dir``, its writes wait in out_dir/mlflow-journal while
    the server is away."""
    if not spec.tracking.enabled:
        return Tracker(None)
    uri = resolve_uri(spec.tracking.mlflow_uri)
    for attempt in range(TRACKER_ATTEMPTS):
        try:
            # a sweep's tracker sends what needs no answer from a thread of its own (track/sender.py),
            # in the registrar's process where one was started for this sweep (it imports MLflow anyway)
            experiment, journal = spec.tracking.experiment or spec.name, out_dir / JOURNAL if out_dir else None
            channel = registrar.tracking_channel() if out_dir is not None else None
            if channel is not None:
                return RemoteTracker(channel, uri, experiment, journal, asynchronous=True)
            return Tracker(uri, experiment, journal, asynchronous=out_dir is not None)
        except UserError:
            raise
        except Exception:  # processes starting together race to create (migrate) a new MLflow database
            if attempt + 1 == TRACKER_ATTEMPTS or not uri.startswith(("sqlite", "postgresql", "mysql")):
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def folder_lock(out_dir: Path) -> Iterator[None]:
    """One `sweeper run` per output folder (an advisory lock the kernel drops with the process,
    even on SIGKILL). Workers on this machine may share the folder: they write only checkpoints."""
    import fcntl
    import os
    import socket

    path = out_dir / LOCK_FILE
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"{out_dir}: this output folder is in use by `sweeper run` ({holder}); wait for it "
                f"to finish, give this run another --out, or add this process to the sweep "
                f"with `sweeper worker`"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        remove_stale_temps(out_dir)  # what a killed earlier run was writing (live workers' stay)
        yield


@dataclass
class Visit:
    """How a queue's worker (queue/worker.py) serves a sweep, visit after visit."""

    elsewhere: Callable[[bool, float], bool]  # asked before each claim: leave for another sweep (SearchContext)
    preempt: Callable[[], str | None]  # asked after each epoch: a reason to stop the trial there
    # the sweep's data set and compiled forwards, kept between the worker's visits
    cache: ProcessCache = field(default_factory=ProcessCache)
    checked: bool = False  # its dry build passed on an earlier visit: not built again
    # its study and ledger, opened and joined on the first visit (its heartbeat renews the
    # worker's membership meanwhile); close() when the worker is done with the sweep
    store: SweepStore | None = None

    def close(self) -> None:
        """Let go of what the visits kept: the store (membership, connections) and the data set."""
        if self.store is not None:
            self.store.close()
            self.store = None
        self.cache = ProcessCache()


@dataclass(frozen=True)
class Serving:
    """What this process serves the resolved sweep with (run_sweep gathers it)."""

    out_dir: Path
    observer: Observer
    role: Role
    searcher: backend.Backend
    store: SweepStore  # the one the searcher's store() returned (or a worker's visit kept)
    cache: ProcessCache  # this process's data set and compiled forwards
    prestarted: pool.Prestarted  # worker processes started early, for a pool to take
    visit: Visit | None  # a queue's worker's


def _check_ranks(spec: SweepSpec) -> None:
    """Each worker's DDP ranks on GPUs of their own (trial/rank.py: worker w's ranks use GPUs
    w*N .. w*N+N-1): refused before anything runs where this machine has fewer than workers x N."""
    import torch

    train, workers = spec.train, spec.search.parallel
    cuda = train.device == "cuda" or (train.device == "auto" and torch.cuda.is_available())
    if train.devices == 1 or not cuda or spec.search.backend == "ray":  # Ray reserves a trial's GPUs itself
        return
    if (visible := torch.cuda.device_count()) < workers * train.devices:
        raise UserError(
            f"train.devices: {train.devices} with search.parallel: {workers} needs {workers * train.devices} "
            f"GPUs (one per rank, none shared); this machine has {visible}: lower either"
        )


def run_sweep(
    spec: SweepSpec, out_dir: Path, observer: Observer, role: Role = Role.RUN, visit: Visit | None = None
) -> dict[str, Any]:
    """Serve the sweep from ``out_dir`` as ``role``: RUN (until every trial has finished;
    then summarise and export; returns the summary, also written there), FINISH (the same for a
    queued sweep whose trials have all ended: its budget as the ledger holds it) or WORKER (until
    no trial is left to claim, or a queue's ``visit`` says to serve another sweep; returns a small
    report of what it trained)."""
    import torch

    # this process's data set (sizing, warm start, inline trials, export) and compiled forwards
    cache = visit.cache if visit is not None else ProcessCache()
    searcher = backend.load(spec.search.backend)
    prestarted = pool.Prestarted()

    def before_build(resolved: SweepSpec) -> None:  # this machine and backend checked; the pool started
        if resolved.train.device == "cuda" and not torch.cuda.is_available():
            raise UserError(
                "train.device: 'cuda' was asked for but this machine has no CUDA device; use 'auto' or 'cpu'"
            )
        _check_ranks(resolved)
        searcher.check(resolved, out_dir)
        if resolved.search.backend == "optuna" and resolved.search.parallel > 1:
            prestarted.start(resolved.search.parallel)  # the workers start while this process builds

    try:
        # the one resolve step (plan/resolve.py); sized by `sweeper run` only (a worker joining with
        # --study reads the sized spec the sweep stored); the data prepared once and each plugin
        # choice built on the CPU before any file, run or trial (a queue's worker: on its first visit)
        with phase("resolve"):
            resolved = resolve_sweep(
                spec,
                size=(lambda derived: _sized(derived, out_dir, cache)) if role == Role.RUN else None,
                before_build=before_build,
                build=visit is None or not visit.checked,
            )
        spec = resolved.spec
        for change in resolved.sized or []:
            print(f"note: {change}", file=sys.stderr)
        for warning in resolved.warnings() if resolved.dry is not None else []:  # settings without effect
            print(f"warning: {warning}", file=sys.stderr)
        if visit is not None:
            visit.checked = True
        out_dir.mkdir(parents=True, exist_ok=True)
        with folder_lock(out_dir) if role != Role.WORKER else contextlib.nullcontext():
            kept = visit.store if visit is not None else None
            with phase("storage"):
                store = kept if kept is not None else searcher.store(spec, out_dir)
            try:
                serving = Serving(out_dir, observer, role, searcher, store, cache, prestarted, visit)
                return _serve(spec, serving, resolved.sized)
            finally:
                if visit is not None:
                    visit.store = store  # for the next visit
                else:
                    store.close()
    finally:
        prestarted.discard()  # none when the pool took them


def _sized(derived: SweepSpec, out_dir: Path, cache: ProcessCache) -> Sized:
    """The derived space sized to the budget (plan/sized_space.py), once per output folder: a
    resume reads the sizing back from SIZED_FILE (timing differs between runs, the trial table
    must not), unless what a trial's cost depends on, or the budget, changed."""
    key = json.loads(derived.model_dump_json(include={"dataset", "data", "model", "optimizer", "train", "seed"}))
    key["search"] = json.loads(derived.search.model_dump_json(include={"space", "budget"}))
    path = out_dir / SIZED_FILE
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept["key"] == key:
            space = {p: PARAM.validate_python(v) for p, v in kept["space"].items()}
            search = derived.search.model_copy(update={"space": space})
            return Sized(derived.model_copy(update={"search": search}), list(kept["changes"]), kept.get("base_s"))
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: size again
        pass
    sized = sized_space.size(derived, cache.data)
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = {"key": key, "space": sp.as_json(sized.spec.search.space), "changes": sized.changes, "base_s": sized.base_s}
    write_atomic(path, json.dumps(kept, indent=1))
    return sized


def _prepare(spec: SweepSpec, out_dir: Path, tracker: Tracker, observer: Observer, cache: ProcessCache) -> Prepared:
    """This process prepares the sweep: its MLflow parent run and the LR warm start."""
    parent = start_sweep_run(tracker, spec, None)
    if not spec.search.lr_finder.enabled:
        return Prepared(tracking_uri=redact(tracker.uri), parent_run_id=parent, enqueue=_base(spec), fresh=True)
    from sweeper.search import lr_range_tests

    warm = lr_range_tests.prepare(spec, out_dir, cache)
    lr_range_tests.log(tracker, parent, warm, out_dir)
    observer.note(warm.note)
    lr = lr_range_tests.lr_param(warm.spec)
    return Prepared(
        tracking_uri=redact(tracker.uri),
        parent_run_id=parent,
        lr_range=(lr.low, lr.high),
        enqueue=[*_base(warm.spec), *warm.enqueue],
        lr_finder=warm.summary(),
        fresh=True,
    )


def _base(spec: SweepSpec) -> list[dict[str, Any]]:
    """The sweep's first trials (in the space the LR warm start narrowed): the family round's
    (search.family_round: slots 0 to families - 1, each family's base point, the spec's own
    first), else with search.base_first the base point; prepared once and stored with the
    sweep, so a resume does not run them again."""
    if spec.search.family_round is not None:
        return family_points(spec)  # the base point is the round's first trial, promoted if it survives
    return [base_point(spec)] if spec.search.base_first and spec.search.space else []


def _serve(spec: SweepSpec, serving: Serving, sized: list[str] | None) -> dict[str, Any]:
    """Serve the resolved sweep: prepare it (once, whichever process comes first), search, then
    (not a worker) summarise and export. ``sized``: the changes sizing made to a derived space
    (None: not sized), for summary.json."""
    out_dir, role = serving.out_dir, serving.role
    if role != Role.WORKER:
        write_atomic(out_dir / "spec.yaml", yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    with phase("tracker"):
        tracker = tracker_for(spec, out_dir)
        _send_journals(tracker, out_dir, "start")
        serving.observer.started(spec, out_dir)
        prepared = serving.store.prepare(
            spec, role, redact(tracker.uri), lambda: _prepare(spec, out_dir, tracker, serving.observer, serving.cache)
        )
        if not prepared.fresh and role != Role.WORKER:
            tracker.resume_run(prepared.parent_run_id)
    spec = prepared.apply(spec)  # the LR finder may have narrowed the space
    started = time.perf_counter()
    with phase("trials"):
        result = _search(spec, serving, tracker, prepared)
    if role == Role.WORKER:
        _send_journals(tracker, out_dir, "end")
        return {
            "name": spec.name,
            "role": Role.WORKER,
            "storage": result.storage,
            "counts": checkpoints.standing(spec, result.records)["counts"],
            "best": None,
            "trials": [],
        }
    with phase("summary"):
        summary = _finish(spec, result, serving, tracker, prepared)
    summary["search_seconds"] = time.perf_counter() - started  # this invocation's search, wall time
    if sized is not None:
        summary["auto_space_sized"] = sized
    return _export_and_record(spec, summary, result, serving, tracker)


def _search(spec: SweepSpec, serving: Serving, tracker: Tracker, prepared: Prepared) -> SearchResult:
    """The search itself (any backend), its interim report redrawn meanwhile (`sweeper run`); on
    any error the sweep's MLflow run says it stopped, and a re-run resumes it."""
    parent, role, visit = prepared.parent_run_id, serving.role, serving.visit
    interim = None
    if role == Role.RUN and parent:
        slowdown = budget_clock.contention()
        clock = budget_clock.clock(spec, slowdown=slowdown)  # a resume's clock ends sooner: it spent some
        until = None if clock is None else launched_at() + clock.trials_s()
        interim = InterimReview(serving.observer, spec, tracker, parent, until, budget_clock.FINISH_S * slowdown)
    ctx = SearchContext(
        serving.out_dir,
        tracker,
        SweepInfo(parent, spec.seed, str(serving.out_dir.resolve()), git_revision()),
        interim or serving.observer,
        serving.store,
        role,
        enqueue=prepared.enqueue,
        cache=serving.cache,
        prestarted=serving.prestarted,
        elsewhere=visit.elsewhere if visit is not None else None,
        preempt=visit.preempt if visit is not None else None,
    )
    try:
        result = serving.searcher.run(spec, ctx)
    except BaseException as exc:
        if role != Role.WORKER:
            with contextlib.suppress(Exception):  # the original error is what the user must see
                tracker.end_run(parent, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    if interim is not None and (failure := interim.close()) is not None:  # before the final report replaces it
        print(f"warning: the sweep's interim report could not be drawn: {failure}", file=sys.stderr)
    return result


def _finish(
    spec: SweepSpec, result: SearchResult, serving: Serving, tracker: Tracker, prepared: Prepared
) -> dict[str, Any]:
    """The searched sweep's summary: its records, the checkpoints it keeps, what preparing it found."""
    _send_journals(tracker, serving.out_dir, "search")  # runs created offline get their MLflow ids for the summary
    parent = tracker.real_id(prepared.parent_run_id)
    checkpoints.prune(spec, result.records, serving.out_dir)
    summary = summarize(spec, result, serving.out_dir, tracker, parent)
    if prepared.lr_finder is not None:
        summary["lr_finder"] = prepared.lr_finder
    if prepared.warm_start is not None:
        summary["warm_start"] = prepared.warm_start
    return summary


def _export_and_record(
    spec: SweepSpec, summary: dict[str, Any], result: SearchResult, serving: Serving, tracker: Tracker
) -> dict[str, Any]:
    """The chosen trial scored on the test split and exported, the report drawn, summary.json
    written and the sweep's MLflow run ended with its files."""
    out_dir = serving.out_dir
    parent = summary["mlflow"]["parent_run_id"]  # its real MLflow id (_finish)
    files = [out_dir / "spec.yaml"]
    with phase("test score"):
        chosen = _chosen(spec, summary["best"], out_dir, tracker, result.records, serving.cache.data)
        chosen, test = _score_chosen(spec, summary, out_dir, chosen)  # before the report draws the summary
    drawing = _review(summary, out_dir)  # the plots, drawn while the export runs
    if summary["best"] is not None and spec.export.formats:
        if isinstance(chosen, Chosen):
            handed, exported = handoff(spec, summary["best"], out_dir, tracker, parent, chosen, test)
        else:
            handed, exported = {"export": {"error": chosen}}, []
        summary.update(handed)
        files += exported
    summary_path = out_dir / "summary.json"
    write_atomic(summary_path, json.dumps(summary, indent=2, default=str))
    with phase("report"):
        reviewed = _reviewed(drawing, summary)  # [report, *plots], or none
    report, plots = (reviewed[0], reviewed[1:]) if reviewed else (None, [])
    with phase("end"):
        end_sweep_run(tracker, parent, summary, [summary_path, *files, *([report] if report else [])], plots)
        _send_journals(tracker, out_dir, "end")
    return summary


def _review(summary: dict[str, Any], out_dir: Path) -> Any:
    """The plots of the search (review/), begun on a thread; None (said) if they cannot be."""
    try:
        from sweeper.review import report

        return report.Drawing(json.loads(json.dumps(summary, default=str)), out_dir)
    except Exception as exc:
        _no_report(exc)
        return None


def _reviewed(drawing: Any, summary: dict[str, Any]) -> list[Path]:
    """report.html and the PNGs for the sweep's run: [report, *PNGs]; [] when they could not be
    drawn (said; nothing else is lost)."""
    try:
        return drawing.finish(json.loads(json.dumps(summary, default=str))) if drawing is not None else []
    except Exception as exc:
        _no_report(exc)
        return []


def _no_report(exc: Exception) -> None:
    print(f"warning: the sweep's report could not be written: {type(exc).__name__}: {exc}", file=sys.stderr)


def _send_journals(tracker: Tracker, out_dir: Path, when: str) -> None:
    """Send the MLflow writes that wait in the folder's journals (the server was away), and
    say on stderr what an earlier run had left, or what still waits at the end."""
    report = tracker.synced() if isinstance(tracker, RemoteTracker) else sync_tracker(tracker)
    if when == "start" and report.sent:
        print(
            f"note: sent the {report.sent} MLflow writes that an earlier process left in {out_dir / JOURNAL}",
            file=sys.stderr,
        )
    if when == "end" and report.waiting:
        print(
            f"warning: {report.waiting} MLflow writes wait in {out_dir / JOURNAL} (MLflow at "
            f"{', '.join(sorted(set(report.unreachable))) or redact(tracker.uri)}): "
            f"`sweeper sync {out_dir}` sends them",
            file=sys.stderr,
        )


def summarize(
    spec: SweepSpec, result: SearchResult, out_dir: Path, tracker: Tracker, parent: str | None
) -> dict[str, Any]:
    """summary.json: the resolved spec, the best trial (with objectives: the point of the Pareto
    front export.choose picks), the front, and every trial, whichever backend ran them."""
    # runs created while MLflow was away: their MLflow ids, once sent
    ids = tracker.found_ids([r.mlflow_run_id for r in result.records], parent)
    records = [r.model_copy(update={"mlflow_run_id": run_id}) for r, run_id in zip(result.records, ids)]
    standing = checkpoints.standing(spec, records)
    if standing["best"] is not None:
        standing["best"]["checkpoint"] = str(trial_path(out_dir, standing["best"]["number"]))
    return {
        "name": spec.name,
        "out_dir": str(out_dir),
        **standing,
        "storage": result.storage,
        **result.summary,
        "mlflow": {
            "tracking_uri": redact(tracker.uri),
            "experiment": tracker.experiment,
            "experiment_id": tracker.experiment_id,
            "parent_run_id": parent,
        },
        "spec": spec.model_dump(mode="json"),
        # device-hours (GPU-hours on CUDA, core-hours on the CPU) of every process's finished trials
        "device_hours": {
            "spent": result.device_hours,
            "budget": spec.search.budget.device_hours if spec.search.budget else None,
        },
        "trials": [r.model_dump(mode="json") for r in records],
    }


@dataclass(frozen=True, eq=False)
class Chosen:
    """The chosen trial's model rebuilt from its checkpoint (on the CPU, eval mode), its data as
    the trials saw it, and its fitted task."""

    model: Any
    data: Any
    task: Any


def _chosen(
    spec: SweepSpec,
    best: dict[str, Any] | None,
    out_dir: Path,
    tracker: Tracker,
    records: list[TrialRecord],
    data_cache: DataCache | None,
) -> Chosen | str | None:
    """The best trial rebuilt once, for its test score and its export; None without a best
    trial; the reason as a string when it cannot be rebuilt (recorded, never fatal)."""
    from sweeper.trial.build import rebuild

    if best is None:
        return None
    try:
        top = next(r for r in records if r.number == best["number"])
        best["checkpoint"] = str(checkpoints.fetch(spec, tracker, top, out_dir))  # trained here or elsewhere
        return Chosen(*rebuild(spec.with_values(best["params"]), Path(best["checkpoint"]), data_cache))
    except Exception as exc:
        return f"rebuilding trial {best['number']} from {best['checkpoint']} failed: {type(exc).__name__}: {exc}"


def held_out(spec: SweepSpec, best: dict[str, Any], chosen: Chosen) -> dict[str, Any]:
    """The chosen trial's score on the data set's test split (trial/holdout.py), read here once,
    after the search: ``test_metrics`` and ``test_samples`` for the summary's best trial (with
    ``test_error`` instead when scoring failed); nothing when the data set has no test split."""
    from sweeper.trial import holdout

    try:
        scored = holdout.score_chosen(spec.with_values(best["params"]), chosen.model, chosen.task)
    except Exception as exc:  # the sweep and its trials are done: keep them, say why
        return {"test_error": f"scoring trial {best['number']} on the test split failed: {type(exc).__name__}: {exc}"}
    if scored is None:
        return {}
    return {"test_metrics": scored.metrics, "test_samples": scored.samples}


def _score_chosen(
    spec: SweepSpec, summary: dict[str, Any], out_dir: Path, chosen: Chosen | str | None
) -> tuple[Chosen | str | None, dict[str, Any] | None]:
    """The chosen trial scored on the test split (into the summary's best trial), refit where
    export.refit asks (the summary's ``refit``): the model to export and its test score."""
    best = summary["best"]
    if isinstance(chosen, str):  # not rebuilt: nothing to score either
        best["test_error"] = chosen
    if not isinstance(chosen, Chosen):
        return chosen, None
    best.update(held_out(spec, best, chosen))
    if spec.export.refit:
        summary["refit"], refitted = _refit(spec, best, out_dir, chosen)
        if refitted is not None:
            return refitted, _test_of(summary["refit"])
    return chosen, _test_of(best)


def _test_of(scored: dict[str, Any]) -> dict[str, Any] | None:
    """export.json's ``test`` from a summary entry that ``held_out`` filled."""
    return {"metrics": scored["test_metrics"], "samples": scored["test_samples"]} if "test_metrics" in scored else None


def _refit(
    spec: SweepSpec, best: dict[str, Any], out_dir: Path, chosen: Chosen
) -> tuple[dict[str, Any], Chosen | None]:
    """export.refit: the chosen configuration trained on training + validation samples
    (trial/refit.py), scored on the test split: the summary's ``refit`` entry and the model to
    export (None when the refit failed: the chosen trial's model is exported, the entry says why)."""
    from sweeper.trial import refit

    path = out_dir / REFIT_FILE
    chosen_spec = spec.with_values(best["params"])
    try:
        trained = refit.refit(chosen_spec, best["seed"], best["params"], path)
    except Exception as exc:
        return {"error": f"refitting trial {best['number']} failed: {type(exc).__name__}: {exc}"}, None
    model = trained.model.cpu().eval()
    entry: dict[str, Any] = {
        "trial": best["number"],
        "seed": best["seed"],
        "epochs": len(trained.history),
        "train_samples": int(trained.data.train_y.shape[0]),
        "checkpoint": str(path),
    }
    entry.update(held_out(spec, best, Chosen(model, chosen.data, trained.task)))
    return entry, Chosen(model, chosen.data, trained.task)


def handoff(
    spec: SweepSpec,
    best: dict[str, Any],
    out_dir: Path,
    tracker: Tracker,
    parent: str | None,
    chosen: Chosen,
    test: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Path]]:
    """Export the chosen model to every format of ``spec.export`` (export.json, with its ``test``
    score where the sweep has one) and register it under the sweep's run. Returns the
    summary's ``export`` and ``registry`` entries and the files to log; a failure is recorded
    there, never fatal to the sweep."""
    from sweeper import export
    from sweeper.export import registrar

    model, data, task = chosen.model, chosen.data, chosen.task
    source = {
        "trial": best["number"],
        "mlflow_run_id": best["mlflow_run_id"],
        "checkpoint": best["checkpoint"],
        "objective": best["values"],
    }
    registering = None
    if parent is not None:  # by the registrar's process, while this one writes and checks the files
        made = registrar.Job(chosen.model, chosen.data, chosen.task, str(tracker.uri), parent, best["values"])
        registering = registrar.register_meanwhile(spec, made)
    with phase("export"):
        exported = export.export_model(model, data, out_dir, spec.export, source=source, task=task, test=test)
    handed: dict[str, Any] = {"export": exported}
    if registering is not None:
        try:
            with phase("registry wait"):
                handed["registry"] = registering.result()
        except Exception as exc:  # the sweep and its files are done: keep them
            handed["registry"] = {"error": f"registering the model in MLflow failed: {type(exc).__name__}: {exc}"}
    return handed, export.artifacts(handed["export"])
