"""torchvision's classification data sets by name (``MNIST``, ``FashionMNIST``, ``KMNIST``,
``CIFAR10``, ``CIFAR100``, ``SVHN``, ``STL10``, ``USPS``, ...): the ``torchvision`` data set.

The training split of the named data set, read by torchvision from its own layout under
``root`` (``download: true`` fetches it first, as the ``cifar10`` plugin does; without it, or
offline, missing files stop the sweep before the first trial with where they go), is held whole
on the device as uint8 pixels (N, C, H, W) and cut into train/val by the sweep's seed; batches
are normalised there with the training images' per-channel mean and std (recorded in export.json
as ``normalization``). Data sets too large to hold in memory (ImageNet) are not for this plugin:
``image_folder`` reads them through a DataLoader.
"""

from __future__ import annotations

import difflib
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sweeper.plugin import DATA_KIND_ATTR, DataSplits, Normalize
from sweeper_plugins.cifar import NETWORK_TIMEOUT, random_crop_flip
from sweeper_plugins.datasets import Fraction, split_indices

# How a data set's constructor asks for its training split, where it is not train=True.
TRAINING_SPLIT: dict[str, dict[str, Any]] = {
    "SVHN": {"split": "train"},
    "STL10": {"split": "train"},
    "QMNIST": {"what": "train"},
    "EMNIST": {"split": "balanced", "train": True},
    "EuroSAT": {},  # 64 x 64 satellite images, one split: held out by the seed
}
# How a data set's constructor asks for its test split, where it is not train=False (None: it has none).
TEST_SPLIT: dict[str, dict[str, Any] | None] = {
    "SVHN": {"split": "test"},
    "STL10": {"split": "test"},
    "QMNIST": {"what": "test"},
    "EMNIST": {"split": "balanced", "train": False},
    "EuroSAT": None,
}
# Data sets of same-sized images this plugin reads (the ones an unknown name's error suggests).
KNOWN = (
    "MNIST",
    "FashionMNIST",
    "KMNIST",
    "QMNIST",
    "EMNIST",
    "CIFAR10",
    "CIFAR100",
    "SVHN",
    "STL10",
    "USPS",
    "EuroSAT",
)


def _where_files_go(name: str, root: Path) -> str:
    from torchvision import datasets

    mnist_family = issubclass(getattr(datasets, name), datasets.MNIST)  # idx files in root/<name>/raw
    layout = f", the idx files in {root.absolute() / name / 'raw'}" if mnist_family else ""
    return (
        f"torchvision reads {name} from {root.absolute()} (dataset.args.root) in its own layout{layout}. "
        f"dataset.args.download: true fetches it (needs internet); false reads only what is on disk."
    )


def _open(name: str, root: Path, download: bool) -> Any:
    """torchvision's data set ``name`` (its training split) under ``root``."""
    from torchvision import datasets

    if not isinstance(getattr(datasets, name, None), type):
        close = difflib.get_close_matches(name, KNOWN, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(
            f"dataset.args.name: torchvision has no data set '{name}'{hint}; for example: {', '.join(KNOWN)}"
        )
    split = TRAINING_SPLIT.get(name, {"train": True})
    if not download:
        try:
            return getattr(datasets, name)(str(root), download=False, **split)
        except (RuntimeError, FileNotFoundError) as exc:  # torchvision: "Dataset not found ... download=True"
            # (torchvision's own message tells of its download=True: the spec's argument is the one to name)
            raise FileNotFoundError(f"{name} is not on disk. {_where_files_go(name, root)}") from exc
        except TypeError as exc:  # a constructor without train=...: not a data set this plugin reads
            raise ValueError(
                f"dataset.args.name: torchvision's {name} has no training split this plugin can ask for ({exc}); "
                f"it reads: {', '.join(KNOWN)}"
            ) from None
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(NETWORK_TIMEOUT)  # urllib's connects and reads fail fast offline
    try:
        return getattr(datasets, name)(str(root), download=True, **split)
    except (OSError, RuntimeError) as exc:  # URLError, DNS failure, timeout; RuntimeError: every mirror failed
        message = " ".join(str(exc).split())[:300]
        raise ConnectionError(
            f"{name} is not on disk and downloading it failed: {type(exc).__name__}: {message}. "
            f"{_where_files_go(name, root)}"
        ) from exc
    finally:
        socket.setdefaulttimeout(previous)


def _open_test(name: str, root: Path) -> Any | None:
    """torchvision's test split of ``name`` under ``root`` when it is on disk (``_open`` fetched
    it with the training split where ``download`` is true), else None."""
    from torchvision import datasets

    split = TEST_SPLIT.get(name, {"train": False})
    if split is None:
        return None
    try:
        return getattr(datasets, name)(str(root), download=False, **split)
    except (RuntimeError, FileNotFoundError, TypeError):  # not on disk, or no such split
        return None


def _pixels_and_labels(dataset: Any, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """uint8 pixels (N, C, H, W) and int64 labels of a torchvision data set, the first ``limit``."""
    if hasattr(dataset, "data") and isinstance(dataset.data, np.ndarray | torch.Tensor):
        pixels = np.asarray(dataset.data[:limit])
        targets = getattr(dataset, "targets", None)
        labels = np.asarray(targets if targets is not None else dataset.labels)[:limit]
    else:  # image by image (PIL images): every image must have the same size
        n = len(dataset) if limit is None else min(limit, len(dataset))
        items = [dataset[i] for i in range(n)]
        sizes = {np.asarray(image).shape for image, _ in items}
        if len(sizes) > 1:
            raise ValueError(f"its images differ in size ({sorted(sizes)[:3]}...): image_folder resizes them")
        pixels = np.stack([np.asarray(image) for image, _ in items])
        labels = np.asarray([label for _, label in items])
    if pixels.ndim == 3:  # (N, H, W): one channel
        pixels = pixels[:, None]
    elif pixels.shape[-1] in (1, 3) and pixels.shape[1] not in (1, 3):  # (N, H, W, C), as CIFAR's
        pixels = pixels.transpose(0, 3, 1, 2)
    if pixels.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {pixels.dtype}")
    return np.ascontiguousarray(pixels), labels.astype(np.int64)


def torchvision_dataset(
    *,
    name: str = "MNIST",
    root: str = "data/torchvision",
    download: bool = False,
    val_fraction: Fraction = 0.1,
    augment: bool = False,
    limit: int | None = None,
    seed: int = 0,
) -> DataSplits:
    """torchvision's classification data set ``name`` (its training split, the first ``limit``
    images), split into train/val by ``seed``; its test split (the first ``limit`` images), where
    it is on disk, is the held-out test split. ``download: true`` fetches it into ``root``
    (needs internet). ``augment``: CIFAR's random crop (4-pixel padding) and horizontal flip
    (not for digits: a flipped digit is another shape)."""
    dataset = _open(name, Path(root), download)
    pixels, labels = _pixels_and_labels(dataset, limit)
    x = torch.from_numpy(pixels)
    y = torch.from_numpy(labels)
    classes = getattr(dataset, "classes", None)
    num_classes = len(classes) if classes else int(y.max()) + 1
    train, val = split_indices(len(y), val_fraction, seed)
    stats = x[train].double() / 255.0
    mean = stats.mean((0, 2, 3))
    std = stats.std((0, 2, 3)).clamp(min=1e-6)
    normalize = Normalize(1 / 255.0, tuple(mean.tolist()), tuple(std.tolist()))
    test = _open_test(name, Path(root))
    test_x, test_y = (
        (torch.from_numpy(a) for a in _pixels_and_labels(test, limit)) if test is not None else (None, None)
    )
    return DataSplits(
        train_x=x[train],
        train_y=y[train],
        val_x=x[val],
        val_y=y[val],
        test_x=test_x,
        test_y=test_y,
        num_classes=num_classes,
        class_names=tuple(str(c) for c in classes) if classes else None,
        train_transform=random_crop_flip if augment else None,
        input_transform=normalize,
        normalization=normalize.as_dict(),
    )


setattr(torchvision_dataset, DATA_KIND_ATTR, "image")
