"""CIFAR-10 from its standard on-disk format (``cifar-10-batches-py`` under ``root``).

The whole training set is held as one tensor (50,000 x 3 x 32 x 32 float32 = 614 MB) and
augmented per batch on the training device: no DataLoader, no per-image Python work.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sweeper.plugin import DataSplits
from sweeper_plugins.datasets import split_indices

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
# Per-channel statistics of the CIFAR-10 training set (0..1 pixel scale).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4  # pixels of zero padding for the random crop


def _read_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    # The official format is a pickle; only read files you downloaded or made yourself.
    with path.open("rb") as f:
        batch = pickle.load(f, encoding="latin1")  # noqa: S301
    return np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32), list(batch["labels"])


def _class_names(folder: Path) -> tuple[str, ...] | None:
    meta = folder / "batches.meta"
    if not meta.exists():
        return None
    with meta.open("rb") as f:
        return tuple(pickle.load(f, encoding="latin1")["label_names"])  # noqa: S301


def random_crop_flip(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard CIFAR augmentation for a whole batch at once: random 32x32 crop from the
    image zero-padded by PAD pixels, then a horizontal flip with probability 1/2."""
    n, _, h, w = batch.shape
    padded = F.pad(batch, (PAD, PAD, PAD, PAD))
    dev = batch.device
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=dev)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=dev)
    rows = (dy[:, None] + torch.arange(h, device=dev))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=dev))[:, None, None, :]
    crops = padded[torch.arange(n, device=dev)[:, None, None, None], torch.arange(batch.shape[1], device=dev)
                   [None, :, None, None], rows, cols]
    flip = torch.rand(n, generator=generator, device=dev) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(-1), crops)


def cifar10(*, root: str = "data/cifar10", download: bool = False, val_fraction: float = 0.1,
            augment: bool = True, limit: int | None = None, seed: int = 0) -> DataSplits:
    """CIFAR-10's 50,000 training images split into train/val by ``seed``; ``limit`` keeps only
    the first N images (quick tries). ``download: true`` fetches the archive (needs internet)."""
    folder = Path(root) / FOLDER
    if not all((folder / name).exists() for name in TRAIN_FILES):
        if not download:
            raise FileNotFoundError(
                f"CIFAR-10 not found: expected {', '.join(TRAIN_FILES)} in {folder}. Set "
                f"dataset.args.download: true (needs internet) or put the 'python version' files there.")
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(URL, download_root=root, md5=MD5)
    parts = [_read_batch(folder / name) for name in TRAIN_FILES]
    images = np.concatenate([p[0] for p in parts])[:limit]
    labels = torch.tensor([label for p in parts for label in p[1]][:limit], dtype=torch.int64)
    x = torch.from_numpy(images).float().div_(255.0)
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    train, val = split_indices(len(labels), val_fraction, seed)
    return DataSplits(train_x=x[train], train_y=labels[train], val_x=x[val], val_y=labels[val],
                      num_classes=10, class_names=_class_names(folder),
                      train_transform=random_crop_flip if augment else None,
                      normalization={"scale": 1 / 255.0, "mean": list(MEAN), "std": list(STD)})
