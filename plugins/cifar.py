"""CIFAR-10 from its standard on-disk format (``cifar-10-batches-py`` under ``root``).

The whole training set is held as one uint8 tensor (50,000 x 3 x 32 x 32 = 154 MB; float32
would be 614 MB per process) on the training device, augmented per batch there (crop padding is
black, as in torchvision), then normalised per batch: no DataLoader, no per-image Python work.
The files are found, unpacked from the archive or downloaded once per sweep, before the first
trial (sweeper calls the factory then); the pickled batches are read by a restricted unpickler.
"""

from __future__ import annotations

import pickle
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
import torch.nn.functional as F

from sweeper.plugin import DATA_KIND_ATTR, DataSplits, Normalize
from sweeper_plugins.datasets import split_indices

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

HOME = "https://www.cs.toronto.edu/~kriz/cifar.html"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"  # the "python version", 163 MiB
MD5 = "c58f30108f718f92721af3b95e74349a"
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
# Per-channel statistics of the CIFAR-10 training set (0..1 pixel scale).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4  # pixels of zero padding for the random crop
# Seconds to wait for the download host's DNS answer, and for any network read or connect: an
# offline machine fails in seconds instead of hanging on a resolver or a dropped connection.
DNS_TIMEOUT = 10.0
NETWORK_TIMEOUT = 30.0
# The only globals the official batches name (numpy's array reconstruction, under its numpy 1
# and numpy 2 module names); any other global in a pickle could run code, so it is refused.
PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _BatchUnpickler(pickle.Unpickler):
    """Reads what CIFAR-10's files hold (dicts, lists, ints, strings, bytes, numpy arrays) and
    refuses every other global before anything is called."""

    def __init__(self, path: Path, file: Any) -> None:
        super().__init__(file, encoding="latin1")  # the files were pickled by Python 2
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"{self.path}: not a CIFAR-10 batch: it asks to load {module}.{name}, which the format never "
                f"holds (nothing was run). Delete {self.path.parent} and fetch the 'python version' again "
                f"from {HOME}."
            ) from None


def _unpickle(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        content = _BatchUnpickler(path, f).load()
    if not isinstance(content, dict):
        raise pickle.UnpicklingError(f"{path}: not a CIFAR-10 batch: it holds a {type(content).__name__}, not a dict")
    return content


def _read_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    batch = _unpickle(path)
    return np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32), list(batch["labels"])


def _class_names(folder: Path) -> tuple[str, ...] | None:
    meta = folder / "batches.meta"
    if not meta.exists():
        return None
    return tuple(_unpickle(meta)["label_names"])


def _where_files_go(root: Path) -> str:
    root = root.absolute()
    return (
        f"CIFAR-10 goes in {root / FOLDER}/ (data_batch_1 .. data_batch_5 and batches.meta): unpack the "
        f"'python version' archive {ARCHIVE} from {HOME} into {root}, or put the archive itself in "
        f"{root} (it is unpacked on first use). dataset.args.download: true fetches it (needs internet); "
        f"false reads only what is on disk."
    )


def _resolve(host: str) -> None:
    """Look ``host`` up within DNS_TIMEOUT: getaddrinfo itself has no timeout, so it runs in a
    daemon thread that may be abandoned."""
    found: dict[str, Any] = {}

    def lookup() -> None:
        try:
            found["addresses"] = socket.getaddrinfo(host, 443)
        except OSError as exc:
            found["error"] = exc

    thread = threading.Thread(target=lookup, name="cifar-dns", daemon=True)
    thread.start()
    thread.join(DNS_TIMEOUT)
    if thread.is_alive():
        raise TimeoutError(f"no DNS answer for {host} within {DNS_TIMEOUT:.0f} s")
    if "error" in found:
        raise found["error"]


def _download(root: Path) -> None:
    """Fetch the archive into ``root`` (a progress bar on stderr), failing fast when offline."""
    from torchvision.datasets.utils import download_url

    try:
        _resolve(urlparse(URL).hostname or "")
        previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(NETWORK_TIMEOUT)  # urllib's connects and reads, here only
        try:
            download_url(URL, str(root), filename=ARCHIVE, md5=MD5)
        finally:
            socket.setdefaulttimeout(previous)
    except (OSError, RuntimeError) as exc:  # URLError, DNS failure, timeout; RuntimeError: bad checksum
        raise ConnectionError(
            f"CIFAR-10 is not on disk and downloading {URL} failed: {type(exc).__name__}: "
            f"{exc}. {_where_files_go(root)}"
        ) from exc


def _fetch(root: Path, download: bool) -> None:
    """Make ``root/FOLDER`` hold the batches: unpack the archive found in ``root``, or download it first."""
    from torchvision.datasets.utils import check_integrity, extract_archive

    archive = root / ARCHIVE
    if not check_integrity(str(archive), MD5):  # absent, partial or not the official archive
        if not download:
            found = f" ({archive} is incomplete or not the official archive)" if archive.exists() else ""
            raise FileNotFoundError(f"CIFAR-10 is not on disk{found}. {_where_files_go(root)}")
        _download(root)
    extract_archive(str(archive), str(root))


def write_random(root: str | Path, per_batch: int = 20, seed: int = 0) -> Path:
    """CIFAR-10's on-disk "python version" with random pixels and labels (``per_batch`` images
    in each of the 5 training batches and the test batch): real files in the real format, for
    tests and benchmarks that must not download. Returns the folder."""
    folder = Path(root) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in (*TRAIN_FILES, "test_batch"):
        batch = {
            "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, per_batch).tolist(),
            "batch_label": name,
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    return folder


def random_crop_flip(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard CIFAR augmentation for a whole batch at once (raw pixels, any dtype): random
    32x32 crop from the image zero-padded (black) by PAD pixels, then a horizontal flip with
    probability 1/2."""
    n, _, h, w = batch.shape
    padded = F.pad(batch, (PAD, PAD, PAD, PAD))
    dev = batch.device
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=dev)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=dev)
    rows = (dy[:, None] + torch.arange(h, device=dev))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=dev))[:, None, None, :]
    crops = padded[
        torch.arange(n, device=dev)[:, None, None, None],
        torch.arange(batch.shape[1], device=dev)[None, :, None, None],
        rows,
        cols,
    ]
    flip = torch.rand(n, generator=generator, device=dev) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(-1), crops)


def cifar10(
    *,
    root: str = "data/cifar10",
    download: bool = False,
    val_fraction: float = 0.1,
    augment: bool = True,
    limit: int | None = None,
    seed: int = 0,
) -> DataSplits:
    """CIFAR-10's 50,000 training images split into train/val by ``seed``; its 10,000 test images
    (``test_batch``) are the held-out test split. ``limit`` keeps only the first N images of each
    (quick tries). ``download: true`` fetches the archive (needs internet); an archive already in
    ``root`` is unpacked without network."""
    folder = Path(root) / FOLDER
    if not all((folder / name).exists() for name in TRAIN_FILES):
        _fetch(Path(root), download)
    parts = [_read_batch(folder / name) for name in TRAIN_FILES]
    images = np.concatenate([p[0] for p in parts])[:limit]
    labels = torch.tensor([label for p in parts for label in p[1]][:limit], dtype=torch.int64)
    x = torch.from_numpy(images)  # uint8 pixels: normalised per batch on the device
    normalize = Normalize(1 / 255.0, MEAN, STD)
    train, val = split_indices(len(labels), val_fraction, seed)
    test_images, test_labels = _read_batch(folder / "test_batch") if (folder / "test_batch").exists() else (None, [])
    return DataSplits(
        train_x=x[train],
        train_y=labels[train],
        val_x=x[val],
        val_y=labels[val],
        test_x=torch.from_numpy(test_images[:limit]) if test_images is not None else None,
        test_y=torch.tensor(test_labels[:limit], dtype=torch.int64) if test_images is not None else None,
        num_classes=10,
        class_names=_class_names(folder),
        train_transform=random_crop_flip if augment else None,
        input_transform=normalize,
        normalization=normalize.as_dict(),
    )


setattr(cifar10, DATA_KIND_ATTR, "image")
