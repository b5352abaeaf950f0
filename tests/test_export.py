"""Export: TorchScript, torch.export (.pt2) and ONNX files that load without sweeper, match the
eager model at two batch sizes, and are registered in MLflow with a champion alias."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import sweeper, write_spec
from mlflow.tracking import MlflowClient
from torch import nn

from sweeper.plugin import DataSplits
from sweeper.spec import ExportSpec

FILES = {"torchscript": "model.torchscript.pt", "pt2": "model.pt2", "onnx": "model.onnx"}
ARCH = {"mlp": {"hidden": 16}, "cnn": {"channels": 8, "blocks": 1}, "resnet18": {"width": 8}}

# A consumer that knows nothing of sweeper: loads each file with its own runtime, runs the inputs.
CONSUMER = """
import json, sys, warnings
import numpy as np, onnxruntime, torch
warnings.simplefilter("ignore")
files, out = json.loads(sys.argv[1]), {}
for fmt, path in files.items():
    for b in (1, 33):
        x = np.load(f"x{b}.npy")
        if fmt == "onnx":
            s = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            y = s.run(None, {s.get_inputs()[0].name: x})[0]
        else:
            m = torch.jit.load(path) if fmt == "torchscript" else torch.export.load(path).module()
            y = m(torch.from_numpy(x)).detach().numpy()
        np.save(f"{fmt}{b}.npy", y)
assert not [m for m in sys.modules if m.startswith("sweeper")], "a consumer must not need sweeper"
"""


def eager_model(out: Path, data: DataSplits) -> nn.Module:
    from sweeper.spec import SweepSpec
    from sweeper.trial import checkpoint
    from sweeper.trial.build import build_model

    summary = json.loads((out / "summary.json").read_text())
    model = build_model(SweepSpec.model_validate(summary["spec"]).with_values(summary["best"]["params"]), data)
    model.load_state_dict(checkpoint.load(Path(summary["best"]["checkpoint"]))["model"])
    return model.eval()


@pytest.mark.parametrize("arch", list(ARCH))
def test_sweep_exports_verified_files_and_registers_the_model(arch: str, workdir: Path, mlflow_uri: str):
    name = f"export-{arch}"
    spec = write_spec(
        workdir / "s.yaml",
        model={"plugin": arch, "args": ARCH[arch]},
        dataset={
            "plugin": "synthetic",
            "args": {"num_train": 128, "num_val": 64, "input_shape": [1, 8, 8], "num_classes": 3},
        },
        search={"n_trials": 1, "space": {}},
        tracking={"experiment": name},
        export={"formats": ["torchscript", "pt2", "onnx"], "registered_name": name},
    )
    sweeper("run", str(spec), "train.epochs=1", "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    report = json.loads((workdir / "out" / "export.json").read_text())

    # export.json: every format verified by sweeper at batch sizes 1 and 33
    assert report["input"] == {"shape": [None, 1, 8, 8], "dtype": "float32", "batch_dim": 0}
    assert report["source"]["trial"] == summary["best"]["number"]
    assert [e["format"] for e in report["formats"]] == list(FILES)
    for e in report["formats"]:
        assert "error" not in e, e["error"]
        assert Path(e["path"]).name == FILES[e["format"]] and e["bytes"] == Path(e["path"]).stat().st_size
        assert set(e["parity_max_abs_diff"]) == {"1", "33"} and e["max_abs_diff"] <= 1e-4
        assert e["val_acc"] == report["eager_val_acc"] == summary["best"]["value"]

    # the same files, checked here by a consumer process that never imports sweeper
    from sweeper_plugins.datasets import synthetic

    data = synthetic(num_train=128, num_val=64, input_shape=(1, 8, 8), num_classes=3, seed=0)
    model = eager_model(workdir / "out", data)
    for b in (1, 33):
        np.save(workdir / f"x{b}.npy", data.val_x[:b].numpy())
    files = {fmt: str(workdir / "out" / f) for fmt, f in FILES.items()}
    subprocess.run([sys.executable, "-c", CONSUMER, json.dumps(files)], check=True, capture_output=True)
    for fmt in FILES:
        for b in (1, 33):
            with torch.no_grad():
                expected = model(data.val_x[:b]).numpy()
            assert np.abs(np.load(workdir / f"{fmt}{b}.npy") - expected).max() <= 1e-4, (fmt, b)

    # MLflow: files on the sweep's run; a registered version with signature, example and alias
    client = MlflowClient(mlflow_uri)
    parent = summary["mlflow"]["parent_run_id"]
    assert {"export.json", *FILES.values()} <= {a.path for a in client.list_artifacts(parent)}
    assert summary["registry"]["version"] == 1 and summary["registry"]["champion"] is True
    champion = client.get_model_version_by_alias(name, "champion")
    assert int(champion.version) == 1 and champion.run_id == parent
    import mlflow

    mlflow.set_tracking_uri(mlflow_uri)
    info = mlflow.models.get_model_info(f"models:/{name}@champion")
    assert info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"] == (-1, 1, 8, 8)
    assert info.saved_input_example_info is not None
    served = mlflow.pyfunc.load_model(f"models:/{name}@champion").predict(data.val_x[:5].numpy())
    with torch.no_grad():
        assert np.abs(np.asarray(served) - model(data.val_x[:5]).numpy()).max() <= 1e-4


def test_champion_moves_only_to_a_better_version(workdir: Path, mlflow_uri: str):
    from sweeper.export import publish
    from sweeper.spec import SweepSpec
    from sweeper_plugins.datasets import synthetic
    from sweeper_plugins.models import mlp

    data = synthetic(num_train=8, num_val=8, input_shape=(1, 4, 4), num_classes=3)
    spec = SweepSpec.model_validate(
        {
            "name": "champ",
            "dataset": {"plugin": "synthetic"},
            "model": {"plugin": "mlp"},
            "optimizer": {"plugin": "adam"},
            "export": {"registered_name": "champion-test"},
        }
    )
    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("champion-test")
    results = []
    for value in (0.5, 0.4, 0.7):  # val_acc, maximized
        run = client.create_run(exp).info.run_id
        results.append(
            publish.publish(
                publish.registration(
                    mlp(input_shape=(1, 4, 4), num_classes=3, hidden=8), data, spec, mlflow_uri, run, {"val_acc": value}
                )
            )
        )
    assert [(r["version"], r["champion"]) for r in results] == [(1, True), (2, False), (3, True)]
    assert "does not beat champion version 1" in results[1]["reason"]
    assert client.get_model_version_by_alias("champion-test", "champion").version == 3


def test_a_multi_objective_champion_moves_when_export_choose_picks_the_new_model(mlflow_uri: str):
    from mlflow.tracking import MlflowClient

    from sweeper.export import publish
    from sweeper.spec import SweepSpec
    from sweeper_plugins.datasets import synthetic
    from sweeper_plugins.models import mlp

    data = synthetic(num_train=8, num_val=8, input_shape=(1, 4, 4), num_classes=3)
    spec = SweepSpec.model_validate(
        {
            "name": "front",
            "dataset": {"plugin": "synthetic"},
            "model": {"plugin": "mlp"},
            "optimizer": {"plugin": "adam"},
            "objectives": [{"metric": "val_acc"}, {"metric": "params", "direction": "minimize"}],
            "export": {"registered_name": "front-test", "choose": {"prefer": "params", "within": {"val_acc": 0.01}}},
        }
    )
    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("front-test")
    results = []
    # a smaller model as accurate (picked), a smaller one far less accurate (not), a bigger one (not)
    for values in (
        {"val_acc": 0.90, "params": 900.0},
        {"val_acc": 0.895, "params": 500.0},
        {"val_acc": 0.70, "params": 100.0},
        {"val_acc": 0.95, "params": 5000.0},
    ):
        run = client.create_run(exp).info.run_id
        results.append(
            publish.publish(
                publish.registration(
                    mlp(input_shape=(1, 4, 4), num_classes=3, hidden=8), data, spec, mlflow_uri, run, values
                )
            )
        )
    assert [r["champion"] for r in results] == [True, True, False, True]
    assert "export.choose does not pick val_acc=0.7, params=100 over champion version 2" in results[2]["reason"]
    assert client.get_model_version_by_alias("front-test", "champion").version == 4


class Gated(nn.Module):
    """Data-dependent control flow: the sign of the batch's mean picks one of two heads."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 3), nn.Linear(16, 3)

    def forward(self, x):
        x = x.flatten(1)
        if bool(x.mean() > 0):
            return self.a(x)
        return self.b(x)


class GatedVarargs(Gated):
    def forward(self, x, *rest):  # TorchScript cannot compile *args: scripting fails, tracing is used
        return super().forward(x)


def gated_data(val_x: torch.Tensor) -> DataSplits:
    return DataSplits(
        train_x=val_x,
        train_y=torch.zeros(len(val_x), dtype=torch.int64),
        val_x=val_x,
        val_y=torch.zeros(len(val_x), dtype=torch.int64),
        num_classes=3,
        class_names=("x", "y", "z"),
    )


@pytest.mark.filterwarnings("ignore:.*torch.jit:FutureWarning")
def test_scripting_keeps_both_branches(workdir: Path):
    from sweeper.export import export_model

    torch.manual_seed(0)
    model = Gated().eval()
    x = torch.randn(40, 1, 4, 4).abs()
    report = export_model(model, gated_data(x), workdir, ExportSpec(formats=["torchscript"]))
    entry = report["formats"][0]
    assert entry["method"] == "script" and not entry["warnings"] and "error" not in entry
    scripted = torch.jit.load(entry["path"])
    with torch.no_grad():  # the branch the validation data never took works too
        assert torch.allclose(scripted(-x), model(-x))


@pytest.mark.filterwarnings("ignore:.*torch.jit:FutureWarning")
def test_trace_fallback_warns_and_other_formats_survive_a_failure(workdir: Path):
    from sweeper.export import export_model

    torch.manual_seed(0)
    model = GatedVarargs().eval()
    x = torch.randn(40, 1, 4, 4).abs()  # every batch has a positive mean: one path only
    report = export_model(model, gated_data(x), workdir / "one-path", ExportSpec(formats=["pt2", "torchscript"]))
    pt2, ts = report["formats"]
    assert pt2["error"].startswith("pt2: export failed")  # torch.export refuses the data-dependent branch
    assert "error" not in ts and ts["method"] == "trace"
    assert "torch.jit.script failed" in ts["warnings"][0]
    assert "data-dependent control flow" in ts["warnings"][1] and "only the path" in ts["warnings"][1]
    with torch.no_grad():  # what the warning means: the other branch is lost
        assert not torch.allclose(torch.jit.load(ts["path"])(-x), model(-x))

    # validation rows 8..32 drag the batch-33 mean negative: the traced file is caught differing
    x[8:33] *= -3
    report = export_model(model, gated_data(x), workdir / "two-paths", ExportSpec(formats=["torchscript"]))
    error = report["formats"][0]["error"]
    assert error.startswith("torchscript: model.torchscript.pt differs from the eager model at batch size 33")
    assert "max |diff|" in error and "> atol 0.0001" in error
    assert json.loads((workdir / "two-paths" / "export.json").read_text())["formats"][0]["error"] == error


@pytest.mark.filterwarnings("ignore:.*torch.jit:FutureWarning")
def test_one_consumer_process_checks_every_file_and_a_dead_one_is_replaced(workdir: Path):
    import os
    import signal

    from sweeper.export import export_model, verify
    from sweeper.export.inputs import Cases, Signature

    torch.manual_seed(0)
    model, data = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval(), gated_data(torch.randn(40, 1, 4, 4))
    report = export_model(model, data, workdir / "a", ExportSpec(formats=["torchscript", "onnx"]))
    assert all("error" not in f for f in report["formats"]), report
    consumer = verify.consumer()
    assert consumer.proc.poll() is None  # still up after both checks: they shared it
    report = export_model(model, data, workdir / "b", ExportSpec(formats=["pt2"]))
    assert "error" not in report["formats"][0] and verify.consumer() is consumer

    # a file it cannot load fails its own check only: the same process checks the next file
    (workdir / "bad.pt").write_bytes(b"not a model")
    cases = Cases.of(data, Signature.of(data), example_rows=8)
    ref = verify.Reference.compute(model, cases, data.val_y, workdir)
    with pytest.raises(verify.ExportError, match="bad.pt: reloading in a Python process without sweeper failed"):
        verify.check("torchscript", workdir / "bad.pt", ref, 1e-4)
    assert verify.consumer() is consumer and consumer.proc.poll() is None

    # killed (an OOM kill, say): the next check starts a new one
    os.kill(consumer.proc.pid, signal.SIGKILL)
    consumer.proc.wait()
    report = export_model(model, data, workdir / "c", ExportSpec(formats=["torchscript"]))
    assert "error" not in report["formats"][0] and verify.consumer() is not consumer


def test_int8_quantization_measures_the_accuracy_change(workdir: Path):
    from sweeper.export import export_model
    from sweeper_plugins.datasets import digits
    from sweeper_plugins.models import mlp

    torch.manual_seed(0)
    data = digits()
    report = export_model(
        mlp(input_shape=data.input_shape, num_classes=10, hidden=32),
        data,
        workdir,
        ExportSpec(formats=["onnx"], quantize=True),
    )
    onnx, int8 = report["formats"]
    assert "error" not in onnx and "error" not in int8
    assert int8["path"].endswith("model.int8.onnx") and int8["max_abs_diff"] > 0  # int8 is not fp32
    side = json.loads(Path(int8["path"] + ".json").read_text())
    assert side["val_acc_change"] == pytest.approx(side["val_acc"] - report["eager_val_acc"])
    assert report["class_names"] == [str(d) for d in range(10)] and report["normalization"]["std"]


def test_export_a_trial_later_and_predict_with_the_file(workdir: Path, mlflow_uri: str):
    spec = write_spec(
        workdir / "s.yaml",
        dataset={"plugin": "digits", "args": {"val_fraction": 0.2}},
        model={"plugin": "mlp", "args": {"hidden": 16}},
        search={"n_trials": 2, "space": {"optimizer.args.lr": {"type": "categorical", "choices": [1.0e-2, 1.0e-3]}}},
        tracking={"experiment": "export-later"},
        export={"formats": ["torchscript"], "keep_checkpoints": "all"},
    )
    sweeper("run", str(spec), "train.epochs=1", "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    other = next(t for t in summary["trials"] if t["number"] != summary["best"]["number"])
    assert len(list((workdir / "out" / "checkpoints").iterdir())) == 2  # keep_checkpoints: all

    proc = sweeper("export", other["mlflow_run_id"], "--formats", "onnx,pt2", "--out", "later", check=True)
    report = json.loads((workdir / "later" / "export.json").read_text())
    assert report["source"]["trial"] == other["number"] and [e["format"] for e in report["formats"]] == ["onnx", "pt2"]
    assert report["eager_val_acc"] == other["value"] and "later/model.onnx" in proc.stdout
    logged = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(other["mlflow_run_id"], "export")}
    assert {"export/model.onnx", "export/model.pt2", "export/export.json"} <= logged

    from sweeper_plugins.datasets import digits

    data = digits(val_fraction=0.2, seed=0)
    np.save(workdir / "x.npy", data.val_x[:4].numpy())
    proc = sweeper("predict", "later/model.onnx", "x.npy", "--out", "logits.npy", check=True)
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    logits = np.load(workdir / "logits.npy")
    assert [(int(r[0]), int(r[1]), r[2]) for r in rows] == [(i, int(c), str(c)) for i, c in enumerate(logits.argmax(1))]

    (workdir / "out" / "checkpoints" / f"trial-{other['number']:05d}.pt").unlink()
    proc = sweeper("export", other["mlflow_run_id"])
    assert proc.returncode == 2 and "export.keep_checkpoints: all" in proc.stderr and "Traceback" not in proc.stderr
    proc = sweeper("predict", "later/model.onnx", "s.yaml")
    assert proc.returncode == 2 and "s.yaml" in proc.stderr and ".npy" in proc.stderr


def test_bad_export_specs_are_user_errors(workdir: Path):
    spec = write_spec(workdir / "s.yaml", export={"formats": ["torchscript"], "quantize": True})
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2 and "add onnx to export.formats" in proc.stderr
    proc = sweeper("validate", str(spec), "export.formats=[tflite]", "export.quantize=false")
    assert proc.returncode == 2 and "export.formats.0" in proc.stderr and "'pt2'" in proc.stderr
