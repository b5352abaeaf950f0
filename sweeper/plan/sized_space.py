"""A derived search space sized to a device-time budget (``--auto`` with
``search.budget.device_hours``): the choices that shape a trial's cost (``model.*``,
``train.batch_size``) are timed one at a time at the base point with the cost estimator
(estimate.py: a few optimizer steps and one evaluation, extrapolated to a trial), and a
categorical choice whose trial alone would take more than 1/MIN_TRIALS of the budget is dropped,
an int range's top narrowed to the largest value that fits (the cheapest choice always stays; the
timing noise is allowed for, NOISE).
Entries whose ``when`` can no longer hold go with what they depended on.

Reproducibility: sizing times this machine, so two sizings may differ near the threshold. The
sized space is the sweep's spec from then on: `sweeper run` records it (spec.yaml, the study's
ledger) and keeps the sizing in its output folder (search/runner.py reads it back on a resume),
and a worker joining with ``--study`` reads the stored spec, which has no ``search.auto`` left
and is never sized again. Same spec, seed and sizing: same trial table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.plan.estimate import estimate
from sweeper.pluginhost.base_point import base_point
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.build import DataCache
from sweeper.trial.execute import devices_used

# At least this many full trials should fit in the budget at any one choice: TPE samples its first
# 10 at random (plan/strategy.py TPE_STARTUP) and needs as many again to model, and Hyperband's
# rungs compare 3 trials to keep 1; a pruner makes the average trial cheaper, so this is a floor on
# the trials, not a target. It was 10 until the peer benchmark showed a table's slow batch sizes
# leaving --auto a quarter of the peers' trials (the figures: docs/strategy.md#against-the-peers).
MIN_TRIALS = 30
# Timing noise: one trial's estimate varies from run to run on a shared machine (the figures:
# docs/search-spaces.md#sized-to-the-budget). Each point is timed TIMINGS times and the fastest
# kept (the usual estimator of a noisy duration), and a choice is dropped only when it costs more
# than the budget allows AND more than NOISE x the base point (a base point over the limit keeps
# the choices about as cheap as it: dropping them would not make trials fit, only follow the
# noise). NOISE allows for the spread the figures show.
TIMINGS = 2
NOISE = 1.25
# The searched paths whose values change what one trial costs: the model (its plugin and its
# arguments: widths, depths) and the batch size (steps per epoch).
COST_SHAPING = ("model.", "train.batch_size")


@dataclass(frozen=True)
class Sized:
    spec: SweepSpec  # the spec with its space sized (unchanged when nothing was too costly)
    changes: list[str] = field(default_factory=list)  # one line per change, for validate, run, summary.json
    base_s: float | None = None  # device-seconds of one full trial at the base point, as timed here


def wanted(spec: SweepSpec) -> bool:
    """Whether a spec as loaded asks for sizing: a derived space and a device-time budget."""
    return spec.search.auto is not None and spec.search.budget is not None


def size(spec: SweepSpec, cache: DataCache | None = None) -> Sized:
    """``spec`` (its space derived already) with the cost-shaping choices too costly for its
    budget dropped; unchanged without a budget. Loads the data set once (into ``cache``)."""
    if spec.search.budget is None:
        return Sized(spec)
    budget_s = spec.search.budget.device_hours * 3600
    timer = _Timer(spec, cache if cache is not None else DataCache())
    space = dict(spec.search.space)
    base_s = timer.base_s(space)
    allowed = max(budget_s / MIN_TRIALS, NOISE * base_s)
    changes: list[str] = []
    shaping = [p for p in space if p.startswith(COST_SHAPING)]
    for path in sorted(shaping, key=lambda p: not p.endswith(".plugin")):  # plugins first: their args may go
        param = space.get(path)
        if isinstance(param, sp.CategoricalParam) and len(param.choices) > 1:
            costs = {i: timer.trial_s(space, path, choice) for i, choice in enumerate(param.choices)}
            kept = [i for i, cost in costs.items() if cost <= allowed] or [min(costs, key=lambda i: costs[i])]
            for i in sorted(set(costs) - set(kept)):
                changes.append(_line(f"dropped {path}={param.choices[i]}: one trial", costs[i], budget_s))
            space[path] = param.model_copy(update={"choices": [param.choices[i] for i in kept]})
        elif isinstance(param, sp.IntParam) and param.high > param.low:
            top = timer.trial_s(space, path, param.high)
            if top > allowed:
                high = _largest_fitting(param, functools.partial(timer.fits, dict(space), path, allowed))
                space[path] = param.model_copy(update={"high": high})
                what = f"narrowed {path} to {param.low}..{high}: one trial at {param.high}"
                changes.append(_line(what, top, budget_s))
        space = _reachable(space)
    if not changes:
        return Sized(spec, [], base_s)
    search = spec.search.model_copy(update={"space": space})
    return Sized(spec.model_copy(update={"search": search}), changes, base_s)


def _line(what: str, cost_s: float, budget_s: float) -> str:
    return (
        f"search.space: {what} ~{cost_s:.3g} device-s, the budget of {budget_s:.3g} "
        f"device-s fits {budget_s / cost_s:.1f} (fewer than {MIN_TRIALS})"
    )


def _largest_fitting(param: sp.IntParam, fits: Callable[[int], bool]) -> int:
    """The largest value of ``param``'s range (on its step) that fits, its low end when none
    does: bisected, as a model's cost grows with its widths and depths."""
    values = list(range(param.low, param.high + 1, 1 if param.log else param.step))
    lo, hi = 0, len(values) - 1  # values[lo] is kept whatever it costs; values[hi] is known not to fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            lo = mid
        else:
            hi = mid
    return values[lo]


def _reachable(space: dict[str, sp.Param]) -> dict[str, sp.Param]:
    """``space`` less the entries whose ``when`` no longer holds (the choice it needs dropped)."""
    while True:
        gone = []
        for path in space:
            try:
                sp.enabling(space, path)
            except ValueError:
                gone.append(path)
        if not gone:
            return space
        space = {path: param for path, param in space.items() if path not in gone}


class _Timer:
    """Device seconds of one full trial at the base point with one value changed, each point
    timed once."""

    def __init__(self, spec: SweepSpec, cache: DataCache) -> None:
        self.spec, self.cache = spec, cache
        self.timed: dict[str, float] = {}

    def base_s(self, space: dict[str, sp.Param]) -> float:
        return self._point_s(base_point(self._in(space)))

    def trial_s(self, space: dict[str, sp.Param], path: str, value: Any) -> float:
        forced = {**sp.enabling(space, path), path: value}
        return self._point_s(base_point(self._in(space).with_values(forced)))  # the others at base values

    def fits(self, space: dict[str, sp.Param], path: str, allowed_s: float, value: Any) -> bool:
        return self.trial_s(space, path, value) <= allowed_s

    def _in(self, space: dict[str, sp.Param]) -> SweepSpec:
        return self.spec.model_copy(update={"search": self.spec.search.model_copy(update={"space": space})})

    def _point_s(self, point: dict[str, Any]) -> float:
        key = repr(sorted(point.items()))
        if key not in self.timed:
            spec = self.spec.with_values(point)
            found = [estimate(spec, self.cache) for _ in range(TIMINGS)]
            self.timed[key] = min(f.trial_s for f in found) * devices_used(found[0].device, found[0].threads)
        return self.timed[key]
