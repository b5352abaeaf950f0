"""Reproducible mode's views of the earlier batches: in-memory studies holding the finished
trials of the batches before batch b (named by its first slot), from which batch b's trials are
sampled (by a sampler seeded from the sweep's "sampler" stream at b) and against which its trials
are pruned (each trial's "shadow"). Whichever process computes them, they are functions of the
seed and of the earlier batches' results only, never of timing."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

from sweeper.review.study_view import distribution
from sweeper.search.optuna import rdb
from sweeper.search.optuna.study import BATCH, FINISHED, SLOT, directions, interrupted, make_pruner, make_sampler
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.seeding import sampler_seed


class EarlierBatches:
    """The views of the study's earlier batches, each built from the study once per batch."""

    def __init__(self, spec: SweepSpec, study: optuna.Study, enqueue: list[dict[str, Any]]) -> None:
        self.spec, self.study = spec, study
        self.enqueue = enqueue  # the params of the sweep's first slots (the LR warm start)
        self.snapshot: tuple[int, list[FrozenTrial]] = (-1, [])  # (batch, its finished earlier trials)
        self.shared_view: tuple[int, optuna.Study | None] = (-1, None)  # (batch, the view its trials share)

    def finished_before(self, batch: int) -> list[FrozenTrial]:
        """The finished trials of batches before ``batch`` (lost attempts aside), by slot."""
        if self.snapshot[0] != batch:
            done = [
                t
                for t in self.study.get_trials(deepcopy=True, states=FINISHED)
                if not interrupted(t) and t.user_attrs.get(BATCH, -1) < batch
            ]
            fitted = [f for f in (self._fitted(t) for t in done) if f is not None]
            self.snapshot = (batch, sorted(fitted, key=lambda t: t.user_attrs.get(SLOT, t.number)))
        return self.snapshot[1]

    def _fitted(self, t: FrozenTrial) -> FrozenTrial | None:
        """A trial of an earlier space version (the sweep resumed in a changed space) as a point of
        this space (``space.fit``), which the sampler compares with its own; None if it is none.
        A trial of this space is itself."""
        space = self.spec.search.space
        if all(path in space and d == distribution(space[path]) for path, d in t.distributions.items()):
            return t
        params = sp.fit(space, t.params)
        if params is None:
            return None
        t.params, t.distributions = params, {path: distribution(space[path]) for path in params}
        return t

    def view(self, batch: int, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
        """An in-memory study holding the finished trials of the batches before ``batch``."""
        view = optuna.create_study(
            study_name=self.spec.name, directions=directions(self.spec), sampler=sampler, pruner=make_pruner(self.spec)
        )
        view.add_trials(self.finished_before(batch))
        return view

    def shadow(self, batch: int) -> optuna.Trial:
        """A trial's shadow: a new trial in a view of the batches before ``batch``. The median
        pruner (and none) looks only at complete trials and the trial itself, so the trials of a
        batch share one view, built once (each build copies every finished trial; its cost:
        docs/strategy.md#what-batches-cost-the-sampler).
        ASHA and Hyperband look at running trials too (Hyperband at the trial's number): a view each."""
        if self.spec.search.pruner.type not in ("median", "none"):
            return self.view(batch).ask()
        if self.shared_view[0] != batch or self.shared_view[1] is None:
            self.shared_view = (batch, self.view(batch))
        view = self.shared_view[1]
        assert view is not None
        return view.ask()

    def params(self, batch: int, size: int) -> list[FrozenTrial]:
        """The trials (params and distributions) of the batch starting at slot ``batch``: a
        function of the seed and of the earlier batches' results only (whichever process computes it)."""
        view = self.view(batch, make_sampler(self.spec, sampler_seed(self.spec.seed, batch)))
        out = []
        for slot in range(batch, batch + size):
            if slot < len(self.enqueue):
                view.enqueue_trial(self.enqueue[slot])
            trial = view.ask()
            sp.suggest(self.spec.search.space, trial)
            out.append(rdb.stored(view, rdb.trial_id(trial)))
        return out
