"""The epoch loop, the same for a trial trained alone (trainer.py) and for a fused model's
members (fused.py): ``run_epochs`` drives either through the ``Trainee`` protocol, and
``close_epoch`` ends each trial's epoch alike: the non-finite guards, the schedule stepped on the
validation loss, and the metrics a trial reports (its history, the pruner's input, MLflow's
per-epoch metrics), with the epoch's clock and the device's peak memory. Pure PyTorch: no
optuna, mlflow or ray here."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from sweeper.errors import TrialFailed

# Checking the loss for NaN/Inf forces a GPU sync; on CUDA do it every this many optimizer steps.
FINITE_CHECK_EVERY = 25


def check_now(device: torch.device, steps: int) -> bool:
    """Whether to look at the loss for NaN/Inf after ``steps`` optimizer steps: after every
    step on a CPU (free), every FINITE_CHECK_EVERY on a GPU (a sync)."""
    return device.type == "cpu" or steps % FINITE_CHECK_EVERY == 0


class EpochClock:
    """An epoch's wall time (training and validation) and, on CUDA, its peak device memory
    (reset when the epoch begins; a fused model's is its group's)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.started = time.perf_counter()
        self.stopped: float | None = None

    def stop(self) -> None:
        """Stop the clock: a fused model's members all report their group's seconds."""
        self.stopped = time.perf_counter()

    def seconds(self) -> float:
        return (self.stopped if self.stopped is not None else time.perf_counter()) - self.started


@dataclass
class TrainSums:
    """One trial's sums over an epoch's optimizer steps."""

    loss: float  # each batch's mean loss x its size, summed: over ``seen`` samples
    grad_norm: float  # the pre-clipping gradient norms, summed over ``steps``
    seen: int
    steps: int
    train: dict[str, float]  # the task's training meter (train_acc, ...)


@dataclass
class Schedule:
    """What the epoch's end reads and steps of a trial's optimization: its optimizer (the LR it
    reports) and its schedule (a ReduceLROnPlateau steps once an epoch, on the validation loss)."""

    optimizer: torch.optim.Optimizer
    scheduler: Any


Sums = TypeVar("Sums")  # what a trainee's epoch of steps gives: TrainSums, or each member's
Val = TypeVar("Val")  # what its validation gives: the metrics, or each member's


class Trainee(Protocol[Sums, Val]):
    """What ``run_epochs`` drives: one trial (trainer.py) or a fused model's members (fused.py)."""

    @property
    def device(self) -> torch.device:
        """Where it trains (the epoch's clock reads its peak memory there)."""

    def running(self) -> bool:
        """Whether anything is left to train (a fused model's members may all have left)."""

    def train_epoch(self, epoch: int) -> Sums:
        """The epoch's optimizer steps; their sums."""

    def validate(self) -> Val:
        """The validation split's metrics."""

    def end_epoch(self, epoch: int, sums: Sums, val: Val, clock: EpochClock) -> None:
        """The epoch's end (close_epoch), its training state handed out and its report."""


def run_epochs(trainee: Trainee[Sums, Val], epochs: Iterable[int]) -> None:
    """Train, validate and end each of ``epochs`` while the trainee has something running."""
    for epoch in epochs:
        if not trainee.running():
            return
        clock = EpochClock(trainee.device)
        sums = trainee.train_epoch(epoch)
        if not trainee.running():
            return
        val = trainee.validate()
        clock.stop()
        trainee.end_epoch(epoch, sums, val, clock)


def close_epoch(
    epoch: int, sums: TrainSums, val: dict[str, float], schedule: Schedule, clock: EpochClock
) -> dict[str, float]:
    """The trial's metrics of ``epoch``, after the guards (TrialFailed for a non-finite training
    or validation loss) and the per-epoch schedule's step: ``train_loss`` (the mean over the
    seen samples), the task's metrics of each split (``val`` with ``val_loss``), the LR, the
    mean gradient norm, the epoch's seconds and samples a second; on CUDA the peak memory (MiB)."""
    train_loss = sums.loss / sums.seen
    if not math.isfinite(train_loss):
        raise TrialFailed(f"non-finite loss at epoch {epoch}")
    if not math.isfinite(val["val_loss"]):
        raise TrialFailed("non-finite loss on the validation split")
    if isinstance(schedule.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        schedule.scheduler.step(val["val_loss"])
    seconds = clock.seconds()
    metrics = {
        "train_loss": train_loss,
        **sums.train,
        **val,
        "lr": schedule.optimizer.param_groups[0]["lr"],
        "grad_norm": sums.grad_norm / sums.steps,
        "epoch_seconds": seconds,
        "samples_per_s": sums.seen / seconds,
    }
    if clock.device.type == "cuda":
        metrics["gpu_mem_peak_mb"] = torch.cuda.max_memory_allocated(clock.device) / 2**20
    return metrics


def steps_per_step(scheduler: Any) -> bool:
    """Whether ``scheduler`` steps after every optimizer step (every schedule but a
    ReduceLROnPlateau, which close_epoch steps; None: no schedule)."""
    return scheduler is not None and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
