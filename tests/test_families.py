"""Issue #55 items 1 and 2: under `--auto` the model families come from the data. Every installed model
plugin that declares the data set's kind of data is a candidate (the spec's own first), one
declaring another kind is refused with why, `search.auto.models` restricts; a family the data
brought that fails on the data's samples is refused, not an error; a first round at low
fidelity tries every family before the search within the best half, whose round trials are
promoted (continued from their paused state, bitwise the uninterrupted run); and on MNIST-1D
with its positions shuffled, where the spec's sequence models are the wrong families, the sweep
ends on the MLP, with the same trial table for 1 and 2 workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SPACES, learned, make_dist, sweeper, write_spec

from sweeper.errors import UserError
from sweeper.pluginhost import registry
from sweeper.pluginhost.auto_space import derive
from sweeper.spec import load

MODELS = """
from torch import nn


def seq_net(*, input_shape, num_classes, width: int = 8):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], width), nn.ReLU(), nn.Linear(width, num_classes))


def picture_net(*, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))


def plain_net(*, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))


seq_net.sweeper_data_kinds = ("sequence",)
picture_net.sweeper_data_kinds = ("image",)
"""

LYING_DATA = """
import torch
from sweeper.plugin import DataSplits


def flat_pictures(*, seed: int = 0):
    x, y = torch.randn(64, 16), torch.randint(0, 2, (64,))
    return DataSplits(train_x=x[:48], train_y=y[:48], val_x=x[48:], val_y=y[48:], num_classes=2)


flat_pictures.sweeper_data_kind = "image"
"""


@pytest.fixture
def models(site: Path) -> None:
    make_dist(
        site,
        "family-models",
        "1.0",
        {"sweeper.models": {n: f"family_models:{n}" for n in ("seq_net", "picture_net", "plain_net")}},
        {"family_models.py": MODELS},
    )
    registry.refresh()


def _mnist1d(tmp_path: Path, *overrides: str):
    """search_spaces/mnist1d.yaml under --auto (its data set, not loaded: derive reads declarations)."""
    return load(SPACES / "mnist1d.yaml", list(overrides), auto=True)


def test_families_come_from_the_datas_kind(tmp_path: Path, models: None):
    derived = derive(_mnist1d(tmp_path))
    space, families = derived.spec.search.space, derived.families
    assert families is not None and families.kind == "sequence"
    # the spec's hand-written families first (where the search starts), then the data's
    assert families.named == ("conv1d", "gru", "transformer")
    assert space["model.plugin"].choices[:3] == ["conv1d", "gru", "transformer"]
    assert {"mlp", "seq_net"} <= set(space["model.plugin"].choices[3:])
    refused = {f.name: f.why for f in families.refused}
    assert refused["cnn"] == "takes image; the data set 'mnist1d' gives sequences"
    assert refused["picture_net"] == "takes image; the data set 'mnist1d' gives sequences"
    assert refused["plain_net"].startswith("declares no kinds of data (sweeper_data_kinds)")
    assert "picture_net" not in space["model.plugin"].choices and "plain_net" not in space["model.plugin"].choices
    # a family the data brought gets its own priors, conditioned on it; the spec's hand-written
    # entries stay theirs
    assert space["model.args.kernel_size"].when == {"model.plugin": "conv1d"}
    # the first round: every family, at a ninth of the 15 epochs, half of them kept
    round_ = derived.spec.search.family_round
    assert round_ is not None and round_.families == space["model.plugin"].choices
    assert round_.epochs == 2 and round_.keep == -(-len(round_.families) // 2)


def test_search_auto_models_restricts_the_families(tmp_path: Path):
    spec = _mnist1d(tmp_path, "search.space={}", "search.auto={models: [mlp, cnn]}")
    derived = derive(spec)
    families = derived.families
    assert families is not None and families.names == ["mlp"] and not families.from_data
    assert {f.name: f.why for f in families.refused} == {"cnn": "takes image; the data set 'mnist1d' gives sequences"}
    assert derived.spec.search.family_round is None  # one family: no round
    with pytest.raises(UserError, match="no model plugin fits the data set 'mnist1d'.*cnn: takes image"):
        derive(_mnist1d(tmp_path, "search.space={}", "search.auto={models: [cnn]}"))


def test_validate_lists_candidates_refused_and_a_family_that_fails_on_the_data(tmp_path: Path, workdir: Path):
    # search_spaces/sequences.yaml: variable-length sequences, batched with a mask; the MLP takes
    # sequences but not a mask, which only building it on the data tells
    out = sweeper("validate", str(SPACES / "sequences.yaml"), "--auto", check=True).stdout
    section = out.split("# model families (the data set gives sequences", 1)[1].split("# budget", 1)[0]
    assert "#   conv1d: named by the spec; takes sequences; the data set 'sequences' gives sequences" in section
    assert "#   transformer: takes sequences; the data set 'sequences' gives sequences" in section
    assert "#   cnn: refused: takes image; the data set 'sequences' gives sequences" in section
    assert (
        "#   mlp: refused: a forward and backward pass on 4 training samples failed on the data set's samples"
        in section
    )
    assert "unexpected keyword argument 'mask'" in section
    # 8 epochs: no fidelity is cheap (a ninth would be one epoch, an eighth of the run), so each
    # family runs once, whole, and none is dropped
    round_line = "#   first round: each family once, for all 8 epochs (under 9 epochs no fidelity is cheap)"
    assert round_line in section
    resolved = yaml_spec(out)
    assert resolved["search"]["space"]["model.plugin"]["choices"] == ["conv1d", "gru", "transformer"]
    assert resolved["search"]["family_round"] == {"families": ["conv1d", "gru", "transformer"], "epochs": 8, "keep": 3}


def yaml_spec(out: str) -> dict:
    import yaml

    return yaml.safe_load(out.split("# search space", 1)[0])


def test_a_data_set_whose_samples_are_not_its_declared_kind_is_refused(tmp_path: Path, site: Path):
    make_dist(
        site, "lying-data", "1.0", {"sweeper.datasets": {"flat_pictures": "lying_data:flat_pictures"}},
        {"lying_data.py": LYING_DATA},
    )  # fmt: skip
    registry.refresh()
    spec = write_spec(tmp_path / "lie.yaml", dataset={"plugin": "flat_pictures"})
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2
    assert "flat_pictures" in proc.stderr
    assert (
        "declares sweeper_data_kind = 'image' (samples of 3 dimensions) but gives samples of shape (16,)" in proc.stderr
    )


SHUFFLED = {
    "name": "shuffled",
    "dataset": {
        "plugin": "mnist1d",
        "args": {"num_train": 3000, "num_val": 1000, "num_test": 1000, "shuffle_seq": True, "root": None},
    },
    "model": {"plugin": "conv1d"},
    "optimizer": {"plugin": "adamw", "args": {"lr": 3.0e-3, "weight_decay": 1.0e-4}},
    "schedule": {"plugin": "onecycle"},
    "train": {"epochs": 9, "batch_size": 128, "device": "cpu"},
    "search": {
        "sampler": "tpe",
        "pruner": {"type": "median", "min_epochs": 3, "startup_trials": 4},
        "n_trials": 8,
        "space": {
            "model.plugin": {"type": "categorical", "choices": ["conv1d", "gru", "transformer"]},
            "optimizer.args.lr": {"type": "float", "low": 1.0e-3, "high": 3.0e-2, "log": True},
        },
    },
    "export": {"formats": []},
}


def test_the_search_ends_on_the_family_the_data_needs_with_one_table_for_any_workers(tmp_path: Path, workdir: Path):
    """MNIST-1D with one permutation of its positions (the paper's spatial-prior test: its MLP
    keeps 68 %, its CNN falls to 56 %); the spec names only sequence models."""
    spec = write_spec(tmp_path / "shuffled.yaml", base="mnist1d", **SHUFFLED)
    tables = {}
    for parallel in (1, 2):
        out = tmp_path / f"p{parallel}"
        sweeper("run", str(spec), "--auto", f"search.parallel={parallel}", "--out", str(out), "-q", check=True)
        summary = json.loads((out / "summary.json").read_text())
        trials = summary["trials"]
        tables[parallel] = [(t["number"], t["state"], t["params"], t["value"], learned(t["history"])) for t in trials]
    round_ = summary["spec"]["search"]["family_round"]
    families = round_["families"]
    assert families[:3] == ["conv1d", "gru", "transformer"] and "mlp" in families
    # no family left untried: the first trials are the round's, each stopped at its low fidelity
    for t, family in zip(trials, families):
        assert t["params"]["model.plugin"] == family and t["state"] == "pruned"
        assert t["reason"].startswith(f"family round: {family} stopped at epoch 1 of 9")
    # after the round (from the first batch of 4 that holds none of its trials), only the
    # survivors are searched; the first trials there continue the survivors' round trials from
    # the state they paused with (promotion, not a restart from epoch 0)
    after = -(-len(families) // 4) * 4
    survivors = _survivors(trials[: len(families)], round_["keep"])
    later = {t["params"]["model.plugin"] for t in trials if t["number"] >= after}
    assert later and later <= {t["params"]["model.plugin"] for t in survivors}
    for paused, promoted in zip(survivors, trials[after : after + len(survivors)]):
        why = f"promoted from trial {paused['number']} of the family round (resumed from its state)"
        assert promoted["reason"] == why
        assert promoted["params"] == paused["params"] and promoted["seed"] == paused["seed"]
        assert promoted["state"] == "complete" and len(promoted["history"]) == 9
        assert promoted["history"][:1] == paused["history"]  # the epoch it paused after, carried on
    assert summary["best"]["params"]["model.plugin"] == "mlp"
    assert tables[1] == tables[2]
    # resumed at the rung, bitwise the run it would have been uninterrupted: replayed from
    # epoch 1 without a pause, every epoch's metrics are equal
    replayed = sweeper("replay", trials[after]["mlflow_run_id"])
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"trial {after} reproduced" in replayed.stdout and "bitwise" in replayed.stdout


def _survivors(round_trials: list[dict], keep: int) -> list[dict]:
    return sorted(round_trials, key=lambda t: -t["value"])[:keep]


def test_what_the_spec_fixes_for_its_model_stays_with_the_families_that_take_it():
    """search_spaces/digits.yaml fixes cnn's blocks and searches its channels by hand: under
    --auto both stay cnn's, and the MLP and ResNet-18 the images bring train at their own."""
    derived = derive(load(SPACES / "digits.yaml", [], auto=True))
    space = derived.spec.search.space
    assert space["model.plugin"].choices == ["cnn", "mlp", "resnet18"]
    assert "blocks" not in derived.spec.model.args and "channels" not in derived.spec.model.args
    assert space["model.args.blocks"].choices == [2] and space["model.args.blocks"].when == {"model.plugin": "cnn"}
    assert space["model.args.channels"].choices == [8, 16, 32]
    assert space["model.args.channels"].when == {"model.plugin": "cnn"}
    assert derived.sources["model.args.blocks"].startswith("model.args (fixed in the spec")
    assert space["model.args.hidden"].when == {"model.plugin": "mlp"}
