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

from sweeper.testing import check_dataset_plugin
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
    assert data.test_x is not None and data.test_x.shape == (10, 1, 28, 28)  # t10k: the held-out test split
    assert data.normalization is not None and data.normalization["scale"] == 1 / 255
    assert torchvision_dataset(name="MNIST", root="data/torchvision", limit=50).train_x.shape[0] == 45
    assert check_dataset_plugin("torchvision", args={"name": "MNIST", "root": "data/torchvision"}).passed
    sweeper("run", str(SPACES / "torchvision.yaml"), *FAST, "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] > 0.3  # ten classes: chance is 0.1
    assert summary["best"]["test_samples"] == 10 and "test_acc" in summary["best"]["test_metrics"]


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


# --- the model zoos ---------------------------------------------------------------------------

ZOO = {
    "name": "zoo",
    "seed": 0,
    "dataset": {
        "plugin": "synthetic",
        "args": {"num_train": 64, "num_val": 32, "input_shape": [1, 16, 16], "num_classes": 3},
    },
    "model": {"plugin": "torchvision_model", "args": {"arch": "resnet18"}},
    "optimizer": {"plugin": "adamw", "args": {"lr": 1.0e-3}},
    "train": {"epochs": 1, "batch_size": 16, "device": "cpu"},
    "search": {"n_trials": 2, "space": {"optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-2}}},
    "tracking": {"enabled": False},
    "export": {"formats": ["torchscript"]},
}


def test_a_torchvision_architecture_on_one_channel_sweeps_and_exports(workdir: Path):
    (workdir / "zoo.yaml").write_text(json.dumps(ZOO))
    sweeper("run", "zoo.yaml", "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    report = json.loads((workdir / "out" / "export.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert report["input"]["shape"] == [None, 1, 16, 16]  # the first convolution rebuilt for 1 channel
    [export] = report["formats"]
    assert export["format"] == "torchscript" and "error" not in export and export["max_abs_diff"] <= 1e-4, export


def test_other_architectures_adapt_to_the_data_and_misspelt_ones_are_refused(workdir: Path):
    from sweeper_plugins.vision_models import torchvision_model

    for arch in ("mobilenet_v3_small", "vit_b_16"):  # a depthwise-separable CNN; a ViT at the data's size
        model = torchvision_model(input_shape=(2, 32, 32), num_classes=4, arch=arch).eval()
        assert model(torch.randn(2, 2, 32, 32)).shape == (2, 4)
    (workdir / "zoo.yaml").write_text(json.dumps(ZOO))
    proc = sweeper("validate", "zoo.yaml", "model.args.arch=resnet181")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "no classification model 'resnet181' (did you mean 'resnet18'?)" in message


def test_the_timm_plugin_without_timm_exits_2_naming_the_extra(workdir: Path):
    (workdir / "zoo.yaml").write_text(json.dumps(ZOO))
    proc = sweeper("run", "zoo.yaml", "model.plugin=timm", "--out", "out")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "pip install 'sweeper[timm]'" in message, message
    assert not (workdir / "out" / "summary.json").exists()
