"""The host side of the task contract: the spec's task built from its plugin, and the spec
resolved against it before the first trial (the objective's default and directions, the metrics
an objective may name, the combinations a task cannot train), for `sweeper run` and `validate`
alike."""

from __future__ import annotations

from typing import Any

from sweeper.errors import UserError
from sweeper.plugin import Task
from sweeper.pluginhost import registry
from sweeper.pluginhost.auto_space import derive
from sweeper.pluginhost.binding import accepted_args, bind_args, check_types
from sweeper.spec import SweepSpec
from sweeper.spec.objectives import FOOTPRINT_METRICS, LOSSES, Objective

SMOOTHING = "label_smoothing"  # train.label_smoothing: the classification task's argument, kept in train: too


def task_args(spec: SweepSpec) -> dict[str, Any]:
    """``task.args``, plus ``train.label_smoothing`` for a task that takes label smoothing and was
    not given it (the spec's older place for it, still honoured)."""
    args = dict(spec.task.args)
    if spec.train.label_smoothing and SMOOTHING not in args:
        args[SMOOTHING] = spec.train.label_smoothing
    return args


def make_task(spec: SweepSpec) -> Task:
    """The spec's task, from its plugin and arguments."""
    return registry.get("tasks", spec.task.plugin)(**task_args(spec))


def metric_directions(task: Task) -> dict[str, str]:
    """Every metric a trial of ``task`` reports that an objective may name, with the better direction."""
    return {**dict.fromkeys(LOSSES, "minimize"), **task.metrics}


def resolve(spec: SweepSpec) -> SweepSpec:
    """``spec`` with its objective(s) resolved against its task: the task's default objective when
    the spec names none; the task's direction for a metric given without one. Raises UserError
    (exit 2) naming the path for a metric the task does not report, or a combination it cannot
    train. Resolving a resolved spec changes nothing. A ``search.auto`` spec gets its derived
    search space first (auto_space.py)."""
    spec = derive(spec).spec
    name = spec.task.plugin
    bind_args("tasks", name, spec.task.args, "task.args")
    check_types("tasks", name, {a: [(v, None)] for a, v in spec.task.args.items()}, "task.args")
    _check_smoothing(spec)
    task = make_task(spec)
    known = metric_directions(task)
    tree = spec.model_dump()

    def goal(given: Objective) -> dict[str, Any]:
        direction = given.direction if "direction" in given.model_fields_set else known.get(given.metric)
        return {"metric": given.metric, "direction": direction or given.direction}

    if spec.objectives:
        tree["objectives"] = [goal(g) for g in spec.objectives]
        del tree["objective"]  # the first trained objective again (spec/objectives.with_primary)
    elif "objective" in spec.model_fields_set:
        tree["objective"] = goal(spec.objective)
    else:
        tree["objective"] = {"metric": task.objective, "direction": known[task.objective]}
    resolved = SweepSpec.model_validate(tree)
    where = [f"objectives[{i}]" for i in range(len(spec.objectives))] if spec.objectives else ["objective"]
    for path, g in zip(where, resolved.goals):
        if g.metric not in known and g.metric not in FOOTPRINT_METRICS:
            raise UserError(
                f"{path}.metric: task '{name}' does not report '{g.metric}'; it reports "
                f"{', '.join(known)} (and {', '.join(FOOTPRINT_METRICS)}, measured on the model). "
                f"The task comes from {registry.info('tasks', name).where}."
            )
    return resolved


def _check_smoothing(spec: SweepSpec) -> None:
    """train.label_smoothing means the task's label smoothing: only for a task that has it, and
    not given twice."""
    searched = "train.label_smoothing" in spec.search.space
    if not (spec.train.label_smoothing or searched):
        return
    where = "search.space.train.label_smoothing" if searched else "train.label_smoothing"
    accepted = accepted_args(registry.get("tasks", spec.task.plugin))
    if accepted is not None and SMOOTHING not in accepted:
        raise UserError(
            f"{where}: task '{spec.task.plugin}' has no label smoothing (its arguments: "
            f"{', '.join(accepted) or 'none'}); remove it"
        )
    if SMOOTHING in spec.task.args or f"task.args.{SMOOTHING}" in spec.search.space:
        raise UserError(f"{where}: label smoothing is also set in task.args.{SMOOTHING}; set it in one place")
