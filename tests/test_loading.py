"""The DataLoader path (sweeper/trial/loading.py): a data set returning DatasetSplits trains
through torch's DataLoader with the seed contract of the tensor path: the same trial table with
0 or 2 workers (which also shows that the validation loader's own generator leaves the trial's
dropout draws alone), and DataSplits forced through a loader train on the very batches of the
tensor path. The refusals exit 2 naming the YAML path, before any compute."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import SPACES, learned, sweeper, write_spec, write_tiny_cifar
from mlflow.tracking import MlflowClient

from sweeper.plan.estimate import tensor_bytes
from sweeper.plugin import pad_collate
from sweeper.spec import SweepSpec
from sweeper.trial.build import load_data

# Tiny: 2 trials x 2 epochs of 128 short sequences; dropout searched, so the dropout draws count.
SEQUENCES = {
    "name": "loading",
    "seed": 0,
    "dataset": {"plugin": "sequences", "args": {"num_train": 128, "num_val": 64, "min_length": 8, "max_length": 24}},
    "model": {"plugin": "conv1d", "args": {"width": 16, "depth": 2}},
    "optimizer": {"plugin": "adamw", "args": {"lr": 1.0e-2}},
    "train": {"epochs": 2, "batch_size": 32, "device": "cpu", "cpu_threads": 1},
    "search": {"n_trials": 2, "space": {"model.args.dropout": {"type": "float", "low": 0.1, "high": 0.3}}},
    "tracking": {"enabled": False},
    "export": {"formats": []},
}


def table(out: Path) -> list:
    trials = json.loads((out / "summary.json").read_text())["trials"]
    return [(t["number"], t["state"], t["params"], t["value"], t["seed"], learned(t["history"])) for t in trials]


def run(tmp_path: Path, label: str, spec: dict, *overrides: str) -> Path:
    path = tmp_path / f"{label}.yaml"
    path.write_text(json.dumps(spec))
    sweeper("run", str(path), *overrides, "--out", str(tmp_path / label), "-q", check=True)
    return tmp_path / label


@pytest.fixture(scope="module")
def sequence_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("loading")
    return {workers: run(root, f"w{workers}", SEQUENCES, f"data.num_workers={workers}") for workers in (0, 2)}


def test_a_sweep_on_variable_length_sequences_runs_to_the_end(sequence_runs):
    summary = json.loads((sequence_runs[0] / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["best"]["value"] > 0.5  # 4 classes: chance is 0.25


def test_zero_and_two_workers_give_the_same_trial_table(sequence_runs):
    # params, states, seeds and every learned metric, bitwise (dropout draws included: the
    # loaders' worker seeds come from their own generators, not from the trial's global RNG)
    assert table(sequence_runs[2]) == table(sequence_runs[0])


def test_data_splits_through_a_loader_train_as_on_the_tensor_path(tmp_path: Path):
    spec = {
        **SEQUENCES,
        "dataset": {"plugin": "digits"},
        "model": {"plugin": "mlp", "args": {"hidden": 32, "depth": 1}},
        "search": {"n_trials": 2, "space": {"model.args.dropout": {"type": "float", "low": 0.1, "high": 0.3}}},
    }
    tensors = run(tmp_path, "tensors", spec)
    loader = run(tmp_path, "loader", spec, "data.path=loader", "data.num_workers=0")
    assert table(loader) == table(tensors)  # the same batches, in the same order
    summary = json.loads((loader / "summary.json").read_text())
    assert summary["best"]["value"] > 0.8  # digits, 10 classes


def test_pad_collate_pads_at_the_end_and_masks_the_padding():
    x, y, mask = pad_collate([(torch.ones(3), torch.tensor(1)), (torch.ones(5), torch.tensor(0))])
    assert x.shape == (2, 5) and y.tolist() == [1, 0]
    assert mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert x[0, 3:].eq(0).all()
    channels, _, mask = pad_collate([(torch.ones(2, 4), 0), (torch.ones(2, 6), 1)])
    assert channels.shape == (2, 2, 6) and mask.sum(1).tolist() == [4, 6]


def test_validate_estimate_names_the_data_path(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(SEQUENCES))
    out = sweeper("validate", str(path), "--estimate", "data.num_workers=0", check=True).stdout
    assert "# data path: DataLoader, no workers" in out
    # the tensor path's need, from the longest sample: float32 of sample_shape per sample, int64 targets
    spec = SweepSpec.model_validate(SEQUENCES)
    data = load_data(spec, torch.device("cpu"))[0]
    samples = len(data.train_y) + len(data.val_y)
    assert tensor_bytes(data) == samples * (4 * math.prod(data.sample_shape) + 8)
    assert "; the tensor path would hold " in out and " on cpu" in out


def test_padded_sequences_export_with_a_dynamic_length_and_skip_the_registry(workdir: Path, mlflow_uri: str):
    """A sweep on padded sequences, tracking on: the best model exports to TorchScript, .pt2 and
    ONNX taking (x, mask), each file checked without sweeper at two lengths (and the whole padded
    validation split); the MLflow registration is skipped, and the summary says why."""
    spec = {
        **SEQUENCES,
        "name": "padded-export",
        "search": {"n_trials": 1},
        "train": {**SEQUENCES["train"], "epochs": 1},
        "tracking": {"experiment": "padded-export"},
        "export": {"formats": ["torchscript", "pt2", "onnx"]},
    }
    out = run(workdir, "padded", spec)
    report = json.loads((out / "export.json").read_text())
    assert report["input"]["shape"] == [None, None] and report["input"]["length_dim"] == 1
    assert report["input"]["max_length"] == 24 and report["input"]["mask"]["dtype"] == "bool"
    for entry in report["formats"]:
        assert "error" not in entry, entry
        lengths = {case.split("x")[1] for case in entry["parity_max_abs_diff"]}
        assert len(lengths) == 2 and entry["max_abs_diff"] <= 1e-4  # two lengths, one file
        assert entry["val_acc"] == entry["eager_val_acc"]
    summary = json.loads((out / "summary.json").read_text())
    assert "skipped" in summary["registry"] and "mask" in summary["registry"]["skipped"]
    assert MlflowClient(mlflow_uri).search_registered_models(filter_string="name='padded-export'") == []


def test_a_recurrent_model_on_padded_sequences_refuses_pt2(tmp_path: Path):
    path = tmp_path / "s.yaml"
    spec = {**SEQUENCES, "model": {"plugin": "gru", "args": {"hidden": 16}}, "search": {"n_trials": 1}}
    path.write_text(json.dumps({**spec, "export": {"formats": ["onnx", "pt2"]}}))
    proc = sweeper("validate", str(path))
    assert proc.returncode == 2
    assert "export.formats" in proc.stderr and "nn.GRU" in proc.stderr and "drop pt2" in proc.stderr
    assert "Traceback" not in proc.stderr
    path.write_text(json.dumps({**spec, "export": {"formats": ["torchscript", "onnx"]}}))
    sweeper("validate", str(path), check=True)


def test_a_train_transform_on_the_loader_path_is_refused(tmp_path: Path):
    write_tiny_cifar(tmp_path / "cifar")
    spec = write_spec(
        tmp_path / "c.yaml",
        dataset={"plugin": "cifar10", "args": {"root": str(tmp_path / "cifar"), "download": False}},
        data={"path": "loader"},
    )
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2
    assert "data.path: loader" in proc.stderr and "train_transform" in proc.stderr


def test_loader_workers_under_parallel_worker_processes_are_refused(tmp_path: Path):
    spec = write_spec(tmp_path / "p.yaml", data={"num_workers": 2}, search={"n_trials": 2, "parallel": 2})
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2
    assert "data.num_workers" in proc.stderr and "search.parallel" in proc.stderr


def test_the_shipped_sequences_space_sweeps_and_exports(workdir: Path):
    """search_spaces/sequences.yaml cut to seconds: padded sequences through a DataLoader, the
    architecture searched, the best model exported (x, mask) and checked at two lengths."""
    small = ["dataset.args.num_train=128", "dataset.args.num_val=64", "search.n_trials=2", "train.epochs=1"]
    sweeper("run", str(SPACES / "sequences.yaml"), *small, "tracking.enabled=false", "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert summary["counts"] == {"complete": 2}
    assert {f["format"] for f in summary["export"]["formats"] if "error" not in f} == {"torchscript", "onnx"}
