"""Plugin registry over entry points, and search-space sampling (conditional parameters)."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest

from sweeper.errors import UserError
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import bind_args
from sweeper.spec import SearchSpec
from sweeper.spec import space as sp


def test_builtins_register_through_entry_points():
    names = {(p.kind, p.name) for p in registry.list_plugins()}
    for expected in [
        ("models", "mlp"),
        ("models", "cnn"),
        ("models", "resnet18"),
        ("datasets", "cifar10"),
        ("datasets", "digits"),
        ("datasets", "synthetic"),
        ("optimizers", "sgd"),
        ("optimizers", "adam"),
        ("optimizers", "adamw"),
        ("schedules", "none"),
        ("schedules", "onecycle"),
        ("schedules", "cosine"),
        ("schedules", "step"),
        ("schedules", "plateau"),
    ]:
        assert expected in names
    assert {p.distribution for p in registry.list_plugins()} == {"sweeper"}


def test_listing_imports_no_plugin():
    code = (
        "import sys; from sweeper.pluginhost.registry import list_plugins; assert len(list_plugins()) >= 14; "
        "print([m for m in sys.modules if m.startswith(('sweeper_plugins', 'torch'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_lists_what_is_available():
    with pytest.raises(
        UserError,
        match=r"unknown dataset plugin 'digit'\. Did you mean 'digits'\?.*"
        r"Available: cifar10, diabetes, digits, image_folder, mnist1d, sequences, synthetic, synthetic_multilabel, "
        r"tabular, torchvision",
    ):
        registry.get("datasets", "digit")


def test_qualified_name_pins_a_distribution():
    assert registry.get("models", "sweeper:mlp") is registry.get("models", "mlp")
    with pytest.raises(UserError, match="unknown model plugin 'other:mlp'"):
        registry.get("models", "other:mlp")


def test_bind_args_checks_signatures():
    bind_args("optimizers", "sgd", {"lr": 0.1, "momentum": 0.9}, "optimizer.args")
    with pytest.raises(
        UserError,
        match="model.args.widht: model plugin 'resnet18' has no argument 'widht' "
        r"\(did you mean 'width'\?\); it accepts: width",
    ):
        bind_args("models", "resnet18", {"widht": 3}, "model.args")


def _space(**params) -> dict:
    return SearchSpec.model_validate({"space": params}).space


def test_conditional_parameters_are_sampled_only_when_their_condition_holds():
    space = _space(
        **{
            "optimizer.plugin": {"type": "categorical", "choices": ["sgd", "adam"]},
            "optimizer.args.momentum": {"type": "float", "low": 0.5, "high": 0.9, "when": {"optimizer.plugin": "sgd"}},
            "optimizer.args.lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
            "train.batch_size": {"type": "int", "low": 16, "high": 64, "step": 16},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        values = sp.suggest(space, trial)
        assert ("optimizer.args.momentum" in values) == (values["optimizer.plugin"] == "sgd")
        assert 1e-4 <= values["optimizer.args.lr"] <= 1.0
        assert values["train.batch_size"] in (16, 32, 48, 64)
        seen.add(values["optimizer.plugin"])
        study.tell(trial, 0.0)
    assert seen == {"sgd", "adam"}


def test_conditions_are_ordered_and_cycles_rejected():
    # the dependent parameter is declared first, yet sampled after the one it depends on
    space = _space(
        **{
            "model.args.hidden": {"type": "int", "low": 1, "high": 4, "when": {"model.plugin": "mlp"}},
            "model.plugin": {"type": "categorical", "choices": ["mlp", "cnn"]},
        }
    )
    assert [p for p, _ in sp.ordered(space)] == ["model.plugin", "model.args.hidden"]
    with pytest.raises(ValueError, match="form a cycle"):
        _space(
            **{
                "model.args.a": {"type": "categorical", "choices": [1], "when": {"model.args.b": 1}},
                "model.args.b": {"type": "categorical", "choices": [1], "when": {"model.args.a": 1}},
            }
        )


def test_grid_values():
    assert sp.grid_values("p", sp.IntParam(type="int", low=1, high=7, step=3)) == [1, 4, 7]
    assert sp.grid_values("p", sp.FloatParam(type="float", low=0.1, high=0.3, step=0.1)) == [0.1, 0.2, 0.3]
