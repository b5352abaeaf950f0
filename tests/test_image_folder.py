"""The ``image_folder`` data set on tiny PNGs written here: class folders (or train/ and val/),
decoded once into a cache keyed on the files, held as tensors when small, read through a
DataLoader from the memory-mapped cache otherwise; both paths sweep to better than chance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SPACES, sweeper
from PIL import Image

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.testing import check_dataset_plugin
from sweeper_plugins.image_folder import image_folder

CLASSES = ("red", "green", "blue")  # the class is the dominant colour: learnable in an epoch or two


def write_images(folder: Path, per_class: int = 16, seed: int = 0, size: int = 20) -> None:
    """``per_class`` noisy PNGs (``size`` pixels, non-square for odd ones) in one folder per class."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 120, (size, size + i % 2 * 4, 3), dtype=np.uint8)
            pixels[..., c] = rng.integers(150, 256, pixels.shape[:2], dtype=np.uint8)
            Image.fromarray(pixels).save(folder / name / f"{i:03d}.png")


# 2 trials x 3 epochs of 38 training images at 12 x 12 pixels
FAST = (
    "dataset.args.size=12",
    "model.args.channels=8",
    "model.args.blocks=2",
    "search.n_trials=2",
    "search.space={optimizer.args.lr: {type: float, low: 3.0e-3, high: 1.0e-2, log: true}}",
    "train.epochs=3",
    "train.batch_size=8",
    "train.device=cpu",
    "tracking.enabled=false",
)


def test_images_are_decoded_once_into_a_cache_keyed_on_the_files(tmp_path: Path):
    root = tmp_path / "images"
    write_images(root, per_class=4)
    data = image_folder(root=str(root), size=8, seed=1)
    assert isinstance(data, DataSplits) and data.train_x.dtype == torch.uint8
    assert data.train_x.shape[1:] == (3, 8, 8) and len(data.train_y) + len(data.val_y) == 12
    assert data.class_names == ("blue", "green", "red")  # sorted folder names
    assert (
        "same seed (0), same splits" in check_dataset_plugin("image_folder", args={"root": str(root), "size": 8}).passed
    )
    [cached] = (root / ".sweeper-cache").glob("*.npy")
    again = image_folder(root=str(root), size=8, seed=1)  # read back, not decoded
    assert torch.equal(again.train_x, data.train_x) and list((root / ".sweeper-cache").glob("*.npy")) == [cached]
    os.utime(root / "red" / "000.png", ns=(1, 1))  # a touched image: a new cache
    image_folder(root=str(root), size=8, seed=1)
    image_folder(root=str(root), size=6, grayscale=True, seed=1)  # other pixels: another cache
    assert len(list((root / ".sweeper-cache").glob("*.npy"))) == 3  # (the conformance check read the first)
    assert image_folder(root=str(root), size=6, grayscale=True).input_shape == (1, 6, 6)
    loader = image_folder(root=str(root), size=8, seed=1, max_memory_mb=0)  # too big: the DataLoader path
    assert isinstance(loader, DatasetSplits) and loader.val_y.tolist() == data.val_y.tolist()
    x, y = loader.val[0]
    assert x.dtype == torch.uint8 and torch.equal(x, data.val_x[0]) and y == data.val_y[0]


def test_train_and_val_folders_fix_the_split(tmp_path: Path):
    write_images(tmp_path / "images" / "train", per_class=3)
    write_images(tmp_path / "images" / "val", per_class=2, seed=1)
    data = image_folder(root=str(tmp_path / "images"), size=8, cache=str(tmp_path / "cache"))
    assert (len(data.train_y), len(data.val_y)) == (9, 6) and list((tmp_path / "cache").glob("*.npy"))
    assert data.val_y.tolist() == [0, 0, 1, 1, 2, 2]
    (tmp_path / "images" / "val" / "purple").mkdir()
    (tmp_path / "images" / "val" / "purple" / "x.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"class folder\(s\) \['purple'\] are not in"):
        image_folder(root=str(tmp_path / "images"), size=8)


@pytest.mark.parametrize("max_memory_mb", [2_048.0, 0.0])  # whole tensors, or read through a DataLoader
def test_a_test_folder_beside_train_is_the_held_out_split(tmp_path: Path, max_memory_mb: float):
    write_images(tmp_path / "images" / "train", per_class=4)
    write_images(tmp_path / "images" / "test", per_class=2, seed=2)
    data = image_folder(root=str(tmp_path / "images"), size=8, max_memory_mb=max_memory_mb)
    assert (len(data.train_y) + len(data.val_y), data.test_y.tolist()) == (12, [0, 0, 1, 1, 2, 2])
    held = data.held_out()  # the test images where validation's stand, as the scoring after the sweep reads them
    assert held is not None and held.val_inputs().shape == (6, 3, 8, 8)
    write_images(tmp_path / "images" / "val", per_class=1, seed=1)  # and with a val/ folder too
    data = image_folder(root=str(tmp_path / "images"), size=8, max_memory_mb=max_memory_mb)
    assert (len(data.train_y), len(data.val_y), len(data.test_y)) == (12, 3, 6)


@pytest.mark.parametrize("path", ["tensors", "loader"])
def test_the_shipped_search_space_sweeps_on_both_paths(workdir: Path, path: str):
    write_images(workdir / "data" / "images")
    limit = "dataset.args.max_memory_mb=0" if path == "loader" else "dataset.args.max_memory_mb=1"
    # the export's check in a fresh process costs seconds: once, on the loader path (its example
    # input is collated from the memory-mapped cache)
    formats = "export.formats=[torchscript]" if path == "loader" else "export.formats=[]"
    sweeper("run", str(SPACES / "image_folder.yaml"), *FAST, limit, formats, "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] > 0.6  # three classes: chance is 1/3
    if path == "loader":
        report = json.loads((workdir / "out" / "export.json").read_text())
        assert report["input"]["shape"] == [None, 3, 12, 12] and report["class_names"] == list(CLASSES[::-1])
        assert report["normalization"]["scale"] == pytest.approx(1 / 255) and "error" not in report["formats"][0]


def test_a_root_without_class_folders_exits_2_naming_it(workdir: Path):
    (workdir / "empty").mkdir()
    proc = sweeper("run", str(SPACES / "image_folder.yaml"), "dataset.args.root=empty", *FAST, "--out", "out")
    assert proc.returncode == 2 and "0 class folder(s)" in proc.stderr and "dataset.args" in proc.stderr, proc.stderr
