"""``export.refit``: the chosen configuration trained once more, on the training and validation
samples together, before it is scored on the test split and exported. With the chosen trial's
seed and its epochs, the same sweep refits to the same weights (bitwise on the CPU). The
validation split is still evaluated each epoch, in-sample now: its figures only show the run went.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.spec import SweepSpec
from sweeper.trial import checkpoint
from sweeper.trial.build import ProcessCache, TrainedTrial, TrialConfig, make_data, run_trial
from sweeper.trial.trainer import resolve_device

__all__ = ["REFIT_NUMBER", "merged", "refit"]

REFIT_NUMBER = -1  # the refit's trial number in its checkpoint: no trial of the search


def merged(data: DataSplits | DatasetSplits) -> DataSplits | DatasetSplits:
    """``data`` with the validation samples appended to the training split (validation kept)."""
    if isinstance(data, DataSplits):
        return replace(
            data, train_x=torch.cat([data.train_x, data.val_x]), train_y=torch.cat([data.train_y, data.val_y])
        )
    return replace(data, train=ConcatDataset([data.train, data.val]), train_y=torch.cat([data.train_y, data.val_y]))


def refit(spec: SweepSpec, seed: int, params: dict[str, object], path: Path) -> TrainedTrial:
    """Train ``spec`` (the chosen trial's, its values applied) with the trial's ``seed`` on the
    training + validation samples for ``train.epochs``; the model's weights saved to ``path``
    (``build.rebuild`` reads them). Raises what the training raises."""
    device = resolve_device(spec.train.device)
    cache = ProcessCache()
    cache.data.put(spec, device, merged(make_data(spec)))
    config = TrialConfig(number=REFIT_NUMBER, seed=seed, params=dict(params), spec=spec)
    trained = run_trial(config, lambda epoch, metrics: None, device, cache=cache)
    checkpoint.save(path, {"model": trained.model.state_dict(), "history": trained.history, "seed": seed})
    return trained
