"""Built-in LR schedules. Each is stepped once per optimizer step, except ``plateau``
(ReduceLROnPlateau), which the trainer steps once per epoch with the validation loss."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from torch.optim import Optimizer, lr_scheduler

from sweeper.plugin import IntRange, LogUniform, Uniform

Positive = Annotated[float, Field(gt=0.0)]
Epochs = Annotated[int, Field(ge=1, le=100_000)]


def none(optimizer: Optimizer, *, epochs: int, steps_per_epoch: int) -> None:
    """Constant learning rate."""
    return None


def onecycle(
    optimizer: Optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    pct_start: Annotated[float, Field(gt=0.0, lt=1.0), Uniform(0.1, 0.5)] = 0.25,  # of the steps rising to the peak
    div_factor: Annotated[Positive, LogUniform(5.0, 100.0)] = 25.0,  # the starting LR is the peak / div_factor
    final_div_factor: Positive = 1e4,
    cycle_momentum: bool = False,
) -> lr_scheduler.OneCycleLR:
    """One-cycle policy (Smith 2018) peaking at the optimizer's configured LR. ``cycle_momentum``
    (torch's default is on) would also cycle the optimizer's momentum (SGD) or beta1 (Adam)
    between 0.85 and 0.95 every step, overriding what the spec fixed or searched: off unless asked."""
    peak = [group["lr"] for group in optimizer.param_groups]
    return lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=peak,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        pct_start=pct_start,
        div_factor=div_factor,
        final_div_factor=final_div_factor,
        cycle_momentum=cycle_momentum,
    )


def cosine(
    optimizer: Optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    warmup_epochs: Annotated[float, Field(ge=0.0, le=100_000), Uniform(0.0, 1.0)] = 0.0,
    min_lr: Annotated[float, Field(ge=0.0)] = 0.0,
) -> lr_scheduler.LRScheduler:
    """Cosine decay to ``min_lr`` over the run, after an optional linear warm-up (epochs)."""
    total = epochs * steps_per_epoch
    warmup = int(warmup_epochs * steps_per_epoch)
    decay = lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total - warmup), eta_min=min_lr)
    if warmup == 0:
        return decay
    ramp = lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, total_iters=warmup)
    return lr_scheduler.SequentialLR(optimizer, [ramp, decay], milestones=[warmup])


def step(
    optimizer: Optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    step_epochs: Annotated[Epochs, IntRange(2, 30)] = 10,
    gamma: Annotated[Positive, LogUniform(0.05, 0.5)] = 0.1,
) -> lr_scheduler.StepLR:
    """Multiply the LR by ``gamma`` every ``step_epochs`` epochs."""
    return lr_scheduler.StepLR(optimizer, step_size=step_epochs * steps_per_epoch, gamma=gamma)


def plateau(
    optimizer: Optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    factor: Annotated[float, Field(gt=0.0, lt=1.0), Uniform(0.1, 0.5)] = 0.1,  # torch refuses 1 and above
    patience: Annotated[int, Field(ge=0, le=100_000), IntRange(1, 5)] = 2,  # epochs
    min_lr: Annotated[float, Field(ge=0.0)] = 0.0,
) -> lr_scheduler.ReduceLROnPlateau:
    """Multiply the LR by ``factor`` when the validation loss stalls for ``patience`` epochs."""
    return lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=factor, patience=patience, min_lr=min_lr)
