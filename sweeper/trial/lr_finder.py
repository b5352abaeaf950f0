"""Learning-rate range test (Smith 2017): raise the LR exponentially over a bounded number of
steps, smooth the loss, stop when it diverges, suggest the LR of steepest descent, capped at a
tenth of the LR where the loss was lowest.

Why the cap: the test also trains, so the loss keeps falling until just before divergence and
the steepest point often sits next to the minimum, at the edge of what trains, while "minimum /
10" landed inside the span of good LRs in every curve measured.
Why the smoothing follows the step count: with 100 steps over 6 decades, an average over the
last ~50 steps (0.98, the usual value for long tests) lags the raw loss and moves every
suggestion up by that lag.
The figures for both: docs/lr-finder.md#how-the-method-was-fixed.

The model, optimizer and every RNG are restored afterwards: the trial that follows is the
same as if the test never ran.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sweeper.plugin import DatasetSplits, DataSplits, FittedTask
from sweeper.spec import TrainSpec
from sweeper.trial.batching import train_batches
from sweeper.trial.checkpoint import rng_state, set_rng_state
from sweeper.trial.loading import Batch, LoaderSettings, TrialLoaders
from sweeper.trial.trainer import Stepper

MAX_SMOOTHING = 0.98  # weight of the running average of the loss (bias-corrected), long tests
SMOOTHING_WINDOW = 0.1  # otherwise average over ~10% of the test's steps (0.9 at 100 steps)
MIN_LOSS_DIVISOR = 10.0  # the suggestion is at most (LR of the lowest loss) / this
DIVERGE = 4.0  # stop once the smoothed loss exceeds this multiple of its best value
MIN_DROP = 0.05  # a curve whose loss never falls 5% below its start gives no signal


@dataclass(frozen=True)
class RangeTest:
    lrs: list[float]
    losses: list[float]  # smoothed, bias-corrected
    suggestion: float | None  # None: the curve gives no reliable signal
    steps: int  # optimizer steps taken (the cost)
    seconds: float
    stopped: str  # why it ended: "max_lr" | "diverged" | "non-finite"
    steepest: float | None = None  # LR of steepest descent (before the cap)
    min_loss_lr: float | None = None  # LR of the lowest smoothed loss

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def range_test(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: DataSplits | DatasetSplits,
    train: TrainSpec,
    *,
    min_lr: float,
    max_lr: float,
    steps: int = 100,
    seed: int = 0,
    task: FittedTask | None = None,
) -> RangeTest:
    """Run the test with the trial's own loop (accumulation, AMP, clipping) and the task's loss
    (default: classification), then restore state."""
    saved = _snapshot(model, optimizer)
    start = time.perf_counter()
    stepper = Stepper(model, optimizer, data, train, seed, task)
    order = torch.Generator().manual_seed(seed)
    lrs: list[float] = []
    losses: list[float] = []
    avg, best, stopped = 0.0, math.inf, "max_lr"
    beta = smoothing(steps)
    try:
        model.train()
        batches = _forever(data, train.batch_size, order)
        for i in range(steps):
            lr = min_lr * (max_lr / min_lr) ** (i / max(1, steps - 1))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum, _ = stepper.step(next(batches))
            loss = loss_sum.item() / train.batch_size
            if not math.isfinite(loss):
                stopped = "non-finite"
                break
            avg = beta * avg + (1 - beta) * loss
            smoothed = avg / (1 - beta ** (i + 1))
            lrs.append(lr)
            losses.append(smoothed)
            best = min(best, smoothed)
            if smoothed > DIVERGE * best:
                stopped = "diverged"
                break
    finally:
        _restore(model, optimizer, saved)
    elapsed = time.perf_counter() - start
    steep = steepest(lrs, losses)
    lowest = float(lrs[int(np.argmin(losses))]) if losses else None
    return RangeTest(lrs, losses, _capped(steep, lowest), len(lrs), elapsed, stopped, steep, lowest)


def smoothing(steps: int) -> float:
    """The running average's weight: a window of ~10% of the steps, 0.98 at most."""
    return min(MAX_SMOOTHING, 1 - 1 / max(2.0, SMOOTHING_WINDOW * steps))


def steepest(lrs: list[float], losses: list[float]) -> float | None:
    """The LR where the smoothed loss falls fastest per decade of LR, skipping the first and
    last points (warm-up noise, divergence); None without a clear descent."""
    if len(losses) < 10:
        return None
    loss = np.asarray(losses)
    if loss.min() > (1 - MIN_DROP) * loss[0]:
        return None
    slope = np.gradient(loss, np.log10(lrs))
    skip_start, skip_end = max(1, len(loss) // 10), max(1, len(loss) // 20)
    window = slope[skip_start : len(loss) - skip_end]
    i = int(np.argmin(window))
    return float(lrs[skip_start + i]) if window[i] < 0 else None


def suggest(lrs: list[float], losses: list[float]) -> float | None:
    """The steepest descent, capped at a tenth of the LR of the lowest loss (see the module
    docstring for why); None without a clear descent."""
    return _capped(steepest(lrs, losses), float(lrs[int(np.argmin(losses))]) if losses else None)


def _capped(steep: float | None, lowest: float | None) -> float | None:
    return None if steep is None or lowest is None else min(steep, lowest / MIN_LOSS_DIVISOR)


def plot(result: RangeTest, path: Path, title: str = "") -> Path:
    """lr (log scale) vs smoothed loss, the suggestion marked; a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(result.lrs, result.losses)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss (smoothed)")
    if result.min_loss_lr is not None:
        ax.axvline(result.min_loss_lr, color="grey", linestyle=":", label=f"lowest loss {result.min_loss_lr:.3g}")
    if result.steepest is not None and result.steepest != result.suggestion:
        ax.axvline(result.steepest, color="orange", linestyle=":", label=f"steepest {result.steepest:.3g}")
    if result.suggestion is not None:
        ax.axvline(result.suggestion, color="red", linestyle="--", label=f"suggestion {result.suggestion:.3g}")
    if result.min_loss_lr is not None or result.suggestion is not None:
        ax.legend()
    ax.set_title(title or f"LR range test ({result.steps} steps, stopped: {result.stopped})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _forever(
    data: DataSplits | DatasetSplits, batch_size: int, generator: torch.Generator
) -> Iterator[torch.Tensor | Batch]:
    """Training batches, epoch after epoch (DatasetSplits: read in this process, no workers)."""
    if isinstance(data, DataSplits):
        while True:
            yield from train_batches(data, batch_size, generator)
    loaders = TrialLoaders(
        data,
        LoaderSettings(),
        batch_size=batch_size,
        eval_batch_size=batch_size,
        order=generator,
        seed=0,
        device=data.train_y.device,
    )
    while True:
        yield from loaders.train_epoch()


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "training": model.training,
        "rng": rng_state(),
    }


def _restore(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    optimizer.zero_grad(set_to_none=True)
    model.train(saved["training"])
    set_rng_state(saved["rng"])
