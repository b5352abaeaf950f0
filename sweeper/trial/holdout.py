"""The held-out test split: the chosen trial scored once, after the sweep, on data the search never
saw. The best of many noisy validation scores is biased upward (the search selected on them); the
test score is not. Only the code that finishes a sweep calls this (an import-linter contract keeps
every other module of ``sweeper.search`` from importing it), and it reads the test split from a
fresh call of the data-set plugin, never from the data a trial trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from sweeper.plugin import DatasetSplits, DataSplits, FittedTask
from sweeper.spec import SweepSpec
from sweeper.trial.build import make_data
from sweeper.trial.trainer import evaluate

__all__ = ["PREFIX", "Scored", "score", "score_chosen", "test_split"]

PREFIX = "test_"  # the task's validation metrics (val_acc, val_rmse, ...) renamed for the test split


@dataclass(frozen=True)
class Scored:
    """A model's metrics on the test split (``test_*``) and how many samples it holds."""

    metrics: dict[str, float]
    samples: int


def test_split(spec: SweepSpec) -> DataSplits | DatasetSplits | None:
    """The data-set plugin's splits with a test split, as it returns them (on the CPU); None when
    the plugin has no test split."""
    data = make_data(spec)
    return data if data.held_out() is not None else None


def score(model: nn.Module, data: DataSplits | DatasetSplits, task: FittedTask, batch_size: int) -> dict[str, float]:
    """The task's metrics of ``model`` on ``data``'s test split, named ``test_*`` (``test_loss``,
    ``test_acc``, ``test_rmse``, ...), by the code that evaluates a trial on its validation split.
    ``model`` must be on the device of ``data``'s test tensors (the CPU for a plugin's output)."""
    held = data.held_out()
    if held is None:
        raise ValueError("the data set has no test split")
    return {
        PREFIX + name.removeprefix("val_"): value
        for name, value in evaluate(model, held, batch_size, task=task).items()
    }


def score_chosen(spec: SweepSpec, model: nn.Module, task: FittedTask) -> Scored | None:
    """The chosen trial's test metrics (``spec``: its spec with its values; ``model`` as
    ``build.rebuild`` gives it); None when the data set has no test split."""
    data = test_split(spec)
    if data is None:
        return None
    assert data.test_y is not None  # test_split returns only splits that hold one
    metrics = score(model.cpu().eval(), data, task, spec.train.eval_batch_size)
    return Scored(metrics, int(data.test_y.shape[0]))
