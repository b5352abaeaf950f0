"""MNIST-1D: generated offline and seeded (same seed, same tensors), cached on disk, and swept
end to end from the shipped search space with every export format."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from conftest import SPACES, sweeper

from sweeper.testing import check_dataset_plugin
from sweeper_plugins.mnist1d import mnist1d

SMALL = {"num_train": 120, "num_val": 45}  # not multiples of 10: the split is cut as asked


def test_same_seed_same_tensors_another_seed_other_samples(tmp_path: Path):
    a = mnist1d(**SMALL, root=None, seed=3)
    b = mnist1d(**SMALL, root=None, seed=3)
    c = mnist1d(**SMALL, root=None, seed=4)
    for field in ("train_x", "train_y", "val_x", "val_y"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert not torch.equal(a.train_x, c.train_x)
    assert a.train_x.shape == (120, 40) and a.val_x.shape == (45, 40) and a.train_x.dtype == torch.float32
    assert a.num_classes == 10 and set(a.train_y.tolist()) == set(range(10))
    assert "same seed (0), same splits" in check_dataset_plugin("mnist1d", args={**SMALL, "root": None}).passed


def test_generation_leaves_the_global_generators_as_they_were():
    random.seed(1)
    np.random.seed(1)
    mnist1d(num_train=20, num_val=10, root=None, seed=5)
    assert random.random() == random.Random(1).random()
    assert np.random.rand() == np.random.RandomState(1).rand()


def test_arrays_are_cached_per_arguments(tmp_path: Path):
    root = tmp_path / "cache"
    first = mnist1d(**SMALL, root=str(root), seed=0)
    files = list(root.glob("mnist1d-*.npz"))
    assert len(files) == 1
    again = mnist1d(**SMALL, root=str(root), seed=0)  # read from the file
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.val_y, again.val_y)
    assert torch.equal(first.val_x, mnist1d(**SMALL, root=None, seed=0).val_x)  # the file holds what is generated
    mnist1d(**SMALL, root=str(root), seed=1)
    mnist1d(**SMALL, length=24, root=str(root), seed=0)
    assert len(list(root.glob("mnist1d-*.npz"))) == 3
    assert mnist1d(**SMALL, length=24, root=str(root), seed=0).train_x.shape == (120, 24)


def test_the_shipped_search_space_sweeps_and_exports(workdir: Path):
    """search_spaces/mnist1d.yaml, cut to seconds: 2 trials of 1 epoch on 200 samples, the best
    exported to TorchScript and verified at two batch sizes in a fresh process (pt2 and ONNX of
    each model: tests/test_sequence_models.py, in seconds where a sweep's export takes 20 s more)."""
    proc = sweeper(
        "run",
        str(SPACES / "mnist1d.yaml"),
        "search.n_trials=2",
        "search.parallel=1",
        "train.epochs=1",
        "dataset.args.num_train=200",
        "dataset.args.num_val=100",
        "export.formats=[torchscript]",
        "tracking.enabled=false",  # MLflow and its registry: tests/test_export.py (20 s more here)
        "--out",
        "out",
        "-q",
        check=True,
    )
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    report = json.loads((workdir / "out" / "export.json").read_text())
    assert summary["spec"]["dataset"]["plugin"] == "mnist1d", proc.stdout
    assert summary["best"]["params"]["model.plugin"] in ("conv1d", "gru", "transformer")
    assert report["input"]["shape"] == [None, 40]
    [export] = report["formats"]
    assert export["format"] == "torchscript" and "error" not in export, export
    assert set(export["parity_max_abs_diff"]) == {"1", "33"} and export["max_abs_diff"] <= 1e-4
    assert list((workdir / "data" / "mnist1d").glob("mnist1d-*.npz"))  # generated once, cached in ./data
