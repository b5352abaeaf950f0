"""One trial: seed, build dataset/model/optimizer/schedule from the plugins, train."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from sweeper import registry
from sweeper.checkpoint import Resume
from sweeper.data import steps_per_epoch
from sweeper.plugin import DataSplits
from sweeper.seeding import seed_everything
from sweeper.spec import SweepSpec
from sweeper.trainer import OnEpochEnd, Report, fit


@dataclass(frozen=True)
class TrialConfig:
    """Everything a trial needs; ``spec`` already holds the sampled values."""

    number: int
    seed: int
    params: dict[str, Any]
    spec: SweepSpec


@dataclass(frozen=True, eq=False)
class TrainedTrial:
    history: list[dict[str, float]]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: DataSplits


# One data set per process, on its device: trials of a sweep share it (same plugin, args, seed).
_data_cache: dict[str, tuple[DataSplits, str]] = {}


def fingerprint(data: DataSplits) -> str:
    """sha256 over the split tensors (shapes, dtypes, bytes): same value, same data and split."""
    h = hashlib.sha256()
    for t in (data.train_x, data.train_y, data.val_x, data.val_y):
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def dataset_args(factory: Any, args: dict[str, Any], seed: int) -> dict[str, Any]:
    """``args`` plus ``seed`` when the dataset factory accepts it (the contract's injection)."""
    if "seed" in (registry.accepted_args(factory) or {"seed": None}):
        return {**args, "seed": seed}
    return dict(args)


def load_data(spec: SweepSpec, device: torch.device) -> tuple[DataSplits, str]:
    """The dataset plugin's splits on ``device``, and their fingerprint."""
    factory = registry.get("datasets", spec.dataset.plugin)
    args = dataset_args(factory, spec.dataset.args, spec.seed)  # the sweep seed: same split every trial
    key = json.dumps([spec.dataset.plugin, args, str(device)], sort_keys=True, default=str)
    if key not in _data_cache:
        _data_cache.clear()
        data = factory(**args)
        _data_cache[key] = (data.to(device), fingerprint(data))
    return _data_cache[key]


def build_model(spec: SweepSpec, data: DataSplits) -> nn.Module:
    factory = registry.get("models", spec.model.plugin)
    return factory(input_shape=data.input_shape, num_classes=data.num_classes, **spec.model.args)


@dataclass(frozen=True, eq=False)
class TrialParts:
    """A trial's built pieces, before training."""

    data: DataSplits
    data_fingerprint: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any


def build(config: TrialConfig, device: torch.device) -> TrialParts:
    """Seed every RNG, then build dataset, model, optimizer and schedule from the plugins."""
    spec = config.spec
    seed_everything(config.seed)
    data, data_fingerprint = load_data(spec, device)
    model = build_model(spec, data).to(device)
    optimizer = registry.get("optimizers", spec.optimizer.plugin)(model.parameters(), **spec.optimizer.args)
    scheduler = registry.get("schedules", spec.schedule.plugin)(
        optimizer, epochs=spec.train.epochs, steps_per_epoch=steps_per_epoch(data, spec.train.batch_size),
        **spec.schedule.args)
    return TrialParts(data, data_fingerprint, model, optimizer, scheduler)


def run_trial(config: TrialConfig, report: Report, device: torch.device, info: dict[str, Any] | None = None,
              before_fit: Callable[[TrialParts], None] | None = None, resume: Resume | None = None,
              on_epoch_end: OnEpochEnd | None = None) -> TrainedTrial:
    """Build and train; ``info`` (if given) receives the data fingerprint; ``before_fit`` runs on
    the built parts just before training (e.g. an LR range test); ``resume`` and ``on_epoch_end``
    go to the trainer (continue from a saved state; hand out the state after each epoch)."""
    parts = build(config, device)
    if info is not None:
        info["data_fingerprint"] = parts.data_fingerprint
    if before_fit is not None:
        before_fit(parts)
    history = fit(parts.model, parts.optimizer, parts.scheduler, parts.data, config.spec.train,
                  seed=config.seed, report=report, resume=resume, on_epoch_end=on_epoch_end)
    return TrainedTrial(history, parts.model, parts.optimizer, parts.scheduler, parts.data)
