"""One trial's configuration, and building it: seed, then data set, model, optimizer and
schedule from the plugins; training it; rebuilding a trained model from its checkpoint."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sweeper.plugin import DatasetSplits, DataSplits, FittedTask
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import accepted_args
from sweeper.pluginhost.tasks import make_task
from sweeper.spec import SweepSpec
from sweeper.trial import lazy_dynamo, loading, speed
from sweeper.trial.batching import steps_per_epoch
from sweeper.trial.checkpoint import Resume
from sweeper.trial.ddp import Ranks
from sweeper.trial.seeding import derive, seed_everything
from sweeper.trial.trainer import OnEpochEnd, Report, fit


@dataclass(frozen=True)
class TrialConfig:
    """Everything one trial needs, as frozen data that crosses processes (a worker process, a
    Ray actor): who it is, its spec with the sampled values applied, and where its state goes."""

    number: int
    seed: int
    params: dict[str, Any]  # the sampled values, by dotted path
    spec: SweepSpec  # the sweep's spec with ``params`` applied
    threads: int | None = None  # torch CPU threads for this trial (None: leave them as they are)
    checkpoint: str | None = None  # where a completed trial's final training state goes
    # epochs between training states saved to `checkpoint` while training (0: only the final one)
    checkpoint_every: int = 0
    resume: str | None = None  # a training state file to continue from instead of epoch 1
    # the epoch after which the state is saved to `checkpoint` too, where the trial may pause (the
    # family round's: a trial promoted later continues from it); None: none
    pause_epoch: int | None = None
    # a trial the pruner stops saves its state at that epoch too (search.pruner.promote: a later
    # batch may promote it, continuing from there)
    pause_on_prune: bool = False
    # resume from another trial's state with this trial's hyperparameters (PBT; see checkpoint.Resume)
    new_hyperparameters: bool = False


@dataclass(frozen=True, eq=False)
class TrainedTrial:
    history: list[dict[str, float]]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data: DataSplits | DatasetSplits
    task: FittedTask


@dataclass(frozen=True, eq=False)
class TrialParts:
    """A trial's built pieces, before training."""

    data: DataSplits | DatasetSplits
    data_fingerprint: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    task: FittedTask

    def data_info(self) -> dict[str, Any]:
        """What a trial's info says of its data: the fingerprint, the path its batches take
        (trial/loading.py), and the splits' sizes and shape."""
        data = self.data
        return {
            "data_fingerprint": self.data_fingerprint,
            "data_path": "tensors" if isinstance(data, DataSplits) else "loader",
            "data_profile": {
                "train": int(data.train_y.shape[0]),
                "val": int(data.val_y.shape[0]),
                "classes": int(data.num_classes),
                "input_shape": list(data.input_shape),
            },
        }


def fingerprint(data: DataSplits | DatasetSplits) -> str:
    """sha256 over the split tensors (shapes, dtypes, bytes): same value, same data and split.
    DatasetSplits: over the targets, the sample shape and the datasets' types (reading every
    sample of a data set larger than memory would cost an epoch)."""
    h = hashlib.sha256()
    tensors = [data.train_y, data.val_y]
    if isinstance(data, DataSplits):
        tensors = [data.train_x, data.train_y, data.val_x, data.val_y]
    else:
        kinds = [f"{type(d).__module__}.{type(d).__qualname__}" for d in (data.train, data.val)]
        h.update(f"datasets {kinds} {tuple(data.sample_shape)}".encode())
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def dataset_args(factory: Any, args: dict[str, Any], seed: int) -> dict[str, Any]:
    """``args`` plus ``seed`` when the dataset factory accepts it (the contract's injection)."""
    accepted = accepted_args(factory)  # None: it takes any keyword
    if accepted is None or "seed" in accepted:
        return {**args, "seed": seed}
    return dict(args)


class DataCache:
    """One data set on its device, kept by a process for the trials it trains: the trials of a
    sweep share it (same plugin, args, seed), so a worker loads it once, not once per trial.
    Another data set (or device) replaces it."""

    def __init__(self) -> None:
        # at most one: its key -> (splits, fingerprint)
        self.held: dict[str, tuple[DataSplits | DatasetSplits, str]] = {}

    def load(self, spec: SweepSpec, device: torch.device) -> tuple[DataSplits | DatasetSplits, str]:
        """The dataset plugin's splits on ``device`` (as ``data.path`` reads them: whole tensors,
        or datasets whose targets alone are on the device), and their fingerprint (of the data
        as the plugin returned it). The split's seed is the sweep's "data" stream: the same for
        every trial of the sweep."""
        key = self._key(spec, device)
        if key not in self.held:
            self.put(spec, device, make_data(spec))
        return self.held[key]

    def put(self, spec: SweepSpec, device: torch.device, data: DataSplits | DatasetSplits) -> None:
        """Hold ``data`` (as a plugin returns it) as the spec's data set on ``device``: what
        ``load`` gives the trials built from this cache (a refit's training + validation)."""
        self.held.clear()
        self.held[self._key(spec, device)] = (loading.for_path(data, spec.data.path).to(device), fingerprint(data))

    @staticmethod
    def _key(spec: SweepSpec, device: torch.device) -> str:
        factory = registry.get("datasets", spec.dataset.plugin)
        args = dataset_args(factory, spec.dataset.args, derive(spec.seed, "data"))
        return json.dumps([spec.dataset.plugin, args, spec.data.path, str(device)], sort_keys=True, default=str)

    def forget(self) -> None:
        """Drop the data set (its device memory goes back with the next empty_cache)."""
        self.held.clear()


@dataclass(eq=False)
class ProcessCache:
    """What a process that trains trials keeps from one trial to the next: the sweep's data set
    and the compiled forwards (train.compile). Held by whatever runs the process's trials, for
    as long as it does: a worker process's loop, the sweep's own process (its inline executor and
    LR warm start), a Ray worker. A caller that trains one trial may pass none: a fresh one."""

    data: DataCache = field(default_factory=DataCache)
    compiled: speed.CompiledForwards = field(default_factory=speed.CompiledForwards)


def load_data(
    spec: SweepSpec, device: torch.device, cache: DataCache | None = None
) -> tuple[DataSplits | DatasetSplits, str]:
    """The dataset plugin's splits on ``device`` and their fingerprint (from ``cache`` when it
    holds them)."""
    return (cache if cache is not None else DataCache()).load(spec, device)


def make_data(spec: SweepSpec) -> DataSplits | DatasetSplits:
    """The dataset plugin's splits as it returns them (uncached: for one look before the sweep)."""
    factory = registry.get("datasets", spec.dataset.plugin)
    return factory(**dataset_args(factory, spec.dataset.args, derive(spec.seed, "data")))


def build_task(spec: SweepSpec, data: DataSplits | DatasetSplits) -> FittedTask:
    """The spec's task fitted to ``data``'s training split (on the data's device)."""
    return make_task(spec).fit(data)


def build_model(spec: SweepSpec, data: DataSplits | DatasetSplits, task: FittedTask | None = None) -> nn.Module:
    """The model plugin's model, with as many outputs as the task needs (``task``: the spec's
    task fitted to ``data``, fitted here when not given)."""
    factory = registry.get("models", spec.model.plugin)
    outputs = (task if task is not None else build_task(spec, data)).outputs
    return factory(input_shape=data.input_shape, num_classes=outputs, **model_args(factory, spec.model.args, data))


def model_args(factory: Any, args: dict[str, Any], data: DataSplits | DatasetSplits) -> dict[str, Any]:
    """``args`` plus the data set's ``features`` when the model factory declares it by name (not
    to one taking **kwargs: models written before ``features`` forward their kwargs elsewhere)."""
    accepted = accepted_args(factory)
    if accepted is not None and "features" in accepted:
        return {**args, "features": data.features}
    return dict(args)


def build_optimizer(spec: SweepSpec, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer plugin over ``model``'s parameters; on CUDA, its fused kernels where it has them."""
    lazy_dynamo.defer()  # no torch._dynamo import for an optimizer, unless something compiles
    factory = registry.get("optimizers", spec.optimizer.plugin)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return factory(model.parameters(), **speed.optimizer_args(factory, spec.optimizer.args, device))


def build_schedule(spec: SweepSpec, optimizer: torch.optim.Optimizer, data: DataSplits | DatasetSplits) -> Any:
    """The schedule plugin's scheduler (or None), stepped once per optimizer step of the run."""
    return registry.get("schedules", spec.schedule.plugin)(
        optimizer,
        epochs=spec.train.epochs,
        steps_per_epoch=steps_per_epoch(data, spec.train.batch_size),
        **spec.schedule.args,
    )


def build(config: TrialConfig, device: torch.device, cache: ProcessCache | None = None) -> TrialParts:
    """Seed every RNG, then build dataset, model, optimizer and schedule from the plugins (the
    data set from ``cache`` when it holds it)."""
    spec = config.spec
    seed_everything(config.seed)
    data, data_fingerprint = load_data(spec, device, cache.data if cache is not None else None)
    task = build_task(spec, data)
    model = speed.to_memory_format(build_model(spec, data, task).to(device), device)
    optimizer = build_optimizer(spec, model)
    scheduler = build_schedule(spec, optimizer, data)
    return TrialParts(data, data_fingerprint, model, optimizer, scheduler, task)


def run_trial(
    config: TrialConfig,
    report: Report,
    device: torch.device,
    info: dict[str, Any] | None = None,
    before_fit: Callable[[TrialParts], None] | None = None,
    resume: Resume | None = None,
    on_epoch_end: OnEpochEnd | None = None,
    cache: ProcessCache | None = None,
    ranks: Ranks | None = None,
) -> TrainedTrial:
    """Build and train; ``info`` (if given) receives the data fingerprint; ``before_fit`` runs on
    the built parts just before training (e.g. an LR range test); ``resume`` and ``on_epoch_end``
    go to the trainer (continue from a saved state; hand out the state after each epoch);
    ``cache``: the process's data set and compiled forwards, kept for its next trials.
    ``ranks``: this process is one of a DDP trial's (trial/ddp.py)."""
    parts = build(config, device, cache)
    if info is not None:
        info.update(parts.data_info())
    if before_fit is not None:
        before_fit(parts)
    history = fit(
        parts.model,
        parts.optimizer,
        parts.scheduler,
        parts.data,
        config.spec.train,
        seed=config.seed,
        report=report,
        resume=resume,
        on_epoch_end=on_epoch_end,
        compiled=cache.compiled if cache is not None else None,
        task=parts.task,
        loading=config.spec.data,
        ranks=ranks,
    )
    return TrainedTrial(history, parts.model, parts.optimizer, parts.scheduler, parts.data, parts.task)


def rebuild(
    spec: SweepSpec, checkpoint_file: Path, cache: DataCache | None = None
) -> tuple[nn.Module, DataSplits | DatasetSplits, FittedTask]:
    """A trained model (on the CPU, eval mode), its data and its task, from the trial's spec and
    checkpoint (the data from ``cache`` when it holds it)."""
    from sweeper.trial import checkpoint

    data, _ = load_data(spec, torch.device("cpu"), cache)
    task = build_task(spec, data)
    model = build_model(spec, data, task)
    model.load_state_dict(checkpoint.load(checkpoint_file)["model"])
    return model.eval(), data, task
