"""The spec: loading, overrides, and one clear error (exit 2, no traceback) per kind of mistake."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
from conftest import SPACES, sweeper, write_spec, write_tiny_cifar
from typer.testing import CliRunner

from sweeper import spec as spec_mod
from sweeper.cli import app
from sweeper.errors import UserError

runner = CliRunner()


def validate(*args: str):
    """`sweeper validate` in this process. CliRunner catches exceptions instead of printing them:
    anything but typer's own exit (a user error's code 2) would be a traceback for a user."""
    result = runner.invoke(app, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), "".join(
        traceback.format_exception(result.exception)
    )
    return result.exit_code, result.output


def test_shipped_specs_validate(workdir: Path):
    write_tiny_cifar(workdir / "tiny", per_batch=240)  # validate dry-builds on data: 1,080 training samples
    for name, overrides in (("smoke", []), ("digits", []), ("cifar", ["dataset.args.root=tiny"])):
        code, out = validate(str(SPACES / f"{name}.yaml"), *overrides)
        assert code == 0, out
        assert "# budget:" in out and "# plugins:" in out and "# dry build:" in out


def test_a_new_spec_exports_pt2_and_onnx_not_the_deprecated_torchscript(tmp_path: Path):
    spec = spec_mod.load(write_spec(tmp_path / "new.yaml", export={}))
    assert spec.export.formats == ["pt2", "onnx"]  # docs/export.md: TorchScript only when listed
    assert spec_mod.load(SPACES / "smoke.yaml").export.formats == ["torchscript"]  # a written list is kept


def test_overrides_set_nested_fields_and_space_keys():
    spec = spec_mod.load(
        SPACES / "smoke.yaml",
        [
            "train.epochs=7",
            "search.n_trials=2",
            "search.space.optimizer.args.lr.high=0.5",
            "model.args={hidden: 8}",
            "search.space.model.args.hidden={type: int, low: 4, high: 9}",
        ],
    )
    assert spec.train.epochs == 7 and spec.search.n_trials == 2
    assert spec.search.space["optimizer.args.lr"].high == 0.5
    assert spec.model.args == {"hidden": 8}
    assert spec.search.space["model.args.hidden"].high == 9  # an existing space key replaced whole


def test_scientific_notation_is_a_float(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text((SPACES / "smoke.yaml").read_text().replace("lr: 1.0e-2", "lr: 1e-2"))
    assert spec_mod.load(path).optimizer.args["lr"] == 0.01
    assert spec_mod.load(path, ["optimizer.args.lr=3e-4"]).optimizer.args["lr"] == 3e-4


def test_unset_plugin_args_mean_the_plugins_default():
    spec = spec_mod.load(SPACES / "smoke.yaml", ["model.args.hidden=null"])
    assert "hidden" not in spec.model.args


def test_with_values_applies_searched_values():
    spec = spec_mod.load(SPACES / "smoke.yaml")
    trial = spec.with_values({"optimizer.args.lr": 0.5, "train.batch_size": 16})
    assert trial.optimizer.args["lr"] == 0.5 and trial.train.batch_size == 16
    assert spec.optimizer.args["lr"] == 0.01  # the original is untouched


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.epochz=3"], "train.epochz: unknown key; expected one of: epochs, batch_size"),
        (["train.epochs=three"], "train.epochs: Input should be a valid integer"),
        (["train.epochs=0"], "train.epochs: Input should be greater than or equal to 1"),
        (["search.space.optimizer.args.lr.low=2.0"], "search.space.optimizer.args.lr: low (2.0) must be <= high"),
        (["search.space.optimizer.args.lr.low=0"], "log scale needs low > 0"),
        (["search.space.optimizer.args.lr.type=floaty"], "search.space.optimizer.args.lr: Input tag 'floaty'"),
        (
            ["search.space.train.batch_size={type: float, low: 0.5, high: 2.5}"],
            "search.space.train.batch_size: value 0.5 does not fit the spec",
        ),
        (["search.space.seed={type: int, low: 0, high: 3}"], "'seed' cannot be searched"),
        (
            ["search.space.train.epochs={type: int, low: 1, high: 3, when: {model.args.depth: 2}}"],
            "refers to 'model.args.depth', which is not a parameter of the space",
        ),
        (["model.plugin=resnet19"], "unknown model plugin 'resnet19'. Did you mean 'resnet18'?"),
        (["search.storage=postgresql+psycopg://ana:s3cret@db/sweeps"], "search.storage holds a password"),
        (["tracking.mlflow_uri=https://ana:s3cret@mlflow:5000"], "tracking.mlflow_uri holds a password"),
        (["search.heartbeat_s=60"], "lease_s (60) must exceed heartbeat_s (60)"),
        (["optimizer.args.momentm=0.9"], "optimizer.args.momentm: optimizer plugin 'adam' has no argument"),
        (
            ["search.space.optimizer.args.momentm={type: float, low: 0.1, high: 0.9}"],
            "optimizer.args.momentm: optimizer plugin 'adam' has no argument 'momentm'",
        ),
        (["model.args.input_shape=[1, 2]"], "model.args.input_shape: set by sweeper itself"),
        (["train.epochs"], "override 'train.epochs': expected dotted.path=value"),
        (["train.epochs.max=3"], "'train.epochs' is a value, not a section"),
        (["train.epochs=[1"], "override train.epochs:1:3: invalid YAML"),
        (["search.pruner.type=pbt"], "search.pruner.type: 'pbt' is a Ray Tune scheduler and backend is 'optuna'"),
        (["search.backend=ray", "search.pruner.type=pbt"], "search.pruner.type: 'pbt' needs search.sampler: random"),
        (
            [
                "search.backend=ray",
                "search.sampler=random",
                "search.pruner={type: pbt, mutations: [model.args.hidden]}",
            ],
            "search.pruner.mutations: 'model.args.hidden' cannot change mid-training",
        ),
    ],
)
def test_each_user_error_is_one_clear_message(overrides: list[str], expected: str):
    code, out = validate(str(SPACES / "smoke.yaml"), *overrides)
    assert code == 2, out
    assert expected in " ".join(out.split()), out


def test_conditional_args_bind_only_to_their_plugin():
    # momentum exists for sgd, not adamw: allowed because it is sampled only when sgd is chosen
    code, out = validate(
        str(SPACES / "smoke.yaml"),
        "optimizer.plugin=sgd",
        "search.space.optimizer.plugin={type: categorical, choices: [sgd, adamw]}",
        "search.space.optimizer.args.momentum={type: float, low: 0.5, high: 0.9, when: {optimizer.plugin: sgd}}",
    )
    assert code == 0, out
    code, out = validate(
        str(SPACES / "smoke.yaml"),
        "optimizer.plugin=sgd",
        "search.space.optimizer.plugin={type: categorical, choices: [sgd, adamw]}",
        "search.space.optimizer.args.momentum={type: float, low: 0.5, high: 0.9}",
    )
    assert code == 2 and "optimizer plugin 'adamw' has no argument 'momentum'" in " ".join(out.split())


def test_bad_yaml_names_file_line_and_column(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndataset: {plugin: digits\n")
    code, out = validate(str(bad))
    assert code == 2 and f"{bad}:3:1: invalid YAML" in " ".join(out.split())


def test_missing_file_and_non_mapping(tmp_path: Path):
    code, out = validate(str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read the spec" in out
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    code, out = validate(str(tmp_path / "list.yaml"))
    assert code == 2 and "expected a mapping of spec sections" in " ".join(out.split())


def test_missing_sections_are_named(tmp_path: Path):
    (tmp_path / "s.yaml").write_text("name: x\n")
    code, out = validate(str(tmp_path / "s.yaml"))
    assert code == 2
    for section in ("dataset: Field required", "model: Field required", "optimizer: Field required"):
        assert section in out


def test_grid_sampler_needs_discrete_values():
    with pytest.raises(UserError, match="the grid sampler needs discrete values"):
        spec_mod.load(SPACES / "smoke.yaml", ["search.sampler=grid"])
    spec = spec_mod.load(
        SPACES / "smoke.yaml",
        ["search.sampler=grid", "search.space.optimizer.args.lr.log=false", "search.space.optimizer.args.lr.step=0.05"],
    )
    assert "4 trials" in spec.budget()  # 2 lr values x 2 widths, capped by n_trials=4


def test_real_cli_exits_2_without_traceback(tmp_path: Path):
    proc = sweeper("run", str(SPACES / "smoke.yaml"), "model.plugin=nope")
    assert proc.returncode == 2
    assert "unknown model plugin 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_schema_is_published_json():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0 and result.exception is None
    schema = json.loads(result.output)
    assert {"dataset", "model", "optimizer", "search", "train"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_a_ray_trial_that_must_use_cuda_reserves_a_gpu():
    ray = ["search.backend=ray", "search.pruner.type=asha", "train.device=cuda"]
    with pytest.raises(UserError, match="train.device is 'cuda' but search.resources.gpu is 0: Ray hides every GPU"):
        spec_mod.load(SPACES / "smoke.yaml", [*ray, "search.resources.gpu=0"])
    assert spec_mod.load(SPACES / "smoke.yaml", ray).search.resources.gpu is None  # unset: 1 where the cluster has GPUs
