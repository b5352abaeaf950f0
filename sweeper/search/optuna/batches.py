"""Reproducible mode's views of the earlier batches: in-memory studies holding the finished
trials of the batches before batch b (named by its first slot; with search.staleness S, the
batches before b less the last S: ``known``), from which batch b's trials are sampled (by a
sampler seeded from the sweep's "sampler" stream at b) and against which its trials are pruned
(each trial's "shadow"). Whichever process computes them, they are functions of the seed and of
those batches' results only, never of timing.

After the family round (``search.family_round``: the sweep's first slots), a batch samples from
the space with ``model.plugin`` narrowed to the round's survivors, and its views hold the trials
of those families only (the search within the survivors). The trials keep the full space's
distributions in the study, which holds every family's trials.

With ``search.pruner.promote``, a trial the pruner stopped is paused (its state saved at that
epoch), and a later batch's first free slots continue the paused trials that the pruner's own rule,
applied again to the earlier batches' trials, now keeps (``_promotable``): ASHA's promotion (Li et
al. 2020), a decision of the earlier batches' results only, like every other."""

from __future__ import annotations

import copy
import math
import statistics
from collections import Counter, defaultdict
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from sweeper.review.study_view import distribution
from sweeper.search.optuna import rdb
from sweeper.search.optuna.finished import FinishedTrials
from sweeper.search.optuna.study import (
    BATCH,
    FINISHED,
    INFO,
    PAUSED_AT,
    PROMOTED_FROM,
    RESUME,
    SEED_SLOT,
    SLOT,
    directions,
    earlier,
    interrupted,
    make_pruner,
    make_sampler,
)
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.seeding import sampler_seed

# search.pruner.check_rungs: an epoch whose values rank the uncut trials with a Spearman
# correlation under this against their final values is no rung (0.5: for normally distributed
# scores the epoch's order agrees with the final one in two pairs of three; Kendall's tau 0.35)
CHECKED_RHO = 0.5

# search.rung_model: the fewest trials at a rung (and complete) the sampler models them by; TPE's
# own n_startup_trials (10): with fewer points it samples at random whatever it sees.
RUNG_MODEL_MIN = 10


class EarlierBatches:
    """The views of the study's earlier batches, each built from the study once per batch."""

    def __init__(
        self,
        spec: SweepSpec,
        study: optuna.Study,
        enqueue: list[dict[str, Any]],
        finished: FinishedTrials | None = None,
    ) -> None:
        self.spec, self.study = spec, study
        self.finished = finished  # reproducible: false's view instead (finished.py), where the coordinator makes one
        self.enqueue = enqueue  # the params of the sweep's first slots (the LR warm start)
        self.snapshot: tuple[int, list[FrozenTrial]] = (-1, [])  # (batch, its finished earlier trials)
        self.shared_view: tuple[int, optuna.Study | None] = (-1, None)  # (batch, the view its trials share)
        self._survivors: list[FrozenTrial] | None = None  # the round's best trials, once every one finished
        self.refitted: set[int] = set()  # trials whose params an earlier space version changed (_fitted)
        # (batch, the epochs search.pruner.check_rungs keeps from cutting -> their correlation;
        # None: every epoch, fewer than check_rungs trials complete)
        self.checked: tuple[int, dict[int, float] | None] = (-1, None)

    def known(self, batch: int) -> int:
        """The first slot whose result the decisions of the batch starting at slot ``batch`` (its
        sampling, pruning, promotions and rung checks) do not know: the batch's own, less
        search.staleness batches before it, whose trials may still run when it is proposed
        (bounded staleness). A batch after the family round knows the whole round: its survivors."""
        search = self.spec.search
        bound = batch - search.staleness * search.batch_size
        round_ = search.family_round
        if round_ is not None and not round_.holds(batch):
            bound = max(bound, min(self._after_round(), batch))
        return max(bound, 0)

    def _after_round(self) -> int:
        """The first slot after the family round's batches (the round's slots, rounded up to whole batches)."""
        round_ = self.spec.search.family_round
        assert round_ is not None
        return -(-len(round_.families) // self.spec.search.batch_size) * self.spec.search.batch_size

    def space(self, batch: int) -> dict[str, sp.Param]:
        """The space the batch starting at slot ``batch`` samples from: after the family round
        (every slot of the round before ``batch``), ``model.plugin`` among the round's survivors."""
        full = self.spec.search.space
        round_ = self.spec.search.family_round
        families = full.get("model.plugin")
        if round_ is None or round_.holds(batch) or not isinstance(families, sp.CategoricalParam):
            return full
        if not round_.drops:  # a round under 9 epochs: each family once, whole, none dropped
            return full
        kept = self.survivors()
        return {**full, "model.plugin": families.model_copy(update={"choices": kept})}

    def survivors(self) -> list[str]:
        """The family round's best ``keep`` families, best first."""
        return [t.params["model.plugin"] for t in self._best_of_round()]

    def _best_of_round(self) -> list[FrozenTrial]:
        """The round trials of the best ``keep`` families, best first: by the objective at their
        last epoch (a trial without one, failed, ranks last; a tie keeps the round's order)."""
        round_ = self.spec.search.family_round
        assert round_ is not None
        if self._survivors is None:
            ended = {}
            for t in self.study.get_trials(deepcopy=False, states=FINISHED):
                slot = t.user_attrs.get(SLOT)
                if slot is not None and round_.holds(slot) and not interrupted(t) and not earlier(t):
                    ended[slot] = t
            sign = 1.0 if self.spec.objective.direction == "maximize" else -1.0

            def rank(slot: int) -> tuple[bool, float, int]:
                score = _last_value(ended[slot])
                return score is None, -sign * (score or 0.0), slot

            self._survivors = [ended[slot] for slot in sorted(ended, key=rank)[: round_.keep]]
        return self._survivors

    def promotions(self, batch: int, size: int) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
        """The batch's slots that continue a paused trial: slot -> (its params, the user attrs
        that resume it: PROMOTED_FROM, SEED_SLOT, RESUME where its state was saved, PAUSED_AT).
        A survivor's round trial continues in the first slots after the round's batches and the
        sweep's other first trials (one whose round trial failed is not continued); the paused
        trials search.pruner.promote promotes take the batch's other slots, first."""
        out = {}
        round_ = self.spec.search.family_round
        if round_ is not None and not round_.holds(batch):
            first = max(len(self.enqueue), self._after_round())
            for k, t in enumerate(self._best_of_round()):
                if first + k in range(batch, batch + size) and t.state == OptunaState.PRUNED:
                    out[first + k] = (dict(t.params), _resuming(t))
        if self.spec.search.pruner.promote:
            free = [slot for slot in range(max(batch, len(self.enqueue)), batch + size) if slot not in out]
            for slot, t in zip(free, self._promotable(batch), strict=False):
                out[slot] = (dict(t.params), _resuming(t) | {PAUSED_AT: t.user_attrs[INFO]["paused_at"]})
        return out

    def _promotable(self, batch: int) -> list[FrozenTrial]:
        """The paused trials of the batches before ``batch`` (not promoted yet) that the pruner's
        rule, applied again to those batches' trials, keeps at the epoch they paused at: the
        median pruner, a best value at least the median of the complete trials there (with
        search.pruner.startup_trials of them); asha and hyperband, a value among the best
        1/reduction_factor of every trial's there (at least the best one; Hyperband's brackets
        are pooled). The latest epoch first, then the better value, then the earlier slot."""
        trials = self.finished_before(batch)
        # every earlier batch's promotions, those of the batches it does not know included (proposed already)
        taken = {
            t.user_attrs.get(PROMOTED_FROM)
            for t in self.study.get_trials(deepcopy=False)
            if t.user_attrs.get(BATCH, batch) < batch
        }
        paused = [
            t
            for t in trials
            if t.state == OptunaState.PRUNED
            and "paused_at" in t.user_attrs.get(INFO, {})
            and t.number not in taken
            and t.number not in self.refitted  # its params are not those its state was trained with
        ]
        if not paused:
            return []
        pruner = self.spec.search.pruner
        sign = 1.0 if self.spec.objective.direction == "maximize" else -1.0
        every: dict[int, list[float]] = defaultdict(list)  # epoch -> every trial's value there, signed
        complete: dict[int, list[float]] = defaultdict(list)  # epoch -> the complete trials' values there
        for t in trials:
            for epoch, value in t.intermediate_values.items():
                if math.isfinite(value):
                    every[epoch].append(sign * value)
                    if t.state == OptunaState.COMPLETE:
                        complete[epoch].append(sign * value)
        ranked = []
        for t in paused:
            epoch = t.user_attrs[INFO]["paused_at"]
            value = sign * t.intermediate_values.get(epoch, math.nan)
            if not math.isfinite(value):
                continue
            if pruner.type == "median":
                rivals = complete[epoch]
                best = max(sign * v for v in t.intermediate_values.values() if math.isfinite(v))
                kept = len(rivals) >= max(1, pruner.startup_trials) and best >= statistics.median(rivals)
            else:
                rivals = sorted(every[epoch], reverse=True)
                kept = value >= rivals[max(1, len(rivals) // pruner.reduction_factor) - 1]
            if kept:
                ranked.append((-epoch, -value, t.user_attrs.get(SLOT, t.number), t))
        return [t for *_, t in sorted(ranked, key=lambda r: r[:3])]

    def spared(self, batch: int, epoch: int) -> float | None:
        """search.pruner.check_rungs: why a trial of ``batch`` is not stopped at ``epoch`` though
        the pruner says so: nan while fewer than check_rungs trials of the earlier batches are
        complete (they run uncut), else the rank correlation of the epoch's values with the final
        ones over the first check_rungs complete trials, where it is under CHECKED_RHO; None: the
        cut stands."""
        k = self.spec.search.pruner.check_rungs
        if not k:
            return None
        if self.checked[0] != batch:
            self.checked = (batch, self._unpredictive(batch, k))
        blind = self.checked[1]
        return math.nan if blind is None else blind.get(epoch)

    def _unpredictive(self, batch: int, k: int) -> dict[int, float] | None:
        """The epochs whose values rank the first ``k`` complete trials of the batches before
        ``batch`` (by slot: those ran uncut, as fewer than ``k`` were complete before their
        batch) with a Spearman correlation under CHECKED_RHO against their final values, and
        that correlation; None while fewer than ``k`` are complete."""
        complete = [t for t in self.finished_before(batch) if t.state == OptunaState.COMPLETE and t.value is not None]
        if len(complete) < k:
            return None
        first = complete[:k]
        finals = [float(t.value) for t in first if t.value is not None]
        epochs = set.intersection(*(set(t.intermediate_values) for t in first)) - {self.spec.train.epochs}
        correlations = {e: _spearman([t.intermediate_values[e] for t in first], finals) for e in sorted(epochs)}
        return {e: rho for e, rho in correlations.items() if not rho >= CHECKED_RHO}

    def finished_before(self, batch: int) -> list[FrozenTrial]:
        """The finished trials the batch starting at slot ``batch`` knows (``known``; lost attempts
        aside), by slot."""
        if self.snapshot[0] != batch:
            bound = self.known(batch)
            done = [
                t
                for t in self.study.get_trials(deepcopy=False, states=FINISHED)  # Optuna's cache's: not changed
                if not interrupted(t) and t.user_attrs.get(BATCH, -1) < bound
            ]
            space = self.space(batch)
            wanted = {path: distribution(p) for path, p in space.items()}
            fitted = [f for f in (self._fitted(t, space, wanted) for t in done) if f is not None]
            self.snapshot = (batch, sorted(fitted, key=lambda t: t.user_attrs.get(SLOT, t.number)))
        return self.snapshot[1]

    def _fitted(
        self, t: FrozenTrial, space: dict[str, sp.Param], wanted: dict[str, BaseDistribution]
    ) -> FrozenTrial | None:
        """A trial of an earlier space version (the sweep resumed in a changed space, or a family
        the round dropped) as a point of ``space`` (``space.fit``), which the sampler compares with
        its own: a copy; None if it is none. A trial of this space (``wanted``: its distributions)
        is itself."""
        if all(wanted.get(path) == d for path, d in t.distributions.items()):
            return t
        params = sp.fit(space, t.params)
        if params is None:
            return None
        if params != t.params:
            self.refitted.add(t.number)
        t = copy.copy(t)
        t.params, t.distributions = params, {path: wanted[path] for path in params}
        return t

    def view(
        self, batch: int, sampler: optuna.samplers.BaseSampler | None = None, at_rung: bool = False
    ) -> optuna.Study:
        """An in-memory study holding the finished trials of the batches before ``batch``;
        ``at_rung``: as the sampler models them under search.rung_model (``_at_rung``)."""
        view = optuna.create_study(
            study_name=self.spec.name, directions=directions(self.spec), sampler=sampler, pruner=make_pruner(self.spec)
        )
        trials = self.finished_before(batch)
        rdb.add_shared(view, _at_rung(trials, self.spec.train.epochs) if at_rung else trials)
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
        rungs = self.spec.search.rung_model and len(self.spec.goals) == 1
        view = self.view(batch, make_sampler(self.spec, sampler_seed(self.spec.seed, batch)), at_rung=rungs)
        space, full = self.space(batch), self.spec.search.space
        promoted = self.promotions(batch, size)
        out = []
        for slot in range(batch, batch + size):
            if slot in promoted:
                view.enqueue_trial(promoted[slot][0])
            # a first trial of a family the round dropped (search.base_first's) is sampled instead
            elif slot < len(self.enqueue) and sp.fit(space, self.enqueue[slot]) is not None:
                view.enqueue_trial(self.enqueue[slot])
            trial = view.ask()
            sp.suggest(space, trial)
            stored = rdb.stored(view, rdb.trial_id(trial))
            if slot in promoted:
                stored.user_attrs = promoted[slot][1]
            if space is not full:  # stored in the study with the full space's distributions
                stored.distributions = {path: distribution(full[path]) for path in stored.params}
            out.append(stored)
        return out


def _at_rung(trials: list[FrozenTrial], epochs: int) -> list[FrozenTrial]:
    """search.rung_model (BOHB's rule, Falkner et al. 2018): the sampler models the trials at the
    highest epoch that RUNG_MODEL_MIN of them reached, while fewer than that many are complete:
    each trial with a value there (pruned later or complete) is seen as complete with that value,
    so pruned and low-fidelity trials inform the model instead of ranking below every complete
    one (optuna#1647); the trials stopped before it are seen as they are (pruned). With enough
    complete trials, the trials as they are (TPE as it is)."""
    complete = [t for t in trials if t.state == OptunaState.COMPLETE]
    reached = Counter(e for t in trials for e in t.intermediate_values if e < epochs)
    rungs = [e for e, n in reached.items() if n >= RUNG_MODEL_MIN]
    if len(complete) >= RUNG_MODEL_MIN or not rungs:
        return trials
    rung = max(rungs)
    out = []
    for t in trials:
        value = t.intermediate_values.get(rung)
        if value is None or t.state not in (OptunaState.COMPLETE, OptunaState.PRUNED):
            out.append(t)
            continue
        seen = optuna.trial.create_trial(
            state=OptunaState.COMPLETE,
            value=value,
            params=t.params,
            distributions=t.distributions,
            user_attrs=t.user_attrs,
            system_attrs=t.system_attrs,
            intermediate_values={e: v for e, v in t.intermediate_values.items() if e <= rung},
        )
        out.append(seen)
    return out


def _spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties share their mean rank); 0 where either is constant."""
    try:
        return statistics.correlation(_ranks(x), _ranks(y))
    except statistics.StatisticsError:
        return 0.0


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


def _resuming(t: FrozenTrial) -> dict[str, Any]:
    """The user attrs of a trial that continues paused trial ``t``: its number, the slot whose seed
    it keeps, and the state it resumes from (where it was saved)."""
    attrs = {PROMOTED_FROM: t.number, SEED_SLOT: t.user_attrs.get(SEED_SLOT, t.user_attrs[SLOT])}
    resume = t.user_attrs.get(INFO, {}).get("resume")
    return attrs | ({RESUME: resume} if resume else {})


def _last_value(t: FrozenTrial) -> float | None:
    """A trial's objective at its last epoch (a complete trial's value), None without one."""
    if t.intermediate_values:
        return t.intermediate_values[max(t.intermediate_values)]
    return t.value if t.values is not None else None
