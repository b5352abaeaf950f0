"""Lessons from earlier sweeps (``search.warm_start``): the finished trials of earlier studies
seed a new sweep's sampler.

A source is an earlier sweep's output folder (its spec.yaml names the study and its storage),
a storage URL, ``sqlite:///f.db#study`` (the study may be left out when the database holds one),
or an MLflow experiment, ``mlflow:NAME``, at the spec's tracking URI (earlier_mlflow.py).
Each finished trial (complete; pruned, with its last reported value) is fitted to the new space
(``space.fit``: parameters the space lacks dropped, numbers clipped, a categorical value no
longer offered drops the trial). The fitted trials are added to the new study once, when the
sweep is first prepared, in one transaction and in a fixed order (sources as listed, trials by
number): observations, marked ``EARLIER``, which the sampler learns from and which are not the
sweep's trials (no slot of the budget, not in its trial table or summary). The parameters of a
few complete ones are enqueued as the sweep's first trials, re-evaluated under the new spec: the
best first, or a near-best one that cost at most half as much (``best``). A point the sweep would
enqueue itself (its base point, an LR suggestion) that an earlier sweep measured already is not
run again (``unmeasured``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from sweeper.errors import UserError
from sweeper.review.study_view import distribution
from sweeper.search.optuna import earlier_mlflow, rdb
from sweeper.search.optuna.ledger import studies as recorded
from sweeper.search.optuna.study import (
    EARLIER,
    INFO,
    directions,
    earlier,
    interrupted,
    make_storage,
    safe_url,
    storage_url,
)
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp

RE_EVALUATED = 3  # the best complete earlier trials run again first: a few, so the budget goes to new points
# Earlier trials whose value is within this share of the best one's count as near-best: a
# re-evaluation under a new seed does not tell near-equal values apart anyway. 1 %: a choice (of
# accuracy, about a point), not a measurement.
NEAR_BEST = 0.01
# A near-best trial runs again before a better one only when it cost at most this share of that
# one's device seconds: a warm start's time to its first good result is its first re-evaluated
# trial's time, but recorded seconds carry the machine's noise, which on a shared CPU comes close
# to this share (the figures: docs/search-spaces.md#sized-to-the-budget), so a smaller difference
# is noise, not a cheaper trial, and ordering by it would trade a better value for nothing.
CHEAPER = 0.5
SPEC_FILE = "spec.yaml"  # in an output folder: the spec the sweep ran with (runner.py writes it)


@dataclass(frozen=True)
class Source:
    """Where one ``search.warm_start`` entry's study is."""

    index: int  # its place in search.warm_start
    url: str
    study: str | None  # None: the database's only study

    @property
    def where(self) -> str:
        return f"search.warm_start[{self.index}]"

    @property
    def experiment(self) -> str | None:
        """The MLflow experiment of an ``mlflow:NAME`` source; None for a study."""
        return self.url.removeprefix(earlier_mlflow.PREFIX) if self.url.startswith(earlier_mlflow.PREFIX) else None


def sources(spec: SweepSpec) -> list[Source]:
    """The spec's warm-start sources, resolved (an output folder read for its study)."""
    out = []
    for i, entry in enumerate(spec.search.warm_start):
        if entry.startswith(earlier_mlflow.PREFIX):
            out.append(Source(i, entry, None))
            continue
        if "://" in entry:
            url, _, name = entry.partition("#")
            out.append(Source(i, url, name or None))
            continue
        folder = Path(entry).expanduser()
        shown = f"search.warm_start[{i}]: {entry[:120]!r}"
        try:
            there = folder.is_dir()
        except (OSError, ValueError):  # a name no file system has (a NUL byte, too long)
            there = False
        if not there:
            raise UserError(f"{shown}: no such folder; give an earlier sweep's --out folder or its storage URL")
        try:
            earlier_spec = yaml.safe_load((folder / SPEC_FILE).read_text(encoding="utf-8"))
            name, storage = earlier_spec["name"], earlier_spec["search"].get("storage")
        except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError):
            raise UserError(
                f"{shown}: not a sweep's output folder (no readable {SPEC_FILE} naming its study); "
                f"give the folder `sweeper run --out` wrote, or a storage URL"
            ) from None
        url = storage or f"sqlite:///{(folder / 'optuna.db').resolve()}"
        out.append(Source(i, url, str(name)))
    return out


def check(spec: SweepSpec, out_dir: Path | None) -> None:
    """Refuse, before anything runs, a source that is this sweep itself, is not there, holds no
    such study, or measured another objective. A sweep begun already has read its sources (a
    worker joining it, a resume): they need not be there any more."""
    found = sources(spec)
    own_experiment = (spec.tracking.experiment or spec.name) if spec.tracking.enabled else None
    for source in found:
        if source.experiment is not None and source.experiment == own_experiment:
            raise UserError(
                f"{source.where}: MLflow experiment {source.experiment!r} is where this sweep logs its own "
                f"trials; warm-start from another sweep's experiment (or set tracking.experiment)"
            )
    if out_dir is None:
        mine = None
    else:
        mine = (storage_url(spec, out_dir), spec.name)
        for source in found:
            if source.study == spec.name and _same_db(source.url, mine[0]):
                raise UserError(
                    f"{source.where}: that is this sweep's own study; a re-run resumes it already "
                    f"(warm-start from another sweep, or give this one another name)"
                )
        if _begun(*mine):
            return
    for source in found:
        if source.experiment is not None:
            earlier_mlflow.trials(spec, source.index, source.experiment)
        else:
            _open(spec, source, mine)


def _begun(url: str, name: str) -> bool:
    """Whether the database at ``url`` holds sweep ``name`` already (a sqlite file is not made)."""
    if url.startswith("sqlite:///") and not _sqlite_file(url).is_file():
        return False
    try:
        return name in recorded(url)
    except UserError:  # unreachable: the store says so when it opens the study
        return False


def _sqlite_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def _open(spec: SweepSpec, source: Source, mine: tuple[str, str] | None) -> optuna.Study:
    if source.url.startswith("sqlite:///") and not _sqlite_file(source.url).is_file():
        raise UserError(f"{source.where}: no study database at {source.url}")  # sqlite would create one
    try:
        storage = make_storage(source.url, spec)
    except UserError as exc:  # its message names search.storage: name the source instead
        raise UserError(f"{source.where}: {str(exc).removeprefix('search.storage: ')}") from None
    names = optuna.get_all_study_names(storage)
    name = source.study
    if name is None and len(names) == 1:
        name = names[0]
    if name is None or name not in names:
        raise UserError(
            f"{source.where}: {safe_url(source.url)} holds no study {name or ''!r}; it holds: "
            f"{', '.join(names) or 'none'}{'' if name else ' (name one: URL#study)'}"
        )
    if mine is not None and (_same_db(source.url, mine[0]) and name == mine[1]):  # named by the URL alone
        raise UserError(f"{source.where}: that is this sweep's own study; warm-start from another sweep")
    study = optuna.load_study(study_name=name, storage=storage)
    if study.directions != [optuna.study.StudyDirection[d.upper()] for d in directions(spec)]:
        raise UserError(
            f"{source.where}: study {name!r} has {len(study.directions)} objective(s) "
            f"({', '.join(d.name.lower() for d in study.directions)}); this sweep "
            f"{', '.join(directions(spec))}: its values do not compare"
        )
    theirs, ours = study.metric_names, [g.metric for g in spec.goals]
    if theirs is not None and theirs != ours:
        raise UserError(
            f"{source.where}: study {name!r} measured {', '.join(theirs)}; this sweep measures "
            f"{', '.join(ours)}: its values do not compare"
        )
    return study


def _same_db(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        if url.startswith("sqlite:///"):
            return "sqlite:///" + str(_sqlite_file(url).resolve())
        return url

    return norm(a) == norm(b)


@dataclass(frozen=True)
class Lesson:
    """One earlier trial fitted to this sweep's space."""

    source: int  # index in search.warm_start
    number: int  # its number in its study
    state: OptunaState  # COMPLETE or PRUNED
    params: dict[str, Any]  # fitted
    values: list[float]  # complete: its objective values; pruned: [its last reported value]
    step: int | None  # pruned: the epoch of that value
    device_seconds: float | None = None  # what it cost (search.budget's unit); None: not recorded


def lessons(spec: SweepSpec) -> tuple[list[Lesson], dict[str, Any]]:
    """The finished trials of every source fitted to the space, in order (sources as listed, trials
    by number), and what was read (summary.json's ``warm_start``)."""
    read: list[dict[str, Any]] = []
    out: list[Lesson] = []
    for source in sources(spec):
        if source.experiment is not None:
            finished = earlier_mlflow.trials(spec, source.index, source.experiment)
            read.append({"source": spec.search.warm_start[source.index], "experiment": source.experiment})
        else:
            study = _open(spec, source, None)
            trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
            finished = [f for f in map(_finished, trials) if f is not None]
            read.append({"source": spec.search.warm_start[source.index], "study": study.study_name})
        found = [_lesson(spec, source.index, f) for f in finished]
        out += [lesson for lesson in found if lesson is not None]
        read[-1]["used"] = sum(lesson is not None for lesson in found)
        if None in found:
            read[-1]["not_fitting"] = found.count(None)
    return out, {"sources": read}


def _finished(t: FrozenTrial) -> earlier_mlflow.Finished | None:
    """A study's trial as a finished earlier trial, or None: not finished, interrupted, or itself
    an earlier sweep's lesson (its own source says it)."""
    if earlier(t) or interrupted(t) or t.state not in (OptunaState.COMPLETE, OptunaState.PRUNED):
        return None
    cost = t.user_attrs.get(INFO, {}).get("device_seconds")
    return earlier_mlflow.Finished(t.number, t.state, t.params, t.values, t.intermediate_values, cost)


def _lesson(spec: SweepSpec, source: int, t: earlier_mlflow.Finished) -> Lesson | None:
    """``t`` fitted to the space as a lesson, or None: it does not fit, or lacks its values."""
    params = sp.fit(spec.search.space, t.params)
    if params is None:
        return None
    if t.state == OptunaState.COMPLETE:
        if t.values is None or len(t.values) != len(spec.goals) or not all(math.isfinite(v) for v in t.values):
            return None
        return Lesson(source, t.number, t.state, params, list(t.values), None, t.device_seconds)
    if len(spec.goals) > 1 or not t.intermediate:  # a pruned trial: its last reported value
        return None
    step = max(t.intermediate)
    value = t.intermediate[step]
    return Lesson(source, t.number, t.state, params, [value], step, t.device_seconds) if math.isfinite(value) else None


def best(spec: SweepSpec, found: list[Lesson], k: int = RE_EVALUATED) -> list[dict[str, Any]]:
    """The fitted params of ``k`` distinct complete lessons to run again first. Of those within
    NEAR_BEST of the best value (by the first objective), the best first, unless one costs at most
    CHEAPER of it (device seconds, both recorded): then the best of those cheaper ones, and so on
    down; then the others, best first."""
    sign = -1.0 if spec.goals[0].direction == "maximize" else 1.0
    complete = sorted(  # best first; ties in their sources' order
        (lesson for lesson in found if lesson.state == OptunaState.COMPLETE),
        key=lambda lesson: (sign * lesson.values[0], lesson.source, lesson.number),
    )
    if not complete:
        return []
    top = sign * complete[0].values[0]  # the best, as a value to minimise
    near = [lesson for lesson in complete if sign * lesson.values[0] <= top + NEAR_BEST * abs(top)]
    ordered = []
    while near:
        pick = near[0]
        while cheaper := [lesson for lesson in near if _costs_at_most(lesson, CHEAPER, pick)]:
            pick = cheaper[0]  # the best of the cheaper ones (near stays best first)
        ordered.append(pick)
        near.remove(pick)
    ordered += complete[len(ordered) :]  # near-best are complete's first ones: the rest, best first
    out: list[dict[str, Any]] = []
    for lesson in ordered:
        if lesson.params not in out:
            out.append(lesson.params)
        if len(out) == k:
            break
    return out


def _costs_at_most(lesson: Lesson, share: float, other: Lesson) -> bool:
    """Whether ``lesson`` cost at most ``share`` of ``other``'s device seconds (False where either
    is not recorded, an MLflow source records none, or ``other`` cost nothing: then nothing is
    cheaper, and best()'s walk down to cheaper trials ends)."""
    if lesson.device_seconds is None or other.device_seconds is None or not other.device_seconds > 0:
        return False
    return lesson.device_seconds <= share * other.device_seconds


def unmeasured(found: list[Lesson], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``points`` (the trials a sweep enqueues itself) less those an earlier trial measured at
    the same fitted params: that trial is an observation already, and runs again first when it
    is among the best."""
    measured = [lesson.params for lesson in found]
    return [point for point in points if point not in measured]


def seed(spec: SweepSpec, study: optuna.Study, found: list[Lesson]) -> None:
    """Add the lessons to ``study`` as observations, in one transaction; nothing when the study
    holds any already (added before this process re-prepared the sweep)."""
    if not found or any(earlier(t) for t in study.get_trials(deepcopy=False)):
        return
    rdb.create(study, [_observation(spec, lesson) for lesson in found])


def _observation(spec: SweepSpec, lesson: Lesson) -> FrozenTrial:
    space = spec.search.space
    return optuna.trial.create_trial(
        state=lesson.state,
        values=lesson.values if lesson.state == OptunaState.COMPLETE else None,
        params=lesson.params,
        distributions={path: distribution(space[path]) for path in lesson.params},
        intermediate_values={lesson.step: lesson.values[0]} if lesson.step is not None else None,
        user_attrs={EARLIER: {"source": spec.search.warm_start[lesson.source], "trial": lesson.number}},
    )
