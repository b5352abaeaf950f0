"""One trial: seed, build dataset/model/optimizer/schedule from the plugins, train."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sweeper import registry
from sweeper.data import steps_per_epoch
from sweeper.plugin import DataSplits
from sweeper.seeding import seed_everything
from sweeper.spec import SweepSpec
from sweeper.trainer import Report, fit


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
_data_cache: dict[str, DataSplits] = {}


def load_data(spec: SweepSpec, device: torch.device) -> DataSplits:
    factory = registry.get("datasets", spec.dataset.plugin)
    args = dict(spec.dataset.args)
    if "seed" in (registry.accepted_args(factory) or {"seed": None}):
        args["seed"] = spec.seed  # the sweep seed: every trial sees the same split
    key = json.dumps([spec.dataset.plugin, args, str(device)], sort_keys=True, default=str)
    if key not in _data_cache:
        _data_cache.clear()
        _data_cache[key] = factory(**args).to(device)
    return _data_cache[key]


def build_model(spec: SweepSpec, data: DataSplits) -> nn.Module:
    factory = registry.get("models", spec.model.plugin)
    return factory(input_shape=data.input_shape, num_classes=data.num_classes, **spec.model.args)


def run_trial(config: TrialConfig, report: Report, device: torch.device) -> TrainedTrial:
    spec = config.spec
    seed_everything(config.seed)
    data = load_data(spec, device)
    model = build_model(spec, data).to(device)
    optimizer = registry.get("optimizers", spec.optimizer.plugin)(model.parameters(), **spec.optimizer.args)
    scheduler = registry.get("schedules", spec.schedule.plugin)(
        optimizer, epochs=spec.train.epochs, steps_per_epoch=steps_per_epoch(data, spec.train.batch_size),
        **spec.schedule.args)
    history = fit(model, optimizer, scheduler, data, spec.train, seed=config.seed, report=report)
    return TrainedTrial(history, model, optimizer, scheduler, data)
