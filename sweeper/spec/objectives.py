"""What a sweep optimises: one objective, or several (``objectives:``, a multi-objective sweep
whose result is a Pareto front), and which point of the front it exports (``export.choose``).
The one place sweeper compares objective values: pure functions over numbers, no Optuna here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, get_args

from pydantic import Field, field_validator

from sweeper.spec.base import Strict

T = TypeVar("T")
# Metrics every task's trainer reports each epoch; a task adds its own (val_acc, val_rmse, ...: its
# `metrics`, checked against the objectives once the task is known: pluginhost/tasks.py).
LOSSES: tuple[str, ...] = ("train_loss", "val_loss")
# Measured once per trial on its model (trial/footprint.py): `params`, its parameter count;
# `latency_ms`, the median time in ms of one forward pass over an evaluation batch.
FootprintMetric = Literal["params", "latency_ms"]
FOOTPRINT_METRICS: tuple[str, ...] = get_args(FootprintMetric)
# A trainer metric (the task's or a loss) or a footprint metric; the classification task's as examples
METRICS = ("val_acc", "val_loss", "train_loss", "train_acc", *FOOTPRINT_METRICS)
PERCENT = re.compile(r"^\s*(\d+(\.\d*)?|\.\d+)\s*%\s*$")  # "0.5%": relative to the best value


def trained(metric: str) -> bool:
    """Whether ``metric`` comes from training (the task's metrics and the losses), not the footprint."""
    return metric not in FOOTPRINT_METRICS


class Objective(Strict):
    # a metric the task reports (its value at the last epoch), or a footprint metric
    metric: str = Field(default="val_acc", pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=200)
    # unset: the task's direction for its metric (pluginhost/tasks.py), else maximize
    direction: Literal["maximize", "minimize"] = "maximize"

    def better(self, value: float, than: float | None) -> bool:
        """True when ``value`` beats ``than`` in this direction (anything beats None)."""
        if than is None:
            return True
        return value > than if self.direction == "maximize" else value < than

    def best(self, items: Iterable[T], value: Callable[[T], float | None]) -> T | None:
        """The item whose value is best (the first one on ties); items without a value are skipped."""
        chosen: T | None = None
        for item in items:
            v = value(item)
            if v is not None and (chosen is None or self.better(v, value(chosen))):
                chosen = item
        return chosen

    def key(self, value: float) -> float:
        """Smaller is better, whatever the direction (for sorting)."""
        return -value if self.direction == "maximize" else value


class Choose(Strict):
    """export.choose: which point of a multi-objective sweep's Pareto front is exported and
    registered. The points within ``within`` of the front's best values, then the best of them
    on ``prefer`` (ties: the other objectives in order, then the lower trial number). E.g. the
    smallest model within 0.5% of the best accuracy: {prefer: params, within: {val_acc: 0.5%}}."""

    # metric -> how far from the front's best a point may be: a number in the metric's units
    # (val_acc: 0.005 is half a percentage point), or a percentage of the best value ("0.5%")
    within: dict[str, float | str] = Field(default_factory=dict)
    prefer: str | None = Field(default=None, description="the objective to pick on; default: the first objective")

    @field_validator("within")
    @classmethod
    def _tolerances(cls, within: dict[str, float | str]) -> dict[str, float | str]:
        for metric, tol in within.items():
            if isinstance(tol, str) and not PERCENT.match(tol):
                raise ValueError(f"within.{metric}: '{tol}' is neither a number nor a percentage like '0.5%'")
            if not isinstance(tol, str) and tol < 0:
                raise ValueError(f"within.{metric}: {tol} is negative; a tolerance is a distance from the best")
        return within

    def check(self, goals: list[Objective]) -> None:
        """Every metric named is one of the sweep's objectives (a ValueError says which is not)."""
        names = [g.metric for g in goals]
        for metric in [*self.within, *([self.prefer] if self.prefer else [])]:
            if metric not in names:
                raise ValueError(
                    f"export.choose names '{metric}', which is not an objective; expected one of: {', '.join(names)}"
                )


Values = Callable[[T], "dict[str, float] | None"]  # an item's metric values, or None


def dominates(a: dict[str, float], b: dict[str, float], goals: list[Objective]) -> bool:
    """``a`` is at least as good as ``b`` on every objective and better on one."""
    keys = [(g.key(a[g.metric]), g.key(b[g.metric])) for g in goals]
    return all(x <= y for x, y in keys) and any(x < y for x, y in keys)


def pareto_front(goals: list[Objective], items: Iterable[T], values: Values[T]) -> list[T]:
    """The items no other item dominates, in their order; items without every value are skipped.

    In the items' lexicographic order of their keys (smaller is better), an item's dominators
    all come before it, and if any does, one already on the front does (dominance is transitive):
    each item is compared with the front found so far, not with every item (a study of 10,000
    trials made 10^8 comparisons at each trial's end; benchmarks/scale.py --prefill 10000). An item
    with a NaN value neither dominates nor is dominated (every comparison with NaN is false)."""
    scored = [(item, v) for item in items if (v := values(item)) is not None and all(g.metric in v for g in goals)]
    keys = [tuple(g.key(v[g.metric]) for g in goals) for _, v in scored]
    on_front = [any(math.isnan(k) for k in key) for key in keys]
    if len(goals) == 1:  # the best value's items (ties too: none dominates another)
        best = min((key for key, nan in zip(keys, on_front, strict=True) if not nan), default=None)
        return [item for (item, _), key, nan in zip(scored, keys, on_front, strict=True) if nan or key == best]
    front: list[int] = []
    for i in sorted((i for i in range(len(scored)) if not on_front[i]), key=keys.__getitem__):
        if not any(dominates(scored[j][1], scored[i][1], goals) for j in front):
            front.append(i)
            on_front[i] = True
    return [item for (item, _), kept in zip(scored, on_front, strict=True) if kept]


def _limit(goal: Objective, best: float, tol: float | str) -> float:
    """The worst value still within ``tol`` of ``best``."""
    match = PERCENT.match(tol) if isinstance(tol, str) else None
    distance = abs(best) * float(match.group(1)) / 100 if match else float(tol)
    return best - distance if goal.direction == "maximize" else best + distance


def choose(goals: list[Objective], rule: Choose | None, items: Iterable[T], values: Values[T]) -> T | None:
    """The point ``rule`` picks from the Pareto front of ``items`` (in their order, which breaks
    the last ties); one objective: its best item. None when no item has every value."""
    front = pareto_front(goals, items, values)
    if not front:
        return None
    rule = rule or Choose()
    by_name: dict[str, Objective] = {g.metric: g for g in goals}
    scored = [(p, v) for p in front if (v := values(p)) is not None]  # the front has every value
    limits = {  # the front's best: the sweep's best
        metric: _limit(by_name[metric], min((v[metric] for _, v in scored), key=by_name[metric].key), tol)
        for metric, tol in rule.within.items()
    }
    kept = [(p, v) for p, v in scored if all(by_name[m].key(v[m]) <= by_name[m].key(lim) for m, lim in limits.items())]
    prefer = by_name[rule.prefer] if rule.prefer else goals[0]
    order = [prefer, *(g for g in goals if g is not prefer)]
    return min(kept, key=lambda pv: tuple(g.key(pv[1][g.metric]) for g in order))[0]


def with_primary(data: Any) -> Any:
    """A spec's raw data with ``objective`` set to the first trainer metric of ``objectives``
    (dumped specs hold both; a different ``objective`` given with them is an error)."""
    if not isinstance(data, dict) or not isinstance(data.get("objectives"), list):
        return data
    goals = [g if isinstance(g, Objective) else Objective.model_validate(g) for g in data["objectives"]]
    primary = next((g for g in goals if trained(g.metric)), None)
    given = data.get("objective")
    if (
        given is not None
        and primary is not None
        and (given if isinstance(given, Objective) else Objective.model_validate(given)) != primary
    ):
        raise ValueError("set objective (one metric) or objectives (several), not both")
    return {**data, "objective": primary} if primary is not None else data


def check_goals(goals: list[Objective], several: bool, pruner: str, sampler: str, rule: Choose | None) -> None:
    """What a spec's objectives allow (a ValueError says what does not fit)."""
    metrics = [g.metric for g in goals]
    if several and (len(metrics) < 2 or len(set(metrics)) < len(metrics)):
        raise ValueError(f"objectives lists {metrics}: two or more different metrics (one: use objective)")
    if not any(trained(m) for m in metrics):
        raise ValueError(
            f"{'objectives' if several else 'objective'}: {', '.join(metrics)} needs no training; "
            f"optimise at least one metric of the task (e.g. val_acc, val_loss) as well (objectives: [...])"
        )
    if len(goals) > 1 and pruner not in ("none", "auto"):  # auto chooses none for several
        raise ValueError(
            f"search.pruner.type: '{pruner}' compares one metric; a sweep with objectives trains "
            f"every trial to its end: set search.pruner.type: none"
        )
    if len(goals) > 1 and sampler == "cmaes":
        raise ValueError(
            "search.sampler: cmaes optimises one objective; with objectives use nsga2, tpe, gp, random or grid"
        )
    if rule is not None:
        if len(goals) < 2:
            raise ValueError("export.choose picks a point of a Pareto front: it needs objectives (two or more)")
        rule.check(goals)
