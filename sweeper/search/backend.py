"""The Backend protocol: who proposes, runs and stops trials. The runner (runner.py) does
everything around the search the same way for every backend; a backend only searches.

A backend's ``run(spec, ctx)`` runs (or resumes) the search until the budget is spent, reports
each trial's start, epochs and end to ``ctx.observer`` as TrialEvents, logs each trial to its
MLflow run (search/trial_runs.py) nested under ``ctx.sweep.parent_run_id``, leaves each
completed trial's final training state at ``trial_path(ctx.out_dir, number)`` for the trials
that search/checkpoints.py keeps, and returns every trial of the sweep as a TrialRecord.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sweeper.search.state import Role, SweepStore
from sweeper.search.trial_runs import SweepInfo
from sweeper.spec import SweepSpec
from sweeper.track.mlflow import Tracker
from sweeper.track.records import TrialEvent, TrialRecord

if TYPE_CHECKING:  # imported on use: torch
    from sweeper.search.pool import Prestarted
    from sweeper.trial.build import ProcessCache

# search.backend -> the class implementing it (imported on use: ray is heavy)
BACKENDS = {"optuna": "sweeper.search.optuna:OptunaBackend", "ray": "sweeper.search.ray:RayBackend"}


class Observer(Protocol):
    """Receives a sweep's progress (the CLI's rich display, or nothing in quiet mode)."""

    def started(self, spec: SweepSpec, out_dir: Path) -> None: ...
    def event(self, event: TrialEvent) -> None: ...
    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class SearchContext:
    out_dir: Path
    tracker: Tracker
    sweep: SweepInfo
    observer: Observer
    store: SweepStore  # the one the backend's store() returned
    role: Role = Role.RUN
    # params of the sweep's first trials (the LR-finder warm start)
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # this process's data set and compiled forwards (the LR warm start's data set, for trials it trains)
    cache: ProcessCache | None = None
    prestarted: Prestarted | None = None  # worker processes started early, for a pool to take
    # a queue's worker (search/queue): asked before each claim; True: leave for another sweep
    elsewhere: Callable[[bool, float], bool] | None = None
    # a queue's worker (one trial at a time, in this process): asked after each epoch; a reason
    # (e.g. which sweep waits) when the trial's device is wanted by a sweep of higher priority
    preempt: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class SearchResult:
    records: list[TrialRecord]  # every trial of the sweep, by number
    storage: str  # where the backend keeps its state (a re-run resumes from it)
    # summary.json entries the backend adds (Optuna: space_version, space_versions)
    summary: dict[str, Any] = field(default_factory=dict)
    device_hours: float | None = None  # what the sweep's finished trials spent, every process's (optuna)


class Backend(Protocol):
    def check(self, spec: SweepSpec, out_dir: Path) -> None:
        """Raise UserError for what would stop the search, before the sweep records anything."""

    def store(self, spec: SweepSpec, out_dir: Path) -> SweepStore:
        """Where the sweep's preparation is kept (search/state.py); opened once per process."""

    def run(self, spec: SweepSpec, ctx: SearchContext) -> SearchResult: ...


def load(name: str) -> Backend:
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
