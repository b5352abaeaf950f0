"""torchvision's data sets by name (``torchvision``), without downloading: missing files and
unknown names exit 2 before compute, and a tiny fake MNIST written in torchvision's raw format
(idx files) is read and swept."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from conftest import SPACES, sweeper

from sweeper_plugins.vision_data import torchvision_dataset

# a sweep of 2 trials x 2 epochs on the fake MNIST, no export
FAST = (
    "dataset.args.download=false",
    "dataset.args.name=MNIST",
    "model.args.channels=8",
    "search.n_trials=2",
    "search.space={optimizer.args.lr: {type: float, low: 3.0e-3, high: 1.0e-2, log: true}}",
    "train.epochs=2",
    "train.batch_size=16",
    "train.device=cpu",
    "tracking.enabled=false",
    "export.formats=[]",
)


def write_fake_mnist(root: Path, n: int = 160, seed: int = 0) -> None:
    """MNIST's four idx files under root/MNIST/raw (what torchvision reads): 28 x 28 images whose
    class is the row of a bright band (learnable in an epoch), and a 10-image test split."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, count in (("train", n), ("t10k", 10)):
        labels = rng.integers(0, 10, count).astype(np.uint8)
        images = rng.integers(0, 60, (count, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            images[i, 2 + 2 * label : 4 + 2 * label] = 255
        # idx format: a magic number (0x0803: unsigned bytes, 3 dimensions), the sizes big-endian, the data
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 0x803, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 0x801, count) + labels.tobytes())


def test_a_fake_mnist_in_torchvisions_format_is_read_and_swept(workdir: Path):
    write_fake_mnist(workdir / "data" / "torchvision")
    data = torchvision_dataset(name="MNIST", root="data/torchvision", val_fraction=0.25, seed=1)
    assert data.train_x.shape == (120, 1, 28, 28) and data.train_x.dtype == torch.uint8 and len(data.val_y) == 40
    assert data.num_classes == 10 and data.class_names is not None and data.class_names[0] == "0 - zero"
    assert data.normalization is not None and data.normalization["scale"] == 1 / 255
    assert torchvision_dataset(name="MNIST", root="data/torchvision", limit=50).train_x.shape[0] == 45
    sweeper("run", str(SPACES / "torchvision.yaml"), *FAST, "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] > 0.3  # ten classes: chance is 0.1


def test_missing_files_without_download_exit_2_saying_where_they_go(workdir: Path):
    proc = sweeper("run", str(SPACES / "torchvision.yaml"), *FAST, "--out", "out")
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())
    assert "MNIST is not on disk. torchvision reads MNIST from" in message and "download=True" not in message
    assert "dataset.args.download: true fetches it" in message, message
    assert not (workdir / "out" / "summary.json").exists()


def test_an_unknown_name_exits_2_with_a_suggestion(workdir: Path):
    proc = sweeper("run", str(SPACES / "torchvision.yaml"), *FAST, "dataset.args.name=FashionMnist", "--out", "out")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "no data set 'FashionMnist' (did you mean 'FashionMNIST'?)" in message, message
