"""``reproducible: false``'s view of the study: this process's copy of the study's finished
trials, read incrementally, and the in-memory studies that its pruning decisions and proposals
read instead of the live study.

Why: Optuna's cache in front of the storage reads every unfinished trial again, whole (params,
attrs, epochs), at each read of the study, and a pruning decision or a proposal reads it once or
more: rows growing with the number of workers, and the proposal read it under the sweep's lock.
At 64 simulated workers that was 715 statements and 1.9 CPU-seconds a trial, 778 ms a decision
at the median (docs/many-machines.md#free-mode-at-scale). Here a refresh reads the ids and states of the trials
after the oldest one not finished and held (one statement), then the finished ones not held yet,
whole (one read, only when there are some): flat in the study's size and in the number of workers.

What the decisions see: every finished trial this process has read (at each decision, the
finished ones up to that moment) and the trial itself, as reproducible mode's shadows see the
earlier batches' (batches.py). Running trials of other processes are not compared against:
Optuna's median pruner never does, and ASHA and Hyperband compare against them only until they
finish. Each process samples its proposals with a sampler of its own, seeded from the sweep's
"sampler" stream at the process's member name: processes no longer propose the same points in
the same order, as they did when each had the sweep's seed."""

from __future__ import annotations

import weakref
import zlib

import optuna
from optuna.trial import FrozenTrial

from sweeper.search.optuna import rdb
from sweeper.search.optuna.study import directions, interrupted, make_pruner, make_sampler
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.seeding import sampler_seed

# samplers a proposal asks the live study for: grid skips the points running anywhere, NSGA-II
# counts each generation's trials, running ones included; a view of finished trials has neither
LIVE_SAMPLERS = ("grid", "nsga2")


class FinishedTrials:
    """The study's finished trials as this process has read them, and views holding them."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, member: str) -> None:
        self.spec, self.study = spec, study
        # this process's sampler (``member``: host:pid:tag, unique among the sweep's processes)
        self.sampler = make_sampler(spec, sampler_seed(spec.seed, zlib.crc32(member.encode())))
        self.held: list[FrozenTrial] = []  # in the order read
        self.held_ids: set[int] = set()
        self.watermark = -1  # every trial with an id up to it is finished and held
        # a view -> how many of ``held`` it holds (a view is dropped with the last trial in it)
        self.filled: weakref.WeakKeyDictionary[optuna.Study, int] = weakref.WeakKeyDictionary()
        self._shared: optuna.Study | None = None

    def refresh(self) -> None:
        """Read the trials finished since the last refresh."""
        listed = rdb.states_after(self.study, self.watermark)
        new = {tid for tid, finished in listed if finished and tid not in self.held_ids}
        if new:
            for t in rdb.finished_trials(self.study, new):
                if rdb.trial_id(t) not in self.held_ids:
                    self.held_ids.add(rdb.trial_id(t))
                    self.held.append(t)
        for tid, finished in listed:
            if not finished or tid not in self.held_ids:
                break
            self.watermark = tid

    def _catch_up(self, view: optuna.Study) -> None:
        """Add to ``view`` the held trials it lacks (lost attempts aside)."""
        start = self.filled.get(view, 0)
        rdb.add_shared(view, [t for t in self.held[start:] if not interrupted(t)])
        self.filled[view] = len(self.held)

    def _view(self) -> optuna.Study:
        view = optuna.create_study(
            study_name=self.spec.name, directions=directions(self.spec), pruner=make_pruner(self.spec)
        )
        self._catch_up(view)
        return view

    def _shared_view(self) -> optuna.Study:
        if self._shared is None:
            self._shared = self._view()
        return self._shared

    def shadow(self) -> optuna.Trial:
        """A trial's shadow, which the pruner decides on. The median pruner (and none) looks only
        at complete trials and the trial itself: this process's trials share one view. ASHA and
        Hyperband keep a trial's rungs in it and compare them with every trial's: a view each."""
        self.refresh()
        if self.spec.search.pruner.type in ("median", "none"):
            view = self._shared_view()
            self._catch_up(view)
        else:
            view = self._view()
        return view.ask()

    def before_decision(self, shadow: optuna.Trial) -> None:
        """The finished trials read, and added to the shadow's view, before the pruner decides."""
        if self.spec.search.pruner.type == "none":
            return
        self.refresh()
        self._catch_up(shadow.study)

    def params(self) -> FrozenTrial:
        """A new trial (params and distributions), sampled by this process's sampler from every
        finished trial read so far."""
        self.refresh()
        view = self._shared_view()
        self._catch_up(view)
        view.sampler = self.sampler
        trial = view.ask()
        sp.suggest(self.spec.search.space, trial)
        return rdb.stored(view, rdb.trial_id(trial))
