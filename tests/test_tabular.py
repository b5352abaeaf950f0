"""The ``tabular`` data set and ``tabular_mlp``: CSV and Parquet tables written here (generated,
and scikit-learn's bundled diabetes data: no download), preprocessing fitted on the training
split only and recorded in export.json, classification or regression by the target column, and
the refusals (a task that does not match the target, a missing file) exit 2 before compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SPACES, sweeper

from sweeper.testing import check_dataset_plugin, check_model_plugin
from sweeper_plugins.tabular import tabular, tabular_mlp

# 2 trials x 2 epochs, TorchScript only (ONNX's exporter costs 10 s more)
FAST = (
    "search.n_trials=2",
    "train.epochs=2",
    "train.batch_size=32",
    "train.device=cpu",
    "tracking.enabled=false",
    "export.formats=[torchscript]",
)


def generated_table(rows: int = 240, seed: int = 0) -> pd.DataFrame:
    """Two numeric columns, a colour (text) and a shape (integer codes); the label: whether
    x1 plus the colour's offset is positive (learnable: accuracy well above 1/2)."""
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue"], rows)
    x1 = rng.normal(10.0, 3.0, rows)  # far from standardised: the data set must scale it
    offset = pd.Series(colour).map({"red": -3.0, "green": 0.0, "blue": 3.0}).to_numpy()
    return pd.DataFrame(
        {
            "x1": x1,
            "x2": rng.normal(0.0, 1.0, rows),
            "colour": colour,
            "shape": rng.integers(0, 4, rows),
            "target": np.where(x1 - 10.0 + offset > 0, "yes", "no"),
        }
    )


def diabetes_table() -> pd.DataFrame:
    """scikit-learn's diabetes data as a table: the sex column as text, a float target."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    frame["sex"] = frame["sex"].map({1.0: "female", 2.0: "male"})
    return frame


def test_preprocessing_is_fitted_on_the_training_split_only(tmp_path: Path):
    table = generated_table()
    table["split"] = ["val" if i % 4 == 0 else "train" for i in range(len(table))]
    table.loc[0, "colour"] = "purple"  # a validation row's colour the training split never had
    table.loc[4, "x2"] = np.nan  # a missing value: the training mean (0 once standardised)
    path = tmp_path / "table.csv"
    table.to_csv(path, index=False)
    data = tabular(path=str(path), categorical=["shape"])
    features = data.features
    assert features is not None
    assert features.numeric == ("x1", "x2") and features.categorical == ("colour", "shape")
    assert features.vocabularies == (("blue", "green", "red"), ("0", "1", "2", "3"))
    train = table[table.split == "train"]
    assert features.mean[0] == pytest.approx(train.x1.mean()) and features.std[0] == pytest.approx(train.x1.std(ddof=0))
    assert data.train_x[:, 0].mean().abs() < 1e-5 and len(data.val_y) == 60  # the split column, not a cut
    assert data.val_x[0, 2] == 0 and data.val_x[1:, 2].min() >= 1  # purple: code 0, unseen
    assert data.val_x[1, 1] == 0.0  # row 4 is the second validation row: its missing x2 -> the mean
    assert data.class_names == ("no", "yes") and data.train_y.dtype == torch.int64
    model = tabular_mlp(input_shape=data.input_shape, num_classes=2, features=features)
    assert [e.num_embeddings for e in model.embeddings] == [4, 5]
    assert check_dataset_plugin("tabular", args={"path": str(path), "categorical": ["shape"]}).passed  # the contract
    counts = tabular(path=str(path), target="shape", drop=["target"], target_type="number")  # an int to regress
    assert counts.train_y.dtype == torch.float32 and counts.num_classes == 0 and counts.features is not None
    assert counts.features.numeric == ("x1", "x2") and counts.features.categorical == ("colour",)
    with pytest.raises(ValueError, match=r"no column 'price' in .*table.csv; its columns: x1, x2, colour"):
        tabular(path=str(path), target="price")
    check = check_model_plugin("tabular_mlp", input_shape=(6,), num_classes=3, export=False)  # no features
    assert not check.warnings and "gradients are finite" in check.passed


def test_csv_classification_sweeps_and_exports_its_preprocessing(workdir: Path):
    generated_table().to_csv(workdir / "table.csv", index=False)
    sweeper("run", str(SPACES / "tabular.yaml"), "dataset.args.path=table.csv", *FAST, "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    report = json.loads((workdir / "out" / "export.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] > 0.7  # two classes: chance is 0.5
    assert report["class_names"] == ["no", "yes"] and report["input"]["shape"] == [None, 4]
    assert [c["name"] for c in report["features"]["numeric"]] == ["x1", "x2", "shape"]
    assert report["features"]["categorical"] == [
        {"name": "colour", "codes_from": 1, "unseen_code": 0, "categories": ["blue", "green", "red"]}
    ]
    assert all("error" not in f for f in report["formats"]), report["formats"]


def test_parquet_regression_sweeps_with_task_regression(workdir: Path):
    diabetes_table().to_parquet(workdir / "diabetes.parquet")
    regression = ("task.plugin=regression", "objective.metric=val_rmse", "objective.direction=minimize")
    overrides = ("dataset.args.path=diabetes.parquet", *regression, *FAST)
    sweeper("run", str(SPACES / "tabular.yaml"), *overrides, "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    report = json.loads((workdir / "out" / "export.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] < 100  # the target's std is 77: a model that learned something
    assert [c["name"] for c in report["features"]["categorical"]] == ["sex"]
    assert report["class_names"] is None and "error" not in report["formats"][0]


def test_a_task_that_does_not_match_the_target_exits_2_before_compute(workdir: Path):
    diabetes_table().to_csv(workdir / "diabetes.csv", index=False)
    proc = sweeper("run", str(SPACES / "tabular.yaml"), "dataset.args.path=diabetes.csv", *FAST, "--out", "out")
    assert proc.returncode == 2
    assert "task 'classification'" in proc.stderr and "task: regression" in proc.stderr, proc.stderr
    assert not (workdir / "out" / "summary.json").exists()
    missing = sweeper("run", str(SPACES / "tabular.yaml"), "dataset.args.path=nowhere.csv", *FAST, "--out", "out2")
    assert missing.returncode == 2 and "dataset.args.path: no file" in missing.stderr, missing.stderr
