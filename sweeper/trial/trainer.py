"""Fit one model: pure PyTorch. No optuna, ray or mlflow here: progress leaves through the
``report(epoch, metrics)`` callable, which may raise ``TrialPruned``; the training state leaves
through ``on_epoch_end(state)`` and comes back as ``resume`` (see trial/checkpoint.py)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sweeper.errors import TrialFailed
from sweeper.plugin import DatasetSplits, DataSplits, FittedTask, Meter
from sweeper.pluginhost import registry
from sweeper.spec import DataSpec, TrainSpec
from sweeper.trial import checkpoint, speed
from sweeper.trial.batching import eval_batches, train_batches
from sweeper.trial.ddp import Ranks, marked_last, no_sync
from sweeper.trial.epoch import EpochClock, Schedule, TrainSums, check_now, close_epoch, run_epochs, steps_per_step
from sweeper.trial.loading import Batch, LoaderSettings, TrialLoaders, forward

Report = Callable[[int, dict[str, float]], None]
# on_epoch_end(state): the training state after an epoch, before that epoch's report
OnEpochEnd = Callable[[checkpoint.State], None]


def resolve_device(preference: str, worker_index: int = 0) -> torch.device:
    """cuda when asked or available (one GPU per worker, round robin), else cpu."""
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrialFailed("train.device is 'cuda' but no CUDA device is available")
    return torch.device("cuda", worker_index % torch.cuda.device_count())


def amp_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The autocast dtype, or None for plain fp32."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    # emulated bf16 (older GPUs) is slower than fp16 with a scaler: count only native support
    if precision == "fp16" or (precision == "auto" and not torch.cuda.is_bf16_supported(including_emulation=False)):
        return torch.float16
    return torch.bfloat16


def default_task(data: DataSplits | DatasetSplits, train: TrainSpec) -> FittedTask:
    """The default task (classification, with ``train.label_smoothing``) fitted to ``data``: for
    a caller that names no task."""
    smoothing = {"label_smoothing": train.label_smoothing} if train.label_smoothing else {}
    return registry.get("tasks", "classification")(**smoothing).fit(data)


class Stepper:
    """One optimizer step over a batch (indices into whole-tensor splits, or a loader's Batch):
    micro-batches (accumulation), autocast, loss scaling, clipping; the loss is the task's.
    Shared by training and the LR range test."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: DataSplits | DatasetSplits,
        train: TrainSpec,
        seed: int,
        task: FittedTask | None = None,
    ) -> None:
        self.model, self.optimizer, self.data, self.train = model, optimizer, data, train
        self.task = task if task is not None else default_task(data, train)
        self.device = data.train_y.device
        self.dtype = amp_dtype(self.device, train.precision)
        # fp16 needs loss scaling to keep small gradients; bf16 has fp32's range and does not.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype is torch.float16)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.channels_last = speed.channels_last(model, self.device)  # as build() laid the model out
        self.augment_gen = torch.Generator(device=self.device).manual_seed(seed + 1)  # augmentation draws

    def step(self, batch: torch.Tensor | Batch, meter: Meter | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss, pre-clipping gradient norm), both on the device; ``meter`` gets each
        micro-batch's outputs and targets."""
        data, train = self.data, self.train
        transform = data.train_transform if isinstance(data, DataSplits) else None
        loss_sum = torch.zeros((), device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        for micro, last in marked_last(list(self._micro_batches(batch))):  # accumulate: same math, less memory
            x, y = micro.x, micro.y
            if transform is not None:
                x = transform(x, self.augment_gen)
            x = speed.as_input(data.inputs(x), self.channels_last)
            # weight each micro-batch by its share so the sum is the full batch's mean loss (a DDP
            # rank's batch is its share of the global one: DDP averages the ranks' gradients)
            with no_sync(self.model, last):
                with autocast(self.device, self.dtype):
                    out = forward(self.model, x, micro.mask)
                    loss = self.task.loss(out, y)
                self.scaler.scale(loss * (len(y) / len(batch))).backward()
            loss_sum += loss.detach().float() * len(y)
            if meter is not None:
                meter.update(out.detach(), y)
        self.scaler.unscale_(self.optimizer)
        if train.grad_clip is not None:
            norm = nn.utils.clip_grad_norm_(self.params, train.grad_clip)
        else:
            norm = nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss_sum, norm

    def _micro_batches(self, batch: torch.Tensor | Batch) -> Iterator[Batch]:
        """The step's micro-batches: a loader's Batch cut in ``accumulate`` parts, or the rows of
        the whole-tensor splits at each part of a batch of indices (read one part at a time)."""
        if isinstance(batch, Batch):
            yield from batch.split(self.train.accumulate)
            return
        assert isinstance(self.data, DataSplits)
        for micro in batch.tensor_split(self.train.accumulate):
            yield Batch(self.data.train_x[micro], self.data.train_y[micro])


@dataclass
class _Loop:
    """One trial as epoch.py's loop drives it (a Trainee): ``net`` trains (``model`` itself, or
    its compiled forward; under DDP with ``ranks``), ``evaluated`` is evaluated (outside DDP); the
    batches come from ``loaders`` (the DataLoader path) or by index from the whole-tensor splits;
    each epoch's metrics go to ``history`` and ``report``, its training state to ``on_epoch_end``."""

    net: nn.Module
    evaluated: nn.Module
    model: nn.Module
    schedule: Schedule
    data: DataSplits | DatasetSplits
    train: TrainSpec
    stepper: Stepper
    generators: dict[str, torch.Generator]  # "order" (batch order), "augment", "loader_workers"
    loaders: TrialLoaders | None
    seed: int
    ranks: Ranks | None
    report: Report
    on_epoch_end: OnEpochEnd | None
    history: list[dict[str, float]] = field(default_factory=list)
    base_lrs: list[float] = field(default_factory=list)  # the param groups' LRs before training

    @property
    def device(self) -> torch.device:
        return self.stepper.device

    def restore(self, resume: checkpoint.Resume | None) -> int:
        """Continue from ``resume`` if given (model, optimizer, schedule, scaler, generators and
        history); the first epoch to train."""
        self.base_lrs = [group["lr"] for group in self.schedule.optimizer.param_groups]
        if resume is None:
            return 1
        self.base_lrs = checkpoint.restore(
            resume,
            model=self.model,
            optimizer=self.schedule.optimizer,
            scheduler=self.schedule.scheduler,
            scaler=self.stepper.scaler,
            generators=self.generators,
        )
        self.history = [dict(h) for h in resume.state["history"]]
        return int(resume.state["epoch"]) + 1

    def running(self) -> bool:
        return True  # a trial that stops raises (pruned, failed)

    def train_epoch(self, epoch: int) -> TrainSums:
        """One epoch's optimizer steps; TrialFailed as soon as the summed loss is not finite. Under
        DDP the sums are every rank's samples (the gradient norm is the same on each: reduced grads)."""
        stepper, ranks, device = self.stepper, self.ranks, self.stepper.device
        if ranks is not None:
            ranks.reseed(self.seed, epoch)
        self.net.train()
        loss_sum = torch.zeros((), device=device)
        norm_sum = torch.zeros((), device=device)
        meter = stepper.task.meter("train")
        seen = steps = 0
        for batch in self._batches():
            batch_loss, norm = stepper.step(batch, meter)
            if steps_per_step(self.schedule.scheduler):
                self.schedule.scheduler.step()
            loss_sum += batch_loss
            norm_sum += norm.float()
            seen += len(batch)
            steps += 1
            if check_now(device, steps) and not torch.isfinite(loss_sum):
                raise TrialFailed(f"non-finite loss at epoch {epoch}, step {steps}")
        if ranks is None:
            return TrainSums(loss_sum.item(), norm_sum.item(), seen, steps, meter.compute())
        sums = torch.tensor([0.0, float(seen)], dtype=torch.float64, device=device)
        sums[0] = loss_sum
        loss_total, total = ranks.sum(sums)
        return TrainSums(loss_total.item(), norm_sum.item(), round(total.item()), steps, ranks.mean(meter.compute()))

    def _batches(self) -> Iterator[torch.Tensor] | Iterator[Batch]:
        """The epoch's batches: a loader's, or index batches over the whole-tensor splits (this
        rank's share of each under DDP)."""
        if self.loaders is not None:
            return self.loaders.train_epoch()
        assert isinstance(self.data, DataSplits)
        batches = train_batches(self.data, self.train.batch_size, self.generators["order"])
        return batches if self.ranks is None else map(self.ranks.shard, batches)

    def validate(self) -> dict[str, float]:
        """The task's validation metrics; under DDP rank 0 evaluates the whole split (exact, as
        one device does) and the others wait for its numbers."""
        stepper, ranks = self.stepper, self.ranks
        if ranks is not None and not ranks.main:
            return ranks.share(None)
        val = evaluate(self.evaluated, self.data, self.train.eval_batch_size, stepper.dtype, stepper.task, self.loaders)
        return val if ranks is None else ranks.share(val)

    def end_epoch(self, epoch: int, sums: TrainSums, val: dict[str, float], clock: EpochClock) -> None:
        metrics = close_epoch(epoch, sums, val, self.schedule, clock)
        self.history.append(metrics)
        if self.on_epoch_end is not None:
            self.on_epoch_end(
                checkpoint.capture(
                    model=self.model,
                    optimizer=self.schedule.optimizer,
                    scheduler=self.schedule.scheduler,
                    scaler=self.stepper.scaler,
                    generators=self.generators,
                    epoch=epoch,
                    history=self.history,
                    base_lrs=self.base_lrs,
                )
            )
        self.report(epoch, metrics)


def fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    data: DataSplits | DatasetSplits,
    train: TrainSpec,
    *,
    seed: int,
    report: Report,
    resume: checkpoint.Resume | None = None,
    on_epoch_end: OnEpochEnd | None = None,
    compiled: speed.CompiledForwards | None = None,
    task: FittedTask | None = None,
    loading: DataSpec | None = None,
    ranks: Ranks | None = None,
) -> list[dict[str, float]]:
    """Train up to ``train.epochs`` epochs, from ``resume``'s epoch + 1 if given; returns the
    per-epoch metrics of every epoch, resumed ones included (those trained here also go to ``report``).
    ``compiled``: the process's compiled forwards (train.compile), reused by its later trials.
    ``task``: the loss and metrics (default: classification). ``loading``: the DataLoader
    options when ``data`` is DatasetSplits (default: the spec's defaults). ``ranks``: this
    process is one of a DDP trial's (trial/ddp.py): it trains its share of each batch."""
    # train.compile: the forward runs compiled (checkpoints keep the plain model's state)
    net = (compiled if compiled is not None else speed.CompiledForwards()).model(model) if train.compile else model
    evaluated = net  # rank 0 evaluates with the plain (or compiled) module, outside DDP
    if ranks is not None:
        net = ranks.wrap(net, train.sync_batchnorm)
    stepper = Stepper(net, optimizer, data, train, seed, task)
    order_gen = torch.Generator().manual_seed(seed)  # batch order
    loaders = None
    if isinstance(data, DatasetSplits):  # the DataLoader path
        loaders = _loaders(data, train, loading, order_gen, seed, stepper.device, ranks)
    generators = {"order": order_gen, "augment": stepper.augment_gen}
    if loaders is not None:
        generators["loader_workers"] = loaders.worker_gen
    schedule = Schedule(optimizer, scheduler)
    loop = _Loop(
        net, evaluated, model, schedule, data, train, stepper, generators, loaders, seed, ranks, report, on_epoch_end
    )
    try:
        run_epochs(loop, range(loop.restore(resume), train.epochs + 1))
        return loop.history
    finally:
        if loaders is not None:
            loaders.close()


def _loaders(
    data: DatasetSplits,
    train: TrainSpec,
    loading: DataSpec | None,
    order: torch.Generator,
    seed: int,
    device: torch.device,
    ranks: Ranks | None,
) -> TrialLoaders:
    """A trial's DataLoaders, with the spec's data options (``loading``; default: the defaults)."""
    return TrialLoaders(
        data,
        LoaderSettings.resolve(loading if loading is not None else DataSpec(), device),
        batch_size=train.batch_size,
        eval_batch_size=train.eval_batch_size,
        order=order,
        seed=seed,
        device=device,
        ranks=ranks,
    )


def evaluate(
    model: nn.Module,
    data: DataSplits | DatasetSplits,
    batch_size: int,
    dtype: torch.dtype | None = None,
    task: FittedTask | None = None,
    loaders: TrialLoaders | None = None,
) -> dict[str, float]:
    """The task's metrics on the validation split (``val_loss`` among them; default task:
    classification, mean cross-entropy and accuracy). DatasetSplits are read by ``loaders``'
    validation loader (default: one without workers, for this call)."""
    task = task if task is not None else default_task(data, TrainSpec())
    model.eval()
    device = data.val_y.device
    meter = task.meter("val")
    layout = speed.channels_last(model, device)
    with torch.inference_mode(), autocast(device, dtype):
        if isinstance(data, DataSplits):
            for part in eval_batches(data.val_x.shape[0], batch_size):
                meter.update(model(speed.as_input(data.inputs(data.val_x[part]), layout)).float(), data.val_y[part])
        else:
            own = loaders is None
            if loaders is None:
                loaders = TrialLoaders(
                    data,
                    LoaderSettings(),
                    batch_size=batch_size,
                    eval_batch_size=batch_size,
                    order=torch.Generator(),
                    seed=0,
                    device=device,
                )
            try:
                for batch in loaders.val_batches():
                    x = speed.as_input(data.inputs(batch.x), layout)
                    meter.update(forward(model, x, batch.mask).float(), batch.y)
            finally:
                if own:
                    loaders.close()
    metrics = meter.compute()
    if not math.isfinite(metrics["val_loss"]):
        raise TrialFailed("non-finite loss on the validation split")
    return metrics


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
