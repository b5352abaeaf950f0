"""Priors declared by plugins (``Annotated[float, LogUniform(...)]``) and the search space that
``search.space: auto`` / ``--auto`` derives from them: a choice among plugins with each plugin's
arguments conditioned on it, the training settings, hand-written entries winning entry by entry."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from conftest import SPACES, make_dist, sweeper, write_spec

from sweeper.errors import UserError
from sweeper.plugin import Choice, IntRange, LogUniform, Uniform
from sweeper.pluginhost import registry
from sweeper.pluginhost.auto_space import HAND_WRITTEN, derive
from sweeper.pluginhost.binding import factory_annotations
from sweeper.pluginhost.priors import annotated_priors, declared, prior_text
from sweeper.spec import SweepSpec, validate
from sweeper.spec import space as sp

THIRD_PARTY = '''
from typing import Annotated
from pydantic import Field
from torch import nn
from sweeper.plugin import Choice, IntRange, LogUniform

def tiny(
    *,
    input_shape,
    num_classes,
    width: Annotated[int, Field(ge=1), IntRange(4, 64, log=True)] = 8,
    act: Annotated[str, Choice("relu", "tanh")] = "relu",
    gain: Annotated[float, LogUniform(0.5, 2.0, when={"act": "tanh"})] = 1.0,
    bias: bool = True,
):
    """A linear model with one hidden layer; ``gain`` scales the tanh."""
    import math
    act_layer = nn.ReLU() if act == "relu" else nn.Tanh()
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width, bias=bias), act_layer,
                         nn.Linear(width, num_classes))
'''


def spec_with(**changes: object) -> SweepSpec:
    tree = yaml.safe_load((SPACES / "smoke.yaml").read_text())
    tree.update(changes)
    return validate(tree, "test")


def third_party(site: Path, factory: str = THIRD_PARTY) -> None:
    make_dist(site, "tiny-priors", "2.0", {"sweeper.models": {"tiny": "tiny_priors:tiny"}}, {"tiny_priors.py": factory})
    registry.refresh()


def test_prior_types_become_search_space_parameters():
    assert LogUniform(1e-5, 1.0).as_param() == {"type": "float", "low": 1e-5, "high": 1.0, "log": True}
    assert Uniform(0.0, 0.5).as_param() == {"type": "float", "low": 0.0, "high": 0.5}
    assert IntRange(16, 256, log=True).as_param() == {"type": "int", "low": 16, "high": 256, "log": True, "step": 1}
    assert Choice("relu", "gelu", when={"depth": [2, 3]}).as_param() == {
        "type": "categorical",
        "choices": ["relu", "gelu"],
    }
    assert Choice(1, 2, when={"depth": 2}).when == {"depth": 2}


def test_builtin_plugins_declare_priors_in_their_annotations():
    mlp = declared("models", "mlp")
    assert mlp["hidden"].param == sp.IntParam(type="int", low=32, high=512, log=True)
    assert mlp["dropout"].param == sp.FloatParam(type="float", low=0.0, high=0.5)
    assert "annotation of sweeper_plugins.models:mlp" in mlp["hidden"].origin
    # the prior sits beside the argument's range, which sweeper still checks (the default unchanged)
    hint = factory_annotations(registry.get("models", "mlp"))["hidden"]
    assert IntRange(32, 512, log=True) in typing.get_args(hint)
    # every built-in model, optimizer and schedule with an argument to tune declares a prior
    for kind in ("models", "optimizers", "schedules"):
        for plugin in registry.list_plugins(kind):
            if plugin.distribution == "sweeper" and plugin.name != "none":
                assert declared(kind, plugin.name), f"{kind} plugin {plugin.name} declares no prior"
    # torch's optimizer classes are plugins as they are: sweeper's table holds their priors
    sgd = declared("optimizers", "sgd")
    assert sgd["lr"].param == sp.FloatParam(type="float", low=1e-3, high=1.0, log=True)
    assert "sweeper's table for torch.optim:SGD" in sgd["lr"].origin


def test_a_third_party_plugin_declares_priors(site: Path):
    third_party(site)
    priors = declared("models", "tiny")
    assert set(priors) == {"width", "act", "gain"}  # bias declares none: it stays at its default
    assert priors["width"].param == sp.IntParam(type="int", low=4, high=64, log=True)
    assert priors["act"].param == sp.CategoricalParam(type="categorical", choices=["relu", "tanh"])
    assert priors["gain"].when == {"act": "tanh"}
    assert "annotation of tiny_priors:tiny (tiny-priors)" in priors["gain"].origin

    derived = derive(spec_with(model={"plugin": "tiny"}, search={"space": "auto"}))
    space = derived.spec.search.space
    assert space["model.args.width"] == sp.IntParam(type="int", low=4, high=64, log=True)
    assert space["model.args.gain"].when == {"model.args.act": "tanh"}  # its condition, on the spec's path
    assert "model.plugin" not in space  # one candidate: nothing to choose
    assert derived.spec.search.auto is None  # the resolved spec is explicit
    assert "model.args.gain" not in sp.suggest(space, _First())  # act: relu, its first choice
    assert sp.suggest(space, _First({"model.args.act": "tanh"}))["model.args.gain"] == 0.5

    # a condition on an argument that is not searched is decided on its fixed value or default
    def gain(model: dict[str, object]) -> sp.Param | None:
        return derive(spec_with(model=model, search={"space": "auto"})).spec.search.space.get("model.args.gain")

    assert gain({"plugin": "tiny", "args": {"act": "tanh"}}) == sp.FloatParam(type="float", low=0.5, high=2.0, log=True)
    assert gain({"plugin": "tiny", "args": {"act": "relu"}}) is None


def test_the_example_third_party_package_declares_priors(monkeypatch: pytest.MonkeyPatch):
    from conftest import REPO

    monkeypatch.syspath_prepend(str(REPO / "examples" / "sweeper-plugin-example" / "src"))
    from sweeper_plugin_example.models import gated_mlp
    from sweeper_plugin_example.optim import lion

    assert annotated_priors(lion, "optimizers") == {
        "lr": LogUniform(1e-5, 1e-3),
        "beta1": Uniform(0.8, 0.95),
        "beta2": Uniform(0.95, 0.999),
        "weight_decay": LogUniform(1e-3, 1.0),
    }
    assert annotated_priors(gated_mlp, "models")["expansion"] == Choice(1, 2, 4)
    assert prior_text(annotated_priors(gated_mlp, "models")["width"]) == "int 16..256 log"


def test_plugins_show_lists_each_argument_s_prior():
    out = sweeper("plugins", "show", "cnn", check=True).stdout
    channels = next(line for line in out.splitlines() if line.strip().startswith("channels"))
    assert channels.split()[-3:] == ["int", "16..128", "log"]


def test_a_derived_space_chooses_among_plugins_with_conditional_arguments(site: Path):
    third_party(site)
    spec = spec_with(
        model={"plugin": "mlp"},
        optimizer={"plugin": "adamw"},
        schedule={"plugin": "none"},
        search={"space": "auto", "auto": {"models": ["mlp", "cnn", "tiny"], "optimizers": ["adamw", "sgd"]}},
    )
    derived = derive(spec)
    space, sources = derived.spec.search.space, derived.sources
    assert space["model.plugin"] == sp.CategoricalParam(type="categorical", choices=["mlp", "cnn", "tiny"])
    assert space["model.args.hidden"].when == {"model.plugin": "mlp"}
    assert space["model.args.channels"].when == {"model.plugin": "cnn"}
    assert space["model.args.blocks"].when == {"model.plugin": "cnn"}
    assert space["model.args.dropout"].when == {"model.plugin": ["mlp", "cnn"]}  # shared, the same prior
    assert space["model.args.width"].when == {"model.plugin": "tiny"}
    assert space["model.args.gain"].when == {"model.plugin": "tiny", "model.args.act": "tanh"}
    # sgd's lr range and adamw's: one entry covering both
    assert space["optimizer.args.lr"] == sp.FloatParam(type="float", low=1e-5, high=1.0, log=True)
    assert space["optimizer.args.momentum"].when == {"optimizer.plugin": "sgd"}
    # the training settings: the schedule (the spec names none), batch size, label smoothing
    assert space["schedule.plugin"].choices == ["none", "cosine"]
    assert space["schedule.args.warmup_epochs"].when == {"schedule.plugin": "cosine"}
    assert space["train.batch_size"].choices == [8, 16, 32]  # up to smoke's 32
    assert space["train.label_smoothing"] == sp.FloatParam(type="float", low=0.0, high=0.2)
    assert sources["model.plugin"] == "search.auto.models"
    assert sources["model.args.dropout"] == "priors of model plugins 'mlp', 'cnn' (the same in each)"
    assert sources["optimizer.args.lr"] == "priors of optimizer plugins 'adamw', 'sgd' (their envelope)"
    assert sources["model.args.gain"].startswith("prior of model plugin 'tiny' (annotation of tiny_priors:tiny")
    assert sources["train.batch_size"].startswith("training default")
    # a point drawn for cnn gets cnn's arguments and none of mlp's or tiny's
    cnn = sp.suggest(space, _First(fixed={"model.plugin": "cnn"}))
    assert {p for p in cnn if p.startswith("model.args.")} == {
        "model.args.channels",
        "model.args.blocks",
        "model.args.dropout",
    }


def test_hand_written_entries_and_fixed_arguments_win():
    lr = {"type": "float", "low": 0.01, "high": 0.02}
    spec = spec_with(
        model={"plugin": "mlp", "args": {"hidden": 32}},  # fixed by the spec: not searched
        search={"auto": {"train": False}, "space": {"optimizer.args.lr": lr}},
    )
    derived = derive(spec)
    space = derived.spec.search.space
    assert space["optimizer.args.lr"] == sp.FloatParam(**lr)
    assert derived.sources["optimizer.args.lr"] == HAND_WRITTEN
    assert "model.args.hidden" not in space and "model.args.depth" in space
    assert not any(p.startswith("train.") for p in space)  # auto.train: false
    assert "schedule.plugin" not in space  # smoke names its schedule (cosine): kept
    assert "schedule.args.warmup_epochs" in space
    # without search.auto, nothing is derived
    plain = derive(spec_with())
    assert plain.spec == spec_with() and set(plain.sources.values()) == {HAND_WRITTEN}


def test_a_derived_space_searches_the_task_s_priors_where_the_spec_fixes_none():
    # a regression's loss (a robust one where targets hold outliers: the benchmark's outlier task)
    derived = derive(spec_with(task={"plugin": "regression"}, search={"auto": {"train": False}}))
    space = derived.spec.search.space
    assert space["task.args.loss"] == sp.CategoricalParam(type="categorical", choices=["mse", "huber", "l1"])
    assert space["task.args.huber_delta"].when == {"task.args.loss": "huber"}
    assert derived.sources["task.args.loss"].startswith("prior of task plugin 'regression'")
    # a loss the spec fixes is kept, and the argument conditioned on another loss goes
    fixed = derive(spec_with(task={"plugin": "regression", "args": {"loss": "mse"}}, search={"auto": {}}))
    assert not any(p.startswith("task.") for p in fixed.spec.search.space)
    # classification declares no priors: nothing of the task's is searched
    assert not any(p.startswith("task.") for p in derive(spec_with(search={"auto": {}})).spec.search.space)


def test_a_when_condition_may_list_values():
    space = {
        "model.plugin": sp.CategoricalParam(type="categorical", choices=["mlp", "cnn", "resnet18"]),
        "model.args.dropout": sp.FloatParam(type="float", low=0.0, high=0.5, when={"model.plugin": ["mlp", "cnn"]}),
    }
    assert sp.enabling(space, "model.args.dropout") == {"model.plugin": "mlp"}
    assert sp.active(space["model.args.dropout"], {"model.plugin": "cnn"})
    assert not sp.active(space["model.args.dropout"], {"model.plugin": "resnet18"})
    with pytest.raises(UserError, match=r"search.space.model.args.dropout.when.*never holds"):
        spec_with(
            search={
                "space": {
                    "model.plugin": {"type": "categorical", "choices": ["mlp"]},
                    "model.args.dropout": {
                        "type": "float",
                        "low": 0,
                        "high": 1,
                        "when": {"model.plugin": ["cnn", "x"]},
                    },
                }
            }
        )


def test_malformed_priors_and_auto_lists_are_user_errors(site: Path):
    third_party(site, THIRD_PARTY.replace("IntRange(4, 64, log=True)", "IntRange(64, 4)"))
    with pytest.raises(UserError, match=r"model plugin 'tiny' declares for 'width'.*low \(64\) must be <= high"):
        declared("models", "tiny")
    with pytest.raises(UserError, match=r"search.auto.models: unknown model plugin 'nope'"):
        derive(spec_with(search={"auto": {"models": ["mlp", "nope"]}}))
    with pytest.raises(UserError, match=r"search.auto.modles: unknown key; expected one of: models"):
        spec_with(search={"auto": {"modles": ["mlp"]}})


def test_an_auto_sweep_chooses_among_models(workdir: Path):
    spec = write_spec(
        workdir / "auto.yaml",
        dataset={"plugin": "digits"},
        model={"plugin": "mlp"},
        optimizer={"plugin": "adamw"},
        train={"epochs": 1, "batch_size": 64, "device": "cpu"},
        search={
            "n_trials": 2,
            "batch_size": 2,
            "auto": {"models": ["mlp", "cnn"], "train": False},
            # small models for a test (hand-written entries win over the derived ones)
            "space": {
                "model.args.channels": {"type": "categorical", "choices": [8], "when": {"model.plugin": "cnn"}},
                "model.args.hidden": {"type": "categorical", "choices": [16], "when": {"model.plugin": "mlp"}},
            },
        },
        tracking={"enabled": False},
    )
    proc = sweeper("run", str(spec), "--auto", "--out", "out", "--quiet", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    recorded = summary["spec"]["search"]
    assert recorded["auto"] is None and recorded["space"]["model.plugin"]["choices"] == ["mlp", "cnn"]
    assert len(summary["trials"]) == 2, proc.stdout
    for trial in summary["trials"]:
        assert trial["state"] == "complete"
        model = trial["params"]["model.plugin"]
        args = {p for p in trial["params"] if p.startswith("model.args.")}
        assert args == (
            {"model.args.hidden", "model.args.depth"}
            if model == "mlp"
            else {"model.args.channels", "model.args.blocks"}
        ) | {"model.args.dropout"}


def test_validate_prints_where_each_entry_comes_from(workdir: Path):
    lr = {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}
    spec = write_spec(workdir / "smoke.yaml", search={"space": {"optimizer.args.lr": lr}}, tracking={"enabled": False})
    proc = sweeper("validate", str(spec), "--auto", "model.args={depth: 1}")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "# search space:" in lines
    entries = {line.split()[1]: line for line in lines if line.startswith("#   ")}
    assert HAND_WRITTEN in entries["optimizer.args.lr"]  # smoke's own lr range wins
    assert "model.args.depth" not in entries  # fixed by the spec
    assert (
        "int 32..512 log  <- prior of model plugin 'mlp' (annotation of sweeper_plugins.models:mlp"
        in (entries["model.args.hidden"])
    )
    assert "train.batch_size" in entries and "training default" in entries["train.batch_size"]


class _First:
    """A Suggester that takes each parameter's low end (or first choice), or a value given."""

    def __init__(self, fixed: dict[str, object] | None = None) -> None:
        self.fixed = fixed or {}

    def suggest_float(self, name, low, high, *, step=None, log=False):
        return self.fixed.get(name, low)

    def suggest_int(self, name, low, high, *, step=1, log=False):
        return self.fixed.get(name, low)

    def suggest_categorical(self, name, choices):
        return self.fixed.get(name, choices[0])


def test_the_base_point_takes_the_spec_s_value_else_the_plugin_s_default_else_the_centre():
    from sweeper.pluginhost.base_point import base_point

    def entry(kind: str, **rest: object) -> dict[str, object]:
        return {"type": kind, **rest}

    spec = spec_with(
        model={"plugin": "mlp", "args": {"depth": 1}},
        search={
            "n_trials": 4,
            "space": {
                "model.plugin": entry("categorical", choices=["cnn", "mlp"]),
                "model.args.depth": entry("int", low=1, high=4),  # the spec fixes 1
                "model.args.hidden": entry("int", low=16, high=512, log=True),  # mlp's default: 256
                "model.args.dropout": entry("float", low=0.1, high=0.3),  # mlp's 0.0, clipped into the range
                "model.args.channels": entry("categorical", choices=[8, 16], when={"model.plugin": "cnn"}),
                "optimizer.args.lr": entry("float", low=1e-4, high=1e-1, log=True),  # the spec fixes 1e-2
                "train.grad_clip": entry("float", low=0.1, high=10.0, log=True),  # unset: geometric centre
                "train.max_trial_seconds": entry("float", low=10.0, high=30.0),  # unset: centre
                "train.batch_size": entry("categorical", choices=[8, 16]),  # the spec's 32 not offered: first
            },
        },
    )
    point = base_point(spec)
    assert point == {
        "model.plugin": "mlp",
        "model.args.depth": 1,
        "model.args.hidden": 256,
        "model.args.dropout": 0.1,
        "optimizer.args.lr": 1e-2,
        "train.grad_clip": pytest.approx(1.0),
        "train.max_trial_seconds": 20.0,
        "train.batch_size": 8,
    }  # model.args.channels: its condition fails at the base point, as a sampled trial leaves it out
    assert sp.fit(spec.search.space, point) == point  # a point of the space
