"""Images in class folders: ``root/<class>/*.png|jpg|...``, or ``root/train/<class>/`` and
``root/val/<class>/`` when the split is given on disk; ``root/test/<class>/`` beside
``root/train/`` is the held-out test split (read once, after the sweep).

Every image is decoded (Pillow) and resized once, to ``size`` x ``size`` pixels (the shorter side
scaled to ``size``, the centre cropped), into one uint8 array (N, C, size, size) cached on disk as
a ``.npy`` file. The cache's name is a hash of the files' names, byte sizes and modification
times and of the arguments that shape the pixels (size, grayscale): adding, replacing or touching
an image makes a new cache, and a sweep's trials (each process calls the factory) only read it.

Small enough (``max_memory_mb``, the uint8 bytes of all images), the images are held on the
device as whole tensors (the fast path, as ``cifar10``: augmented and normalised per batch
there); larger, they are read from the memory-mapped cache through a DataLoader
(``DatasetSplits``), one batch at a time, normalised on the device. The per-channel mean and std
come from the training images and are exported as ``normalization``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from pydantic import Field
from torch.utils.data import Dataset

from sweeper.plugin import DATA_KIND_ATTR, DatasetSplits, DataSplits, Normalize
from sweeper_plugins.cifar import random_crop_flip
from sweeper_plugins.datasets import Fraction, split_indices

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
CACHE_FORMAT = 1  # bump when the cached pixels change meaning: old caches are then ignored
Size = Annotated[int, Field(ge=4, le=4_096)]  # pixels per side of the resized images
Megabytes = Annotated[float, Field(ge=0.0, le=1e7)]


def _class_files(folder: Path) -> dict[str, list[Path]]:
    """Image files per class sub-folder of ``folder``, sorted (class names sorted too)."""
    found = {}
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = sorted(p for p in sub.rglob("*") if p.suffix.lower() in EXTENSIONS and p.is_file())
        if images:
            found[sub.name] = images
    return found


def list_images(root: Path) -> tuple[tuple[str, ...], list[Path], list[int], int | None, int]:
    """(class names, files, their class indices, how many of the files are training files when
    ``root`` has train/ and val/ folders (else None: the seed cuts validation from them), how many
    are test files). The files come in that order: training, validation, then the ``test/``
    folder's (beside ``train/``), the held-out test split."""
    if not root.is_dir():
        raise FileNotFoundError(f"dataset.args.root: no folder {root.absolute()} (expected root/<class>/*.png)")
    split = (root / "train").is_dir() and (root / "val").is_dir()
    top = (
        root / "train" if (root / "train").is_dir() and ((root / "val").is_dir() or (root / "test").is_dir()) else root
    )
    train = _class_files(top)
    if len(train) < 2:
        raise ValueError(
            f"{top}: {len(train)} class folder(s) with images ({', '.join(EXTENSIONS)}); a classifier needs at least 2"
        )
    classes = tuple(train)
    files = [f for name in classes for f in train[name]]
    labels = [i for i, name in enumerate(classes) for _ in train[name]]
    n_train, n_test = None, 0
    for part in ("val", "test") if top != root else ():
        found = _class_files(root / part) if (root / part).is_dir() else {}
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise ValueError(f"{root / part}: class folder(s) {unknown} are not in {top}")
        if part == "val" and split:
            if not found:
                raise ValueError(f"{root / 'val'}: no images in class folders")
            n_train = len(files)
        files += [f for name in found for f in found[name]]
        labels += [classes.index(name) for name in found for _ in found[name]]
        n_test = sum(len(images) for images in found.values()) if part == "test" else 0
    return classes, files, labels, n_train, n_test


def cache_path(root: Path, cache: Path, files: list[Path], size: int, grayscale: bool) -> Path:
    """The cache file for these files at this size: named by a hash of what it holds."""
    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "size": size, "grayscale": grayscale}).encode())
    for f in files:
        stat = f.stat()
        h.update(f"{f.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return cache / f"images-{size}px-{'l' if grayscale else 'rgb'}-{h.hexdigest()[:16]}.npy"


def _decode(path: Path, size: int, grayscale: bool) -> np.ndarray:
    """One image as uint8 (C, size, size): the shorter side scaled to ``size``, the centre cropped."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        pixels = ImageOps.fit(image.convert("L" if grayscale else "RGB"), (size, size), Image.Resampling.BILINEAR)
        array = np.asarray(pixels, dtype=np.uint8)
    return array[None] if grayscale else array.transpose(2, 0, 1)


def cached_pixels(root: Path, cache: Path, files: list[Path], size: int, grayscale: bool) -> Path:
    """The cache file of all images, a uint8 array (N, C, size, size), decoded into it once."""
    path = cache_path(root, cache, files, size, grayscale)
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = Path(f"{path}.{os.getpid()}.tmp")
        shape = (len(files), 1 if grayscale else 3, size, size)
        try:
            pixels = np.lib.format.open_memmap(partial, mode="w+", dtype=np.uint8, shape=shape)
            for i, f in enumerate(files):
                try:
                    pixels[i] = _decode(f, size, grayscale)
                except OSError as exc:  # Pillow's UnidentifiedImageError is one
                    raise ValueError(f"{f}: not an image Pillow can read ({exc})") from None
            pixels.flush()
            del pixels
            os.replace(partial, path)  # atomic: a parallel reader sees all or nothing
        finally:
            partial.unlink(missing_ok=True)
    return path


class CachedImages(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Items ``(uint8 (C, H, W), int64 label)`` read from the cache file at ``indices``, memory-mapped
    on first use in each process (a loader worker opens its own map; pickling one would copy the
    pixels). ``flip``: a horizontal flip with probability 1/2 (torch's RNG: seeded in each worker)."""

    def __init__(self, path: Path, indices: torch.Tensor, labels: torch.Tensor, flip: bool) -> None:
        self.path, self.indices, self.labels, self.flip = path, indices.tolist(), labels, flip
        self._pixels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_pixels": None}

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pixels is None:
            self._pixels = np.load(self.path, mmap_mode="r")
        image = torch.from_numpy(np.array(self._pixels[self.indices[i]]))  # a copy out of the memory map
        if self.flip and bool(torch.rand(()) < 0.5):
            image = image.flip(-1)
        return image, self.labels[i]


def image_folder(
    *,
    root: str = "data/images",
    size: Size = 64,
    grayscale: bool = False,
    val_fraction: Fraction = 0.2,
    augment: bool = True,
    max_memory_mb: Megabytes = 2_048.0,
    cache: str | None = None,
    seed: int = 0,
) -> DataSplits | DatasetSplits:
    """Class-folder images resized to ``size`` x ``size`` (``grayscale``: one channel, else RGB),
    split into train/val by the ``train/`` and ``val/`` folders when ``root`` has them, else by
    ``seed``; a ``test/`` folder beside ``train/`` is the held-out test split. ``augment``: random
    crops (4-pixel padding) and flips on the device, or flips on the DataLoader path. Held on the
    device while all images take at most ``max_memory_mb`` MiB as uint8, read through a DataLoader
    beyond. ``cache``: where the decoded images go (default: ``root/.sweeper-cache``)."""
    folder = Path(root)
    classes, files, labels, n_train, n_test = list_images(folder)
    path = cached_pixels(folder, Path(cache) if cache else folder / ".sweeper-cache", files, size, grayscale)
    pixels = np.load(path, mmap_mode="r")
    y = torch.tensor(labels, dtype=torch.int64)
    labelled = len(files) - n_test  # the training and validation files; the test folder's last
    if n_train is None:
        train, val = split_indices(labelled, val_fraction, seed)
    else:
        train, val = torch.arange(n_train), torch.arange(n_train, labelled)
    test = torch.arange(labelled, len(files)) if n_test else None
    # per-channel statistics of the training images, read in chunks (the cache may not fit in memory)
    total, squares = np.zeros(pixels.shape[1]), np.zeros(pixels.shape[1])
    order = np.sort(train.numpy())
    for start in range(0, len(order), 1_024):
        chunk = pixels[order[start : start + 1_024]].astype(np.float64) / 255.0
        total += chunk.sum((0, 2, 3))
        squares += (chunk**2).sum((0, 2, 3))
    count = len(order) * size * size
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    normalize = Normalize(1 / 255.0, tuple(mean.tolist()), tuple(float(s) if s > 0 else 1.0 for s in std))
    if pixels.nbytes <= max_memory_mb * 2**20:
        x = torch.from_numpy(np.array(pixels))  # read whole: uint8 on the device, normalised per batch
        return DataSplits(
            train_x=x[train],
            train_y=y[train],
            val_x=x[val],
            val_y=y[val],
            test_x=x[test] if test is not None else None,
            test_y=y[test] if test is not None else None,
            num_classes=len(classes),
            class_names=classes,
            train_transform=random_crop_flip if augment else None,
            input_transform=normalize,
            normalization=normalize.as_dict(),
        )
    return DatasetSplits(
        train=CachedImages(path, train, y[train], flip=augment),
        val=CachedImages(path, val, y[val], flip=False),
        train_y=y[train],
        val_y=y[val],
        test=CachedImages(path, test, y[test], flip=False) if test is not None else None,
        test_y=y[test] if test is not None else None,
        sample_shape=tuple(pixels.shape[1:]),
        num_classes=len(classes),
        class_names=classes,
        input_transform=normalize,
        normalization=normalize.as_dict(),
    )


setattr(image_folder, DATA_KIND_ATTR, "image")
