"""The held-out test split: offered by the built-in data sets, never read before the sweep ends,
and the chosen trial's score on it in summary.json, MLflow, export.json, report.html and
`sweeper status`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import SPACES, install_test_plugin, sweeper, write_spec
from mlflow.tracking import MlflowClient

from sweeper.pluginhost import registry
from sweeper.spec import load
from sweeper.testing import check_dataset_plugin
from sweeper.trial.build import rebuild
from sweeper.trial.holdout import score
from sweeper_plugins.mnist1d import mnist1d


def _rows(x: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.flatten(1)}


@pytest.mark.parametrize("name", ["digits", "diabetes", "synthetic_multilabel"])
def test_a_seeded_test_fraction_is_held_out_and_validation_stays_the_same(name: str):
    factory = registry.get("datasets", name)
    a, again, other = factory(seed=0), factory(seed=0), factory(seed=1)
    assert a.test_x is not None and a.test_y is not None
    assert torch.equal(a.test_x, again.test_x) and not torch.equal(a.test_y.float(), other.test_y.float())
    # disjoint from the training and validation samples
    assert not (_rows(a.test_x) & _rows(a.train_x)) and not (_rows(a.test_x) & _rows(a.val_x))
    total = len(a.train_y) + len(a.val_y) + len(a.test_y)
    assert abs(len(a.test_y) - 0.2 * total) <= 1
    without = factory(seed=0, test_fraction=0.0)
    assert without.test_x is None and without.held_out() is None
    assert torch.equal(without.val_y, a.val_y)  # the validation samples are those of test_fraction 0
    if name == "digits":  # the conformance kit checks a plugin's test split
        assert "same seed (0), same test split" in check_dataset_plugin("digits").passed


def test_mnist1d_tests_on_the_benchmarks_own_test_samples():
    """The generator's first 4,000 samples (its training part) give train and validation; its last
    1,000 (its test part) are the test split."""
    data = mnist1d(num_train=300, num_val=100, num_test=100, root=None, seed=2)
    whole = mnist1d(num_train=400, num_val=100, num_test=0, root=None, seed=2)  # the same 500 samples
    assert data.test_x is not None and data.test_x.shape == (100, 40)
    assert torch.equal(data.test_x, whole.val_x) and torch.equal(data.train_x, whole.train_x[:300])
    assert whole.test_x is None


def test_a_tables_split_column_names_its_test_rows(tmp_path: Path):
    table = pd.DataFrame(
        {"a": range(30), "b": [i % 3 for i in range(30)], "target": [i % 2 for i in range(30)]}
        | {"split": ["train"] * 20 + ["val"] * 5 + ["test"] * 5}
    )
    table.to_csv(tmp_path / "t.csv", index=False)
    data = registry.get("datasets", "tabular")(path=str(tmp_path / "t.csv"))
    assert data.test_x is not None and data.test_x[:, 0].tolist() != [] and len(data.test_y) == 5
    cut = registry.get("datasets", "tabular")(path=str(tmp_path / "t.csv"), split="none", test_fraction=0.2, seed=1)
    assert cut.test_y is not None and len(cut.test_y) == 6 and len(cut.val_y) == 6


def test_score_reads_the_test_split_with_the_tasks_metrics():
    data = registry.get("datasets", "diabetes")(seed=0)
    spec = load(SPACES / "diabetes.yaml")
    from sweeper.trial.build import build_model, build_task

    task = build_task(spec, data)
    metrics = score(build_model(spec, data, task).eval(), data, task, 64)
    assert {"test_loss", "test_rmse"} <= set(metrics) and not any(k.startswith("val_") for k in metrics)
    with pytest.raises(ValueError, match="no test split"):
        score(build_model(spec, data, task), registry.get("datasets", "diabetes")(seed=0, test_fraction=0.0), task, 64)


@pytest.fixture
def sealed(site: Path, tmp_path: Path) -> Path:
    install_test_plugin(site, "sweeper_test_sealed", {"sweeper.datasets": {"sealed": "sweeper_test_sealed:sealed"}})
    folder = tmp_path / "seal"
    folder.mkdir()
    return folder


def test_the_test_split_is_read_only_after_the_sweep_and_reported_everywhere(
    sealed: Path, workdir: Path, mlflow_uri: str
):
    """A plugin whose test tensors raise when anything but the scoring after the sweep touches
    them (tests/plugins/sweeper_test_sealed.py): every trial completes, the dry build and the
    export pass, and the chosen trial's test score reaches every place a user looks."""
    spec = write_spec(
        workdir / "spec.yaml",
        dataset={"plugin": "sealed", "args": {"folder": str(sealed)}},
        search={
            "n_trials": 3,
            "parallel": 2,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1}},
        },
    )
    sweeper("run", str(spec), "--out", "out", "--quiet", "export.refit=true", check=True)
    assert not (sealed / "early").exists(), (sealed / "early").read_text()
    assert (sealed / "read").exists()
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete"] * 3
    best = summary["best"]
    assert set(best["test_metrics"]) == {"test_loss", "test_acc"} and best["test_samples"] == 96
    # the score is the chosen model's on those 96 samples, as a rebuild measures it again
    model, data, _ = rebuild(load(spec).with_values(best["params"]), Path(best["checkpoint"]))
    with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():  # the seal's checks off: the test's own look
        correct = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    assert best["test_metrics"]["test_acc"] == pytest.approx(correct)

    # export.refit: the exported model is the configuration retrained on train + val (320 samples)
    refit = summary["refit"]
    assert refit["train_samples"] == 320 and refit["seed"] == best["seed"] and refit["test_samples"] == 96
    exported = json.loads((workdir / "out" / "export.json").read_text())
    assert exported["test"] == {"metrics": refit["test_metrics"], "samples": 96}
    parent = MlflowClient(mlflow_uri).get_run(summary["mlflow"]["parent_run_id"])
    assert parent.data.metrics["test_acc"] == best["test_metrics"]["test_acc"]
    assert parent.data.metrics["refit_test_acc"] == refit["test_metrics"]["test_acc"]
    assert parent.data.metrics["best_val_acc"] == best["value"]
    assert "96 samples, never seen by the search" in (workdir / "out" / "report.html").read_text()
    status = sweeper("status", "out", check=True).stdout
    assert f"test_acc {best['test_metrics']['test_acc']:.4g} on 96 held-out test samples" in status
    assert json.loads(sweeper("status", "out", "--json", check=True).stdout)["chosen"]["test_samples"] == 96


def test_a_data_set_without_a_test_split_says_so(workdir: Path):
    spec = write_spec(workdir / "spec.yaml", search={"n_trials": 1, "space": {}}, export={"formats": []})
    sweeper("run", str(spec), "--out", "out", "--quiet", "tracking.enabled=false", check=True)
    best = json.loads((workdir / "out" / "summary.json").read_text())["best"]
    assert "test_metrics" not in best and "test_error" not in best
    assert "no test split" in (workdir / "out" / "report.html").read_text()
    assert "no test split" in sweeper("status", "out", check=True).stdout


def test_refit_trains_on_train_and_val_and_is_reproducible(tmp_path: Path):
    """The same configuration and seed refit to the same weights (bitwise on the CPU), trained
    on the training and validation samples together."""
    from sweeper.trial import checkpoint
    from sweeper.trial.refit import refit

    spec = load(SPACES / "digits.yaml", ["train.epochs=1", "model.args.channels=8"])
    first = refit(spec, 7, {}, tmp_path / "a.pt")
    refit(spec, 7, {}, tmp_path / "b.pt")
    other = refit(spec, 8, {}, tmp_path / "c.pt")
    a, b, c = (checkpoint.load(tmp_path / f"{n}.pt")["model"] for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert len(first.data.train_y) == 1079 + 359 and len(other.history) == 1
