"""How an epoch ends, the same for a trial trained alone (trainer.py) and for each member of a
fused model (fused.py): the clock and the device's peak memory, the non-finite guard, the
schedule stepped on the validation loss, and the metrics a trial reports (its history, the
pruner's input, MLflow's per-epoch metrics). Pure PyTorch: no optuna, mlflow or ray here."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

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
