"""The plugins meet sweeper's contract (sweeper.testing), and the shipped spec is valid."""

import subprocess
import sys
import warnings
from pathlib import Path

from sweeper.testing import PluginExportWarning, check_dataset_plugin, check_model_plugin, check_optimizer_plugin


def test_gated_mlp():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginExportWarning)  # an export problem fails this test
        report = check_model_plugin("gated_mlp", input_shape=(2,), num_classes=3)
    assert "exports to TorchScript (reloaded, same outputs)" in report.passed
    assert "exports to ONNX (reloaded, same outputs)" in report.passed
    check_model_plugin("gated_mlp", args={"width": 8, "depth": 3, "dropout": 0.5}, export=False)


def test_spirals():
    report = check_dataset_plugin("spirals", args={"arms": 4})
    assert report.distribution == "sweeper-plugin-example"


def test_lion():
    check_optimizer_plugin("lion")
    check_optimizer_plugin("lion", args={"lr": 1e-3, "beta1": 0.8, "weight_decay": 0.1})


def test_shipped_spec_validates(tmp_path: Path):
    def sweeper(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "sweeper", *args], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    sweeper("init", "--from", "spirals", "--out", "spec.yaml")
    out = sweeper("validate", "spec.yaml")
    assert "model.gated_mlp=sweeper-plugin-example==0.1.0" in out
