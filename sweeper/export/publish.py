"""Register the best model in the MLflow Model Registry; move the ``champion`` alias to it only
when it beats the current champion on the sweep's objective (with objectives: when the rule that
picked it from the sweep's Pareto front, export.choose, picks it over the champion)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import numpy as np
from torch import nn

from sweeper.export.inputs import Signature
from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.spec import SweepSpec
from sweeper.spec.objectives import Objective, choose
from sweeper.track.mlflow import TAG, configure

ALIAS = "champion"
EXAMPLE_ROWS = 2  # > 1, so MLflow's torch.export keeps the batch dimension dynamic
PADDED_SKIP = (
    "not registered: the model takes padded sequences and their mask (x, mask), and MLflow's "
    "pytorch flavour passes its pyfunc one tensor; the exported files (export.json) take both"
)


@dataclass(frozen=True)
class Registration:
    """What registering a model takes, without its data set: made in the sweep's process, done
    there or by the registrar's process (registrar.py), which gets it as a file."""

    model: nn.Module  # as exported: with its task's head
    input_shape: tuple[int, ...]
    outputs: int  # its output width
    example: np.ndarray  # EXAMPLE_ROWS validation inputs, float32
    spec: SweepSpec
    tracking_uri: str
    run_id: str  # the sweep's run, which the model is logged to
    values: dict[str, float]  # its objectives' values, by metric


def registration(
    model: nn.Module,
    data: DataSplits | DatasetSplits,
    spec: SweepSpec,
    tracking_uri: str,
    run_id: str,
    values: dict[str, float],
    outputs: int | None = None,
) -> Registration | dict[str, Any]:
    """What registering ``model`` (as exported: with its task's head; ``outputs`` wide, default
    num_classes) under the sweep's run ``run_id`` takes, or the registry's entry at once: a model
    of padded sequences is not registered (``skipped`` says why: MLflow's pytorch flavour passes
    its pyfunc one tensor)."""
    name = spec.export.registered_name or spec.name
    if Signature.of(data).masked:
        return {"name": name, "skipped": PADDED_SKIP}
    example = data.val_inputs(EXAMPLE_ROWS).detach().cpu().float().numpy()
    width = outputs or data.num_classes
    return Registration(model, tuple(data.input_shape), width, example, spec, tracking_uri, run_id, values)


def publish(made: Registration) -> dict[str, Any]:
    """Log ``made.model`` (MLflow's pytorch flavour, saved with torch.export, with a tensor
    signature and an input example) to the sweep's run, register it as a new version, and move
    the alias when its objectives' values beat the champion's; the registry's entry. The
    registrar's process calls it (registrar.py), or the sweep's where it cannot."""
    from mlflow.tracking import MlflowClient

    spec, values = made.spec, made.values
    name = spec.export.registered_name or spec.name
    client = MlflowClient(made.tracking_uri)
    signature = _signature(made.input_shape, made.outputs)
    with _tracking_uri(made.tracking_uri):
        logged = _log_model(client, made.run_id, made.model, signature, made.example)
        _ensure_registered(client, name)
        version = client.create_model_version(
            name, logged.model_uri, run_id=made.run_id, tags=_version_tags(spec, values), model_id=logged.model_id
        ).version
    if len(spec.goals) > 1:
        moved, reason = _decide_front(client, name, spec, values)
    else:
        moved, reason = _decide(client, name, spec.objective, float(values[spec.objective.metric]))
    if moved:
        client.set_registered_model_alias(name, ALIAS, version)
    return {
        "name": name,
        "version": int(version),
        "model_uri": f"models:/{name}/{version}",
        "champion": moved,
        "reason": reason,
    }


def warm() -> None:
    """Import what ``publish`` uses and fill MLflow's map of the installed distributions, which
    its check of the requirements reads (about 1 s on a 2-core CPU): the registrar's process
    does it before its first job (registrar.py)."""
    import tempfile

    import mlflow.pytorch
    import torch
    import torch._dynamo  # noqa: F401 (torch.export's)
    import torch.export  # noqa: F401

    configure()
    try:  # MLflow's private cache: what is missing in another version is then built in publish
        from mlflow.utils import requirements_utils

        requirements_utils._init_packages_to_modules_map()
    except (ImportError, AttributeError):
        pass
    # a tiny model saved as publish saves one: torch.export's and MLflow's first-call costs paid now
    tiny = torch.nn.Linear(2, 2)
    with tempfile.TemporaryDirectory(prefix="sweeper-warm-") as folder:
        example = np.zeros((EXAMPLE_ROWS, 2), dtype=np.float32)
        with contextlib.redirect_stdout(io.StringIO()):
            mlflow.pytorch.save_model(
                tiny, f"{folder}/model", signature=_signature((2,), 2), input_example=example, **_SAVED
            )


def _signature(input_shape: tuple[int, ...], outputs: int) -> Any:
    """The logged model's MLflow signature: float32 inputs of ``input_shape``, ``outputs`` float32
    outputs, both for any batch size."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    return ModelSignature(  # -1: any batch size
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *input_shape))]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, outputs))]),
    )


# how the model is saved: with torch.export, and its requirements given, so MLflow does not infer
# them by loading the model in a subprocess
_SAVED: dict[str, Any] = {
    "serialization_format": "pt2",
    "pip_requirements": [f"torch=={version('torch').split('+')[0]}"],
}


@contextlib.contextmanager
def _tracking_uri(tracking_uri: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI set to the sweep's for the block: log_model has no
    client form, and create_model_version finds the logged model (``models:/m-...``) through it
    (the default, ./mlflow.db, is another store where the current folder is not the sweep's)."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def _log_model(client: Any, run_id: str, model: nn.Module, signature: Any, example: np.ndarray) -> Any:
    """Log ``model`` to run ``run_id`` (MLflow's pytorch flavour, saved with torch.export), with
    MLflow's current experiment set to the run's for the call only."""
    import mlflow

    with contextlib.redirect_stdout(io.StringIO()), _experiment_of(client, run_id):
        return mlflow.pytorch.log_model(
            model.eval().cpu(), name="model", signature=signature, input_example=example, run_id=run_id, **_SAVED
        )


def _ensure_registered(client: Any, name: str) -> None:
    """Create the registered model ``name`` unless it exists (the first sweep registering under it)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:  # the first sweep under this name
        client.create_registered_model(name)


def _version_tags(spec: SweepSpec, values: dict[str, float]) -> dict[str, str]:
    """The new version's tags: the sweep and its objectives with this model's values, which the
    next sweep's _decide/_decide_front compare with when this version is the champion."""
    objective = spec.objective
    return {
        f"{TAG}objective_metric": objective.metric,
        f"{TAG}objective_direction": objective.direction,
        f"{TAG}objective_value": repr(float(values[objective.metric])),
        f"{TAG}sweep": spec.name,
        f"{TAG}objectives": _goals_json(spec.goals),
        f"{TAG}objective_values": json.dumps(values, sort_keys=True),
    }


@contextlib.contextmanager
def _experiment_of(client: Any, run_id: str) -> Iterator[None]:
    """The run's experiment as MLflow's current one, for one log_model call: given a run id but
    no active run, MLflow creates the logged model in the current experiment (Default, or
    $MLFLOW_EXPERIMENT_NAME/ID's), not the run's; on a shared server with authentication a user
    may not write there (HTTP 403) and the model would be filed under another experiment."""
    names = ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    os.environ["MLFLOW_EXPERIMENT_ID"] = client.get_run(run_id).info.experiment_id
    try:
        yield
    finally:
        for k in names:
            os.environ.pop(k, None)
        os.environ.update(saved)


def _decide(client: Any, name: str, objective: Objective, value: float) -> tuple[bool, str]:
    """(move the alias?, why), comparing ``value`` with the current champion's recorded objective."""
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        return True, f"first {ALIAS} of '{name}'"
    tags, metric = current.tags, objective.metric
    if tags.get(f"{TAG}objective_metric") != metric or f"{TAG}objective_value" not in tags:
        return False, (
            f"{ALIAS} is version {current.version}, whose objective is not {metric}: "
            f"not comparable, alias left in place"
        )
    best = float(tags[f"{TAG}objective_value"])
    better = objective.better(value, best)
    verb = "beats" if better else "does not beat"
    return better, f"{metric}={value:.6g} {verb} {ALIAS} version {current.version} ({metric}={best:.6g})"


def _goals_json(goals: list[Objective]) -> str:
    return json.dumps([g.model_dump() for g in goals])


def _decide_front(client: Any, name: str, spec: SweepSpec, values: dict[str, float]) -> tuple[bool, str]:
    """(move the alias?, why) for a multi-objective sweep: export.choose applied to the champion
    and this model (the champion first: on a tie it stays)."""
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        return True, f"first {ALIAS} of '{name}'"
    tags = current.tags
    if tags.get(f"{TAG}objectives") != _goals_json(spec.goals) or f"{TAG}objective_values" not in tags:
        return False, (
            f"{ALIAS} is version {current.version}, whose objectives are not "
            f"{', '.join(g.metric for g in spec.goals)}: not comparable, alias left in place"
        )
    theirs = json.loads(tags[f"{TAG}objective_values"])
    picked = choose(spec.goals, spec.export.choose, [theirs, values], lambda v: v)
    shown = ", ".join(f"{m}={v:.6g}" for m, v in values.items())
    held = ", ".join(f"{m}={v:.6g}" for m, v in theirs.items())
    verb = "picks" if picked is values else "does not pick"
    return picked is values, f"export.choose {verb} {shown} over {ALIAS} version {current.version} ({held})"
