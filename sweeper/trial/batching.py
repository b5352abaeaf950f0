"""Index batching over whole-tensor splits held on the training device."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from sweeper.plugin import DatasetSplits, DataSplits


def steps_per_epoch(data: DataSplits | DatasetSplits, batch_size: int) -> int:
    """Optimizer steps of an epoch, on either data path (trial/loading.py cuts batches alike)."""
    n = len(data.train_y)
    steps = n // batch_size  # the last incomplete batch is dropped (BatchNorm-safe)
    if steps == 0:
        raise ValueError(f"train.batch_size ({batch_size}) is larger than the training split ({n} samples)")
    return steps


def train_batches(data: DataSplits, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Shuffled index batches for one epoch; ``generator`` (CPU) fixes the order."""
    n = data.train_x.shape[0]
    order = torch.randperm(n, generator=generator).to(data.train_x.device, non_blocking=True)
    for step in range(steps_per_epoch(data, batch_size)):
        yield order[step * batch_size : (step + 1) * batch_size]


def eval_batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))
