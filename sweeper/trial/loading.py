"""The DataLoader path: a trial's batches read from map-style datasets (``DatasetSplits``) through
``torch.utils.data.DataLoader``, keeping the seed contract of the tensor path (trial/batching.py).

- Training order: the trial's own order generator draws one permutation per epoch, exactly as
  the tensor path does (``torch.randperm(n, generator=order)``, last incomplete batch dropped),
  handed to the loader as a batch sampler: the same seed gives the same batches, whatever the
  number of workers, and a DataSplits wrapped into datasets (``data.path: loader``) trains on the
  same batches as on the tensor path.
- Worker seeds: a DataLoader draws its workers' base seed from its ``generator``, or from the
  global torch RNG when it has none, on every new iterator, even with no workers. The global
  RNG is the trial's (dropout, init): each loader therefore gets its own seeded generator (the
  validation loader too: drawing from the global RNG there shifted dropout draws of the next
  epoch), and ``worker_init_fn`` seeds Python's and NumPy's RNGs of each worker from its torch
  seed.

The one module that touches DataLoader internals (shutting persistent workers down at the end of
a trial instead of at garbage collection).
"""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.spec import DataSpec
from sweeper.trial.ddp import Ranks

# Offsets from the trial seed of the loaders' own generators (the trainer uses seed for the
# batch order and seed + 1 for augmentation): never reuse one, recorded runs would change.
TRAIN_WORKERS_SEED = 2
VAL_WORKERS_SEED = 3


@dataclass(frozen=True)
class Batch:
    """One batch from a loader, on the training device: samples as collated (before
    ``input_transform``), targets, and the padding mask (N, L) of variable-length sequences."""

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.y)

    def split(self, parts: int) -> list[Batch]:
        """``parts`` micro-batches (gradient accumulation), as ``Tensor.tensor_split`` cuts them."""
        xs, ys = self.x.tensor_split(parts), self.y.tensor_split(parts)
        masks = self.mask.tensor_split(parts) if self.mask is not None else [None] * len(xs)
        return [Batch(x, y, m) for x, y, m in zip(xs, ys, masks)]


def forward(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The model's outputs; the mask goes in only when there is one (models without it take x alone)."""
    return model(x) if mask is None else model(x, mask=mask)


def as_batch(collated: Any, device: torch.device, non_blocking: bool = False) -> Batch:
    """A collated ``(x, y)`` or ``(x, y, mask)`` on ``device``."""
    parts = tuple(collated)
    if len(parts) not in (2, 3):
        raise ValueError(f"a collated batch must be (x, y) or (x, y, mask); got {len(parts)} parts")
    x, y, *rest = (t.to(device, non_blocking=non_blocking) for t in parts)
    return Batch(x, y, rest[0] if rest else None)


def first_batch(data: DataSplits | DatasetSplits, split: str, n: int) -> Batch:
    """The first ``n`` samples of ``split`` as a batch on the CPU (before ``input_transform``):
    the dry build's step, an example input."""
    if isinstance(data, DataSplits):
        return Batch(getattr(data, f"{split}_x")[:n], getattr(data, f"{split}_y")[:n])
    return as_batch(data.collate(split, range(min(n, len(getattr(data, f"{split}_y"))))), torch.device("cpu"))


def as_datasets(data: DataSplits) -> DatasetSplits:
    """Whole-tensor splits as datasets (``data.path: loader``), on the CPU: the same samples and
    targets, and the same input_transform, read through a DataLoader. A train_transform (a batch
    augmentation on the device) has no place there: loader_refusal says so first."""
    train_x, train_y, val_x, val_y = (t.cpu() for t in (data.train_x, data.train_y, data.val_x, data.val_y))
    return DatasetSplits(
        train=TensorDataset(train_x, train_y),
        val=TensorDataset(val_x, val_y),
        train_y=train_y,
        val_y=val_y,
        sample_shape=data.input_shape,
        num_classes=data.num_classes,
        class_names=data.class_names,
        input_transform=data.input_transform,
        normalization=data.normalization,
        features=data.features,
    )


def loader_refusal(data: DataSplits | DatasetSplits, path: str) -> str | None:
    """Why ``data`` cannot train on the path ``data.path`` asks for, or None."""
    if path == "loader" and isinstance(data, DataSplits) and data.train_transform is not None:
        return (
            "data.path: loader, but the data set has a train_transform (a batch augmentation of the "
            "whole-tensor path, run on the device) that a DataLoader cannot apply; set data.path: auto, "
            "or return DatasetSplits whose datasets augment each sample"
        )
    return None


def for_path(data: DataSplits | DatasetSplits, path: str) -> DataSplits | DatasetSplits:
    """The splits as the trials read them: DataSplits as they are on ``auto``, wrapped into
    datasets on ``loader``; DatasetSplits always through a loader."""
    refusal = loader_refusal(data, path)
    if refusal is not None:
        raise ValueError(refusal)
    return as_datasets(data) if path == "loader" and isinstance(data, DataSplits) else data


def path_name(data: DataSplits | DatasetSplits) -> str:
    """The data path the splits train on, in words (`validate --estimate`, a trial's info)."""
    return "tensors (whole splits on the device)" if isinstance(data, DataSplits) else "DataLoader"


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader options of a trial, resolved from the spec's ``data`` section."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False

    @classmethod
    def resolve(cls, spec: DataSpec, device: torch.device, threads: int | None = None) -> LoaderSettings:
        """``spec``'s options with its defaults filled in for a trial on ``device`` with ``threads``
        torch threads (default: this process's). DataLoader refuses persistent workers and a
        prefetch factor without workers: both are dropped then."""
        workers = spec.num_workers
        if workers is None:
            half = (threads if threads is not None else torch.get_num_threads()) // 2
            workers = 0 if half <= 1 or multiprocessing.current_process().daemon else half
        pin = spec.pin_memory if spec.pin_memory is not None else device.type == "cuda"
        return cls(
            num_workers=workers,
            prefetch_factor=spec.prefetch_factor if workers else None,
            persistent_workers=spec.persistent_workers and workers > 0,
            pin_memory=pin and device.type == "cuda",
        )

    def describe(self) -> str:
        workers = f"{self.num_workers} worker(s)" if self.num_workers else "no workers (in the trial's process)"
        return f"DataLoader, {workers}" + (", pinned memory" if self.pin_memory else "")


class EpochOrder(Sampler[list[int]]):
    """Batches of indices for one epoch per iteration: a permutation drawn from ``generator`` (the
    trial's order generator, on the CPU), cut into full batches, as trial/batching.py cuts it."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator, ranks: Ranks | None = None) -> None:
        self.n, self.batch_size, self.generator, self.ranks = n, batch_size, generator, ranks

    def __len__(self) -> int:
        return self.n // self.batch_size  # the last incomplete batch is dropped (BatchNorm-safe)

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.n, generator=self.generator)
        for step in range(len(self)):
            batch = order[step * self.batch_size : (step + 1) * self.batch_size]
            # a DDP rank reads its share of the global batch (trial/ddp.py)
            yield (batch if self.ranks is None else self.ranks.shard(batch)).tolist()


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: Python's and NumPy's RNGs of a worker from its torch seed (the loader's
    base seed + worker_id), so random per-sample work is reproducible (torch's own is seeded already)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class TrialLoaders:
    """A trial's training and validation loaders over ``data``. ``order``: the trial's batch-order
    generator (drawn once per epoch, as on the tensor path); ``seed``: the trial seed, from which
    each loader's own worker-seed generator is made."""

    def __init__(
        self,
        data: DatasetSplits,
        settings: LoaderSettings,
        *,
        batch_size: int,
        eval_batch_size: int,
        order: torch.Generator,
        seed: int,
        device: torch.device,
        ranks: Ranks | None = None,
    ) -> None:
        self.data, self.settings, self.device = data, settings, device
        # the train loader's worker seeds: part of the training state (checkpoints save it)
        self.worker_gen = torch.Generator().manual_seed(seed + TRAIN_WORKERS_SEED)
        self.val_worker_gen = torch.Generator().manual_seed(seed + VAL_WORKERS_SEED)
        options: dict[str, Any] = {
            "collate_fn": data.collate_fn,
            "num_workers": settings.num_workers,
            "pin_memory": settings.pin_memory,
            "persistent_workers": settings.persistent_workers,
            "worker_init_fn": seed_worker if settings.num_workers else None,
        }
        if settings.prefetch_factor is not None:
            options["prefetch_factor"] = settings.prefetch_factor
        self.train = DataLoader(
            data.train,
            batch_sampler=EpochOrder(len(data.train_y), batch_size, order, ranks),
            generator=self.worker_gen,
            **options,
        )
        self.val = DataLoader(
            data.val, batch_size=eval_batch_size, shuffle=False, generator=self.val_worker_gen, **options
        )

    def train_epoch(self) -> Iterator[Batch]:
        """One epoch of training batches on the device, in the order generator's order."""
        yield from self._read(self.train)

    def val_batches(self) -> Iterator[Batch]:
        yield from self._read(self.val)

    def _read(self, loader: DataLoader) -> Iterator[Batch]:
        iterator = iter(loader)
        try:
            for collated in iterator:
                yield as_batch(collated, self.device, self.settings.pin_memory)
        except BaseException:  # the trial stopped mid-epoch (timed out, failed): its workers are
            # killed now; a worker hung in a read would hold the loader's shutdown 5 s, at garbage collection
            for worker in getattr(iterator, "_workers", []):
                worker.terminate()
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            raise

    def close(self) -> None:
        """Stop persistent workers now (they would otherwise live until garbage collection)."""
        for loader in (self.train, self.val):
            iterator = getattr(loader, "_iterator", None)  # DataLoader keeps a persistent one here
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            loader._iterator = None
