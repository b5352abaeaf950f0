"""One trial's ranks as the trainer sees them from inside one of its processes (train.devices > 1;
trial/launch.py starts the processes): the model wrapped in DistributedDataParallel, each global
batch cut into the ranks' shares, the epoch's sums reduced, rank 0's answers shared.

Sharding: every rank draws the same global permutation from the trial's order generator and
takes its contiguous share of each global batch (the batches trial/batching.py and
trial/loading.py cut for one device). Unlike a DistributedSampler (which deals the epoch's
samples round-robin, so ranks see other batches than one device would), the optimizer step of
every rank count sees the same global batch: N ranks train as 1 device with the same batch does,
up to float rounding and per-rank dropout, and a checkpoint written by N ranks resumes on M (the
generators' states are global). Gradients are averaged by DDP: each rank's loss is the mean over
its equal share, so their average is the global batch's mean.

Rank 0 evaluates the validation split alone with the plain module (the weights are the same on
every rank; evaluation is exact, as on one device) and shares the metrics; ``train_loss`` is
summed over every rank's samples, the task's other training metrics are the ranks' mean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from sweeper.trial.seeding import derive


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trial's ranks; the process group is initialised."""

    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Rank 0: it evaluates, saves the checkpoints and talks to the search."""
        return self.rank == 0

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a global batch of indices (the batch divides evenly:
        train.batch_size is a multiple of train.devices, and incomplete batches are dropped)."""
        share = len(batch) // self.world
        return batch[self.rank * share : (self.rank + 1) * share]

    def wrap(self, model: nn.Module, sync_batchnorm: bool) -> nn.Module:
        """``model`` under DDP (its BatchNorm layers synchronised first when asked); DDP broadcasts
        rank 0's parameters and buffers, so every rank starts from the same weights."""
        if sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over every rank (each gets the total)."""
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def mean(self, metrics: dict[str, float]) -> dict[str, float]:
        """Each metric's mean over the ranks (their shares are equal: exact for a metric that is
        a mean over samples, as accuracy is; close for the others, RMSE or F1)."""
        names = sorted(metrics)
        values = self.sum(torch.tensor([metrics[k] for k in names], dtype=torch.float64, device=self.device))
        return {k: float(v) / self.world for k, v in zip(names, values.tolist(), strict=True)}

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (picklable)."""
        box = [value if self.main else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def reseed(self, seed: int, epoch: int) -> None:
        """Ranks other than 0 draw their own random numbers (dropout) each epoch, from the trial's
        seed; rank 0 keeps the stream one device would use (and its checkpoint holds)."""
        if not self.main:
            torch.manual_seed(derive(seed, "rank", self.rank * 2**20 + epoch))


def no_sync(net: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """DDP reduces the gradients on the backward of the step's last micro-batch only (the
    accumulated ones: one all-reduce per optimizer step, not per micro-batch)."""
    if isinstance(net, DistributedDataParallel) and not last:
        return net.no_sync()
    return contextlib.nullcontext()


def marked_last(items: list[Any]) -> Iterator[tuple[Any, bool]]:
    """Each item with True for the last."""
    for i, item in enumerate(items):
        yield item, i == len(items) - 1
