"""What `sweeper validate` used to let through, each refused now with exit 2 naming the spec path
and the value, before any compute (and `sweeper run` likewise, before any trial or output):
a searched choice of a plugin argument the plugin refuses, a `when` condition no draw satisfies,
the argument a plugin refused (not another searched value), numbers of absurd magnitude, and a
search.storage URL Optuna cannot open here."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from conftest import SPACES, make_dist, write_spec
from typer.testing import CliRunner

from sweeper.cli import app
from sweeper.pluginhost import registry

SMOKE = str(SPACES / "smoke.yaml")


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), "".join(
        traceback.format_exception(result.exception)
    )
    return result.exit_code, " ".join(result.output.split())


def refused(*overrides: str, words: list[str], spec: str = SMOKE) -> str:
    code, out = cli("validate", spec, *overrides)
    assert code == 2, out
    assert "Traceback" not in out and all(w in out for w in words), out
    return out


PICKY = """
import math
from torch import nn

WIDTHS = {"small": 8, "wide": 64}

def picky(*, input_shape, num_classes, arch: str = "small"):
    if arch not in WIDTHS:  # what the factory alone knows: no annotation says it
        raise ValueError(f"unknown arch {arch!r}; expected one of {sorted(WIDTHS)}")
    width = WIDTHS[arch]
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.Linear(width, num_classes))
"""


def test_every_choice_of_a_searched_plugin_argument_is_built(site: Path, workdir: Path):
    entry_points = {"sweeper.models": {"picky": "picky_models:picky"}}
    make_dist(site, "picky-models", "1.0", entry_points, {"picky_models.py": PICKY})
    registry.refresh()
    spec = str(write_spec(workdir / "s.yaml", model={"plugin": "picky"}, search={"n_trials": 2}))
    arch = "search.space.model.args.arch={type: categorical, choices: [small, wide, wdie]}"
    refused(
        arch,
        spec=spec,
        words=[
            "model.args.arch: 'wdie' (from search.space.model.args.arch) is refused",
            "model plugin 'picky' (distribution picky-models 1.0",
            "ValueError: unknown arch 'wdie'; expected one of ['small', 'wide']",
        ],
    )
    code, out = cli("run", spec, arch, "--out", "X", "--quiet")
    assert code == 2 and "model.args.arch: 'wdie'" in out
    assert not (workdir / "X").exists()
    code, out = cli("validate", spec, arch.replace(", wdie", ""))
    assert code == 0, out
    assert "1 configuration(s) (base) on cpu and 1 choice(s) of plugin arguments (model.args.arch=wide)" in out
    # a choice enabled only under another plugin choice is built with that choice
    refused(
        "search.space.optimizer.plugin={type: categorical, choices: [adam, sgd]}",
        "search.space.optimizer.args.momentum={type: categorical, choices: [0.9, -1.0], when: {optimizer.plugin: sgd}}",
        words=["optimizer.args.momentum: -1.0 (from search.space.optimizer.args.momentum)", "plugin 'sgd'"],
    )


@pytest.mark.parametrize(
    ("condition", "words"),
    [
        ("{model.args.hidden: 64}", ["{model.args.hidden: 64} never holds", "takes one of [16, 32], never 64"]),
        ("{optimizer.args.lr: 0.01}", ["{optimizer.args.lr: 0.01} never holds", "float parameter"]),
        ("{train.epochs: 3}", ["refers to 'train.epochs', which is not a parameter"]),
        ("{model.args.hidden: '16'}", ["never '16'"]),
        ("{search.space.train.batch_size: 7}", ["never holds", "never 7"]),
        ("{model.args.depth: 2, model.args.hidden: 32}", ["never holds together with"]),
    ],
)
def test_a_condition_no_draw_satisfies_is_refused(condition: str, words: list[str]):
    space = [
        "search.space.train.batch_size={type: int, low: 8, high: 64, step: 8}",
        "search.space.model.args.depth={type: categorical, choices: [1, 2], when: {model.args.hidden: 16}}",
        f"search.space.model.args.dropout={{type: categorical, choices: [0.0, 0.1], when: {condition}}}",
    ]
    if "search.space.train" in condition:
        space[-1] = space[-1].replace("search.space.train.batch_size", "train.batch_size")
    refused(*space, words=["search.space.model.args.dropout.when", *words])


def test_satisfiable_conditions_still_pass():
    code, out = cli(
        "validate",
        SMOKE,
        "search.space.train.batch_size={type: int, low: 8, high: 64, step: 8}",
        "search.space.model.args.depth={type: categorical, choices: [1, 2], when: {train.batch_size: 16.0}}",
        "search.space.model.args.dropout={type: categorical, choices: [0.0], when: {model.args.depth: 2}}",
    )
    assert code == 0, out


def test_the_argument_refused_is_named_not_another_searched_value():
    out = refused(
        "optimizer={plugin: sgd, args: {lr: 0.01, momentum: -1}}",
        words=["optimizer.args.momentum: -1 (fixed in the spec) is refused", "Invalid momentum value: -1"],
    )
    assert not out.split("error: ")[1].startswith("optimizer.args.lr")
    refused(  # a searched argument the plugin does not have: named where it is written
        "search.space.model.args.hiden={type: categorical, choices: [1, 2]}",
        words=["search.space.model.args.hiden: model plugin 'mlp' has no argument 'hiden' (did you mean 'hidden'?)"],
    )


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("train.epochs=1000000000000", ["train.epochs", "less than or equal to 100000", "1000000000000"]),
        ("train.batch_size=100000000000", ["train.batch_size", "less than or equal to 16777216"]),
        ("search.n_trials=10000000000", ["search.n_trials", "less than or equal to 1000000"]),
        ("search.timeout=1e30", ["search.timeout", "less than or equal to 31622400"]),
        ("search.parallel=100000", ["search.parallel", "less than or equal to 1024"]),
        ("optimizer.args.lr=1e300", ["optimizer.args.lr: 1e+300 is beyond what a float32 tensor holds"]),
        ("model.args.hidden=100000000000000000000", ["model.args.hidden: 100000000000000000000 is beyond a 64-bit"]),
        ("seed=100000000000000000000000", ["seed: 100000000000000000000000 is beyond a 64-bit integer"]),
        (  # the built-in plugins' annotated ranges
            "model.args.hidden=1000000000",
            ["model.args.hidden: model plugin 'mlp' expects int, got 1000000000", "less than or equal to 65536"],
        ),
        (
            "search.space.dataset.args.num_train={type: int, low: 64, high: 100000000000}",
            ["dataset.args.num_train: dataset plugin 'synthetic' expects int, got 100000000000 (from search.space"],
        ),
        ("schedule.args.warmup_epochs=-3", ["schedule.args.warmup_epochs", "greater than or equal to 0"]),
        (
            "search.space.train.epochs={type: int, low: 1, high: 1000000000}",
            ["search.space.train.epochs: value 1000000000 does not fit", "less than or equal to 100000"],
        ),
        (
            "search.space.optimizer.args.lr={type: float, low: 1e-3, high: 1e50}",
            ["search.space.optimizer.args.lr.high: 1e+50 is beyond what a float32 tensor holds"],
        ),
        (
            "search.space.model.args.hidden={type: categorical, choices: [16, 10000000000000000000000]}",
            ["search.space.model.args.hidden.choices[1]", "beyond a 64-bit integer"],
        ),
    ],
)
def test_absurd_magnitudes_are_refused(override: str, words: list[str]):
    refused(override, words=words)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("foo://bar", ["search.storage: 'foo://bar' names the database 'foo'"]),
        ("postgresql+nodriver://u@h/db", ["'postgresql+nodriver://u@h/db' names the driver 'nodriver'"]),
        ("mysql+pymysql://u@h/db", ["needs the Python package pymysql"]),
        ("just words", ["search.storage: 'just words' is not a database URL"]),
    ],
)
def test_a_storage_optuna_cannot_open_here_is_refused(url: str, words: list[str], workdir: Path):
    refused(f"search.storage={url}", words=words)
    code, out = cli("run", SMOKE, f"search.storage={url}", "--out", "X", "--quiet")
    assert code == 2 and words[0] in out
    assert not (workdir / "X").exists()


def test_a_storage_url_with_a_password_is_refused_without_showing_it():
    out = refused("search.storage=foo://user:s3cret@host/db", words=["search.storage"])
    assert "s3cret" not in out
    assert cli("validate", SMOKE, "search.storage=postgresql+psycopg://u@127.0.0.1/x", "search.n_trials=1")[0] == 0
