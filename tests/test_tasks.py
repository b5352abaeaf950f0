"""Tasks as plugins (sweeper.tasks): each built-in's loss and metrics against a hand computation,
one tiny sweep per task through the CLI, the refusals before the first trial (exit 2, the path
named), and a regression model's replay and export parity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import sweeper
from torch.nn import functional as F

from sweeper.plugin import DataSplits
from sweeper.pluginhost.registry import get
from sweeper_plugins import tasks as builtin


def splits(train_y: torch.Tensor, val_y: torch.Tensor, num_classes: int = 0) -> DataSplits:
    return DataSplits(
        train_x=torch.zeros(len(train_y), 2),
        train_y=train_y,
        val_x=torch.zeros(len(val_y), 2),
        val_y=val_y,
        num_classes=num_classes,
    )


# --- losses and metrics, by hand ---------------------------------------------------------------


def test_classification_balanced_weights_and_smoothing_by_hand() -> None:
    y = torch.tensor([0, 0, 0, 1])  # 3 of class 0, 1 of class 1: weights n / (2 * count) = 2/3, 2
    task = get("tasks", "classification")(class_weights="balanced", label_smoothing=0.1).fit(splits(y, y, 2))
    assert task.outputs == 2 and torch.allclose(task.weight, torch.tensor([2 / 3, 2.0]))
    out = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, -0.5]])
    logp = out.log_softmax(1)
    w = torch.tensor([2 / 3, 2.0])
    # torch's weighted, smoothed cross-entropy: (1-eps) * sum w_y * nll / sum w_y + eps * mean-over-classes part
    nll = -(w[y] * logp[range(4), y]).sum() / w[y].sum()
    smooth = -(logp * w).sum(1).sum() / w[y].sum() / 2
    assert torch.isclose(task.loss(out, y), 0.9 * nll + 0.1 * smooth)
    meter = task.meter("val")
    meter.update(out, y)
    metrics = meter.compute()
    assert metrics["val_acc"] == 2 / 4  # rows 0 and 2 (a tie: argmax takes the first) are class 0
    assert math.isclose(metrics["val_loss"], F.cross_entropy(out, y).item(), rel_tol=1e-6)  # unweighted


def test_classification_refuses_a_weight_list_of_the_wrong_length() -> None:
    y = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="lists 2 weights; the data set has 3 classes"):
        get("tasks", "classification")(class_weights=[1.0, 2.0]).fit(splits(y, y, 3))


def test_regression_standardises_on_the_training_split_and_reports_data_units() -> None:
    train_y, val_y = torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([2.0, 10.0])
    task = get("tasks", "regression")(loss="mse").fit(splits(train_y, val_y))
    mean, std = 4.0, math.sqrt(5.0)  # population std of 1, 3, 5, 7
    assert (
        task.outputs == 1 and math.isclose(task.mean.item(), mean) and math.isclose(task.std.item(), std, rel_tol=1e-6)
    )
    out = torch.tensor([[0.0], [1.0]])  # standardised: predictions 4 and 4 + sqrt(5)
    expected = ((0 - (2 - mean) / std) ** 2 + (1 - (10 - mean) / std) ** 2) / 2
    assert math.isclose(task.loss(out, val_y).item(), expected, rel_tol=1e-6)
    meter = task.meter("val")
    meter.update(out, val_y)
    m = meter.compute()
    pred = [4.0, 4.0 + std]
    errors = [pred[0] - 2.0, pred[1] - 10.0]
    assert math.isclose(m["val_rmse"], math.sqrt(sum(e * e for e in errors) / 2), rel_tol=1e-6)
    assert math.isclose(m["val_mae"], sum(abs(e) for e in errors) / 2, rel_tol=1e-6)
    assert math.isclose(m["val_r2"], 1 - sum(e * e for e in errors) / (4.0**2 + 4.0**2), rel_tol=1e-6)  # mean 6
    l1 = get("tasks", "regression")(loss="l1").fit(splits(train_y, val_y))
    huber = get("tasks", "regression")(loss="huber", huber_delta=0.5).fit(splits(train_y, val_y))
    z = (val_y - mean) / std
    assert torch.isclose(l1.loss(out, val_y), (out[:, 0] - z).abs().mean())
    d = (out[:, 0] - z).abs()
    assert torch.isclose(huber.loss(out, val_y), torch.where(d < 0.5, 0.5 * d**2, 0.5 * (d - 0.25)).mean())


def test_multilabel_f1_and_map_by_hand() -> None:
    y = torch.tensor([[1, 0], [1, 1], [0, 1], [0, 0]], dtype=torch.float32)
    task = get("tasks", "multilabel")(threshold=0.5).fit(splits(y, y))
    out = torch.tensor([[2.0, -1.0], [-1.0, 3.0], [0.5, 1.0], [1.0, -2.0]])  # predicted where out >= 0
    assert torch.isclose(task.loss(out, y), F.binary_cross_entropy_with_logits(out, y))
    meter = task.meter("val")
    meter.update(out, y)
    m = meter.compute()
    # label 0: predicted rows 0, 2, 3; true rows 0, 1 -> tp 1, fp 2, fn 1: F1 = 2/(2+3) = 0.4
    # label 1: predicted rows 1, 2; true rows 1, 2 -> F1 = 1
    assert math.isclose(m["val_f1_label0"] if "val_f1_label0" in m else m["val_f1_0"], 0.4)
    assert math.isclose(m["val_f1_macro"], 0.7)
    # AP label 0: scores 2 (pos), 1 (neg), 0.5 (neg), -1 (pos): precision 1 at recall 1/2, 2/4 at recall 1
    # AP label 1: scores 3 (pos), 1 (pos), -1, -2: 1.0
    assert math.isclose(m["val_map"], ((0.5 * 1 + 0.5 * 0.5) + 1.0) / 2)
    from sklearn.metrics import average_precision_score

    g = torch.Generator().manual_seed(0)
    scores, truth = torch.randint(0, 5, (50,), generator=g).float(), torch.rand(50, generator=g) < 0.3  # ties
    assert math.isclose(
        builtin.average_precision(scores, truth), average_precision_score(truth.numpy(), scores.numpy())
    )


def test_each_task_refuses_targets_it_cannot_read() -> None:
    ints, floats = torch.tensor([0, 1]), torch.tensor([0.5, 1.5])
    with pytest.raises(ValueError, match="float targets"):
        get("tasks", "regression")().fit(splits(ints, ints))
    with pytest.raises(ValueError, match="0/1 of shape"):
        get("tasks", "multilabel")().fit(splits(floats, floats))
    with pytest.raises(ValueError, match="int64 class indices"):
        get("tasks", "classification")().fit(splits(floats, floats, 2))


# --- sweeps through the CLI --------------------------------------------------------------------

TINY = {"epochs": 2, "batch_size": 32, "device": "cpu"}


def tiny_spec(path: Path, base: str, **changes: object) -> Path:
    """search_spaces/<base>.yaml cut to seconds: 2 trials of 2 epochs, no pruning."""
    spec = yaml.safe_load((Path(__file__).parents[1] / "search_spaces" / f"{base}.yaml").read_text())
    spec["train"] = TINY
    spec["search"] = {**spec["search"], "n_trials": 2, "batch_size": 2, "parallel": 1, "pruner": {"type": "none"}}
    spec["model"]["args"]["hidden"] = 16
    spec.pop("tracking", None)
    spec.update(changes)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def regression_sweep(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri  # as the tests that replay its trial see it
    folder = tmp_path_factory.mktemp("regression")
    spec = tiny_spec(folder / "diabetes.yaml", "diabetes", export={"formats": ["torchscript", "onnx"]})
    sweeper("run", str(spec), "--out", str(folder / "out"), "-q", check=True)
    return folder / "out"


def test_a_regression_sweep_reports_data_units_and_exports_them(regression_sweep: Path) -> None:
    summary = json.loads((regression_sweep / "summary.json").read_text())
    assert summary["spec"]["task"]["plugin"] == "regression"
    assert summary["spec"]["objective"] == {"metric": "val_rmse", "direction": "minimize"}
    best = summary["best"]
    assert set(best["metrics"]) >= {"val_rmse", "val_mae", "val_r2", "val_loss", "train_loss"}
    assert "val_acc" not in best["metrics"]
    # the targets (25..346) have a std of ~77: an rmse in the data's units, not standardised
    assert 30 < best["metrics"]["val_rmse"] < 200
    report = json.loads((regression_sweep / "export.json").read_text())
    assert "data's units" in report["output"]["meaning"] and report["output"]["shape"] == [None, 1]
    assert all("error" not in f and f["max_abs_diff"] <= 1e-4 for f in report["formats"])
    x = np.zeros((3, 10), dtype=np.float32)  # standardised features at the training mean: about the mean target
    np.save(regression_sweep / "x.npy", x)
    done = sweeper("predict", str(regression_sweep / "model.onnx"), str(regression_sweep / "x.npy"), check=True)
    values = [float(line.split("\t")[1]) for line in done.stdout.strip().splitlines()[-3:]]
    assert all(25 < v < 350 for v in values)


def test_a_regression_trial_replays_bitwise(regression_sweep: Path) -> None:
    summary = json.loads((regression_sweep / "summary.json").read_text())
    done = sweeper("replay", summary["best"]["mlflow_run_id"], check=True)
    assert "reproduced" in done.stdout and "2 epoch(s), every metric equal bitwise" in done.stdout, done.stdout


def test_a_multilabel_sweep_reports_f1_and_map(tmp_path: Path) -> None:
    sweeper("run", str(tiny_spec(tmp_path / "ml.yaml", "multilabel")), "--out", "out", "-q", check=True)
    summary = json.loads(Path("out/summary.json").read_text())
    metrics = summary["best"]["metrics"]
    assert summary["spec"]["objective"] == {"metric": "val_map", "direction": "maximize"}
    assert {"val_map", "val_f1_macro", "val_f1_label0", "val_f1_label4"} <= set(metrics)
    assert 0.0 <= metrics["val_f1_macro"] <= 1.0 and 0.3 < metrics["val_map"] <= 1.0
    assert "sigmoid" in json.loads(Path("out/export.json").read_text())["output"]["meaning"]


def test_a_classification_sweep_with_balanced_weights_and_lr_finder(tmp_path: Path) -> None:
    spec = tiny_spec(
        tmp_path / "c.yaml",
        "smoke",
        task={"plugin": "classification", "args": {"class_weights": "balanced", "label_smoothing": 0.1}},
    )
    tree = yaml.safe_load(spec.read_text())
    tree["search"]["lr_finder"] = {"enabled": True, "steps": 10}
    spec.write_text(yaml.safe_dump(tree))
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    summary = json.loads(Path("out/summary.json").read_text())
    assert summary["spec"]["objective"] == {"metric": "val_acc", "direction": "maximize"}
    assert summary["best"]["metrics"]["val_acc"] > 0


# --- refusals before the first trial -----------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "changes", "message"),
    [
        ("diabetes", {"objective": {"metric": "val_acc"}}, "objective.metric: task 'regression' does not report"),
        ("diabetes", {"train": {**TINY, "label_smoothing": 0.1}}, "train.label_smoothing: task 'regression' has no"),
        ("diabetes", {"task": {"plugin": "regression", "args": {"loss": "cubic"}}}, "task.args.loss"),
        ("multilabel", {"dataset": {"plugin": "diabetes"}}, "task.args / task plugin 'multilabel'"),
        ("smoke", {"task": {"plugin": "classification", "args": {"class_weights": [1.0, 2.0]}}}, "lists 2 weights"),
    ],
    ids=["metric", "smoothing", "loss", "targets", "weights"],
)
def test_what_a_task_cannot_do_is_refused_by_validate(tmp_path: Path, base: str, changes: dict, message: str) -> None:
    spec = tiny_spec(tmp_path / "s.yaml", base, **changes)
    done = sweeper("validate", str(spec))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("base", ["diabetes", "multilabel"])
def test_a_fused_sweep_of_any_task_trains_as_its_solo_twin(tmp_path: Path, base: str) -> None:
    """Each member's loss and metrics are its own task's (trial/fused.py): a regression or
    multilabel sweep fuses, and its table equals the same sweep trained one trial at a time."""
    from test_fused_sweeps import TOLERANCE, same_trials, table

    spec = tiny_spec(tmp_path / "s.yaml", base)
    tree = yaml.safe_load(spec.read_text())
    del tree["search"]["space"]["model.args.hidden"]  # one architecture: the batch's two trials fuse
    spec.write_text(yaml.safe_dump(tree, sort_keys=False))
    sweeper("run", str(spec), "search.fuse=2", "--out", "fused", "-q", check=True)
    sweeper("run", str(spec), "search.fuse=off", "--out", "solo", "-q", check=True)
    fused, solo = table(tmp_path / "fused"), table(tmp_path / "solo")
    assert [t["fused_with"] for t in fused] == [[0, 1], [0, 1]] and all(t["fused_with"] == [] for t in solo)
    assert {"val_rmse" if base == "diabetes" else "val_map"} <= set(fused[0]["history"][-1])
    same_trials(fused, solo, rel=TOLERANCE)


def test_an_objective_without_direction_takes_the_tasks(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path / "s.yaml", "diabetes", objective={"metric": "val_r2"})
    done = sweeper("validate", str(spec), check=True)
    assert "metric: val_r2\n  direction: maximize" in done.stdout
    spec = tiny_spec(tmp_path / "s.yaml", "diabetes", objective={"metric": "val_mae"})
    assert "metric: val_mae\n  direction: minimize" in sweeper("validate", str(spec), check=True).stdout
