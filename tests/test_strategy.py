"""search.sampler: auto / search.pruner: auto: the strategy chosen from the space, the budget and
the device, each choice explained by `sweeper validate`; and the settings that cannot take effect
(search.fuse larger than a batch, ...) said there and at `sweeper run`'s start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from conftest import SPACES, install_test_plugin, sweeper, write_spec

from sweeper.plan import resolve as host
from sweeper.plan import strategy as st
from sweeper.search import lr_range_tests
from sweeper.search.optuna.study import make_pruner
from sweeper.spec import load, validate
from sweeper.spec.load import parse_yaml
from sweeper.trial import fused

CPU, CUDA = st.Facts(cuda=False), st.Facts(cuda=True)
LR = {"type": "float", "low": 1.0e-5, "high": 1.0, "log": True}  # 5 decades


def spec_of(search: dict[str, Any], train: dict[str, Any] | None = None, **top: Any) -> Any:
    """smoke.yaml with these search settings (sampler and pruner auto unless given), loaded
    as from YAML: what was written is what the spec's fields set say."""
    tree = parse_yaml((SPACES / "smoke.yaml").read_text(), "smoke.yaml")
    tree["search"] = {"sampler": "auto", "pruner": "auto", **search}
    tree["train"] = {**tree["train"], **(train or {})}
    tree.update(top)
    return validate(tree, "test")


def chosen(spec: Any, facts: st.Facts = CPU) -> dict[str, str]:
    result = st.choose(spec, facts)
    return {c.setting: f"{c.value} | {c.reason}" for c in result.choices} | {"spec": result.spec}  # type: ignore[dict-item]


def test_small_budget_samples_at_random_without_a_pruner() -> None:
    got = chosen(spec_of({"n_trials": 8, "space": {"optimizer.args.lr": LR}}, {"epochs": 2}))
    assert got["search.sampler"].startswith("random | at most 7 trials finish before the last 1 are proposed")
    assert got["search.pruner"].startswith("none | train.epochs 2 < 3")
    assert got["search.batch_size"].startswith("1 | = search.parallel (1)")
    assert got["search.fuse"].startswith("off | 8 trials < 64")
    assert got["search.lr_finder.enabled"].startswith("false | 1 range test(s) cost about 0.5 trials")
    assert got["search.staleness"].startswith("0 | one worker")
    resolved = got["spec"].search  # type: ignore[attr-defined]
    assert (resolved.sampler, resolved.pruner.type, resolved.batch_size, resolved.fuse) == ("random", "none", 1, "off")


def test_large_budget_models_and_prunes() -> None:
    space = {"optimizer.args.lr": LR, "model.args.hidden": {"type": "categorical", "choices": [16, 32, 64]}}
    got = chosen(spec_of({"n_trials": 60, "parallel": 2, "space": space}, {"epochs": 10}))
    # two workers: batches of 2, each proposed while the one before runs: 4 without each other's results
    assert got["search.sampler"].startswith("tpe | 60 trials, 4 at a time without each other's results")
    assert got["search.staleness"].startswith("1 | 2 workers: a batch is proposed while the one before it")
    assert got["search.pruner"].startswith("hyperband (min_epochs 1, reduction_factor 3) | ")
    assert "rungs at epochs 1, 3 of 10 (none past 6: a later cut saves under 1/3 of a trial)" in got["search.pruner"]
    # 3 architectures: about 16 trials of each per task, 4 batches of them: 384 trials, not 60
    assert got["search.fuse"].startswith("off | 60 trials < 384")
    assert "3 architectures (model.args.hidden)" in got["search.fuse"]
    assert got["search.lr_finder.enabled"].startswith("true | lr spans 5.0 decades")
    # random sampling goes with the median pruner (Optuna's benchmarks)
    got = chosen(spec_of({"sampler": "random", "n_trials": 60, "space": space}, {"epochs": 10}))
    assert got["search.pruner"].startswith("median (min_epochs 1, startup_trials 5) | ")


def test_auto_checks_the_rungs_where_the_uncut_trials_cost_a_tenth_of_the_sweep() -> None:
    """search.pruner.check_rungs under auto: 8 uncut trials where the sweep is expected to run at
    least 80 (its cap, or its budget over the base point's timed trial), none where they would
    cost more; a written value and reproducible: false are the user's."""
    space = {"optimizer.args.lr": LR}
    budget = {"device_hours": 60 / 3600}  # 60 device-s
    cheap = chosen(
        spec_of({"n_trials": 10_000, "budget": budget, "space": space}, {"epochs": 10}),
        st.Facts(cuda=False, trial_s=0.3),
    )
    assert "check_rungs 8) | " in cheap["search.pruner"] and "~200 trials expected" in cheap["search.pruner"]
    assert cheap["spec"].search.pruner.check_rungs == 8  # type: ignore[attr-defined]
    dear = chosen(
        spec_of({"n_trials": 10_000, "budget": budget, "space": space}, {"epochs": 10}),
        st.Facts(cuda=False, trial_s=8.0),
    )
    assert "no rung checked: ~7 trials expected" in dear["search.pruner"]
    assert dear["spec"].search.pruner.check_rungs == 0  # type: ignore[attr-defined]
    capped = chosen(spec_of({"n_trials": 60, "space": space}, {"epochs": 10}))
    assert capped["spec"].search.pruner.check_rungs == 0  # type: ignore[attr-defined]
    written = spec_of({"n_trials": 500, "pruner": {"type": "auto", "check_rungs": 3}, "space": space}, {"epochs": 10})
    assert chosen(written)["spec"].search.pruner.check_rungs == 3  # type: ignore[attr-defined]
    free = chosen(spec_of({"n_trials": 500, "reproducible": False, "space": space}, {"epochs": 10}))
    assert free["spec"].search.pruner.check_rungs == 0  # type: ignore[attr-defined]  # refused there


def test_no_rung_where_a_cut_saves_too_little() -> None:
    """Issue #47 item 5: on digits (10 epochs) Optuna's rung at epoch 9 took 44 % of `--auto`'s
    budget in trials cut a tenth of their cost before the end. sweeper's successive halving and
    Hyperband judge no rung past epochs x (1 - 1/reduction_factor)."""
    assert st.rungs(1, 3, 10) == [1, 3] and st.rungs(1, 3, 15) == [1, 3, 9] and st.rungs(1, 3, 30) == [1, 3, 9]
    assert st.rungs(2, 2, 10) == [2, 4] and st.rungs(1, 3, 3) == [1] and st.rungs(3, 3, 4) == []
    for pruner in ("asha", "hyperband"):
        spec = spec_of({"sampler": "tpe", "pruner": {"type": pruner, "min_epochs": 1}}, {"epochs": 10})
        study = optuna.create_study(direction="maximize", pruner=make_pruner(spec), study_name="cuts")
        for value in (0.9, 0.8, 0.7, 0.95, 0.85, 0.75):  # trials judged at every epoch, then finished
            trial = study.ask()
            for epoch in range(1, 11):
                trial.report(value, epoch)
                if trial.should_prune():
                    break
            study.tell(trial, value)
        late, early = study.ask(), study.ask()
        late.report(0.1, 9)  # behind every other trial, at epoch 9 of 10: it runs on
        early.report(0.1, 3)  # at epoch 3: stopped
        assert not late.should_prune() and early.should_prune(), pruner
        # a first rung past the last one that saves: said, as a setting that cannot take effect
        spec = spec_of({"sampler": "tpe", "pruner": {"type": pruner, "min_epochs": 7}}, {"epochs": 10})
        assert [n for n in st.notes(spec, CPU) if "judges no rung past epoch 6 of 10" in n], st.notes(spec, CPU)
        # Optuna's own pruner would have cut the late one
        frozen = study._storage.get_trial(late._trial_id)
        assert optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3).prune(study, frozen)


def test_fusion_where_it_pays() -> None:
    one_architecture = {"n_trials": 256, "parallel": 2, "space": {"optimizer.args.lr": LR}}
    cpu = chosen(spec_of(one_architecture))
    assert cpu["search.fuse"].startswith("16 | 256 trials hold 8 batches of 2 x 16")
    assert cpu["search.batch_size"].startswith("32 | 2 worker(s) x 16 fused trials")
    cuda = chosen(spec_of(one_architecture), CUDA)
    assert cuda["search.fuse"].startswith("8 | ") and cuda["search.batch_size"].startswith("16 | ")
    # a continuous architecture argument: no two trials share shapes
    wide = {"model.args.hidden": {"type": "float", "low": 8, "high": 64}}
    assert (
        "take a continuous range or more than a grid's 100,000 combinations"
        in chosen(spec_of({**one_architecture, "space": wide}))["search.fuse"]
    )
    # a plugin that opts out (plan/resolve.py finds it out)
    facts = st.Facts(cuda=True, unfusable="the model plugin 'x' says it cannot be fused")
    assert chosen(spec_of(one_architecture), facts)["search.fuse"].startswith("off | no trial of this spec")
    # DDP trials train on their own devices: never fused, and the spec chosen for them is valid
    ranks = chosen(spec_of(one_architecture, {"devices": 2}), CUDA)
    assert ranks["search.fuse"].startswith("off | train.devices is 2")


def test_more_workers_than_trials() -> None:
    got = chosen(spec_of({"n_trials": 3, "parallel": 4, "space": {"optimizer.args.lr": LR}}))
    assert got["search.batch_size"].startswith("4 | ")  # never below parallel, which the spec requires
    said = " ".join(st.notes(got["spec"], CPU))  # type: ignore[arg-type]
    assert "search.parallel 4 > the 3 trials: 1 worker(s) never train" in said


def test_written_settings_are_kept() -> None:
    spec = spec_of({"n_trials": 256, "batch_size": 8, "fuse": 4, "space": {"optimizer.args.lr": LR}})
    got = chosen(spec)
    assert "search.batch_size" not in got and "search.fuse" not in got
    assert (got["spec"].search.batch_size, got["spec"].search.fuse) == (8, 4)  # type: ignore[attr-defined]
    # no auto, no strategy: the spec as it is
    plain = load(SPACES / "smoke.yaml")
    assert st.choose(plain, CPU).spec is plain and not st.choose(plain, CPU).choices


def test_grid_and_several_objectives() -> None:
    small = {
        "model.args.hidden": {"type": "categorical", "choices": [16, 32]},
        "model.args.depth": {"type": "int", "low": 1, "high": 3},
    }
    assert chosen(spec_of({"n_trials": 6, "space": small}))["search.sampler"].startswith(
        "grid | the space has 6 points"
    )
    two = spec_of(
        {"n_trials": 40, "space": {"optimizer.args.lr": LR}},
        objectives=[{"metric": "val_acc"}, {"metric": "params", "direction": "minimize"}],
    )
    got = chosen(two)
    assert got["search.pruner"].startswith("none | 2 objectives")
    assert got["search.sampler"].startswith("tpe | ") and "2 objectives" in got["search.sampler"]


def test_the_rules_read_what_the_code_does() -> None:
    """The strategy's copies of what trial/ and search/ decide (plan/strategy.py is pure: it imports neither)."""
    assert st.FUSE_SPLITTING[2:] == tuple(f"train.{name}" for name in fused.SHARED)
    assert lr_range_tests.CONFIG_PATHS == ("dataset.plugin", "model.plugin", "optimizer.plugin", "train.batch_size")
    assert lr_range_tests.MAX_CONFIGS == 8


def test_validate_explains_the_auto_strategy(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "auto.yaml",
        search={"sampler": "auto", "pruner": "auto", "n_trials": 8, "space": {"optimizer.args.lr": LR}},
    )
    proc = sweeper("validate", str(spec), check=True)
    out = " ".join(proc.stdout.split())
    assert "# strategy (search.sampler/pruner: auto; docs/strategy.md):" in out
    for line in (
        "search.sampler: random — at most 7 trials finish",
        "search.pruner: median (min_epochs 1, startup_trials 5) — Optuna's benchmarks (kurobako): best pruner",
        "search.batch_size: 1 — = search.parallel (1)",
        "search.fuse: off — 8 trials < 64",
        "search.lr_finder.enabled: false — ",
        "search.base_first: true — the first trial is the base point",
    ):
        assert line in out, out
    assert "sampler: random" in out and "type: median" in out  # the resolved spec printed above it
    # no auto: no strategy section
    assert "# strategy" not in sweeper("validate", str(SPACES / "smoke.yaml"), check=True).stdout


def test_validate_names_the_rules_the_peers_measured(tmp_path: Path) -> None:
    """Issue #47 item 6: each auto choice says whether the benchmark against SMAC3, DEHB, Optuna's
    Hyperband and Ray ASHA measured its rule, and where its figures are."""
    spec = write_spec(
        tmp_path / "auto.yaml",
        search={"sampler": "auto", "pruner": "auto", "n_trials": 60, "space": {"optimizer.args.lr": LR}},
    )
    out = " ".join(sweeper("validate", str(spec), check=True).stdout.split())
    peers = f"[rule measured against the peers: {st.AGAINST_PEERS}]"

    def line(setting: str) -> str:
        assert f"# {setting}" in out, out
        return out.split(f"# {setting}")[1].split(" # ")[0]

    for setting in ("search.sampler: tpe —", "search.pruner: hyperband (", "search.base_first: true —"):
        assert line(setting).endswith(peers), line(setting)
    for setting in ("search.fuse: off —", "search.batch_size: 1 —"):
        assert line(setting).endswith("[rule not measured against the peers]"), line(setting)
    # the cited section is there, with the benchmark's command
    doc, anchor = st.AGAINST_PEERS.split("#")
    text = (SPACES.parent / doc).read_text()
    assert "\n### Against the peers\n" in text and anchor == "against-the-peers"
    section = text.split("\n### Against the peers\n")[1].split("\n## ")[0]
    assert "python benchmarks/search_quality.py" in section


def test_settings_that_cannot_take_effect_are_said(tmp_path: Path) -> None:
    # issue #30: fuse=16 with the default batch_size 4 validated silently
    proc = sweeper("validate", str(SPACES / "smoke.yaml"), "search.fuse=16", "search.parallel=2", check=True)
    err = " ".join(proc.stderr.split())
    assert "search.fuse 16 with search.batch_size 4: a fused model holds trials of one batch, so no more than 4" in err
    assert "set search.batch_size >= 32 (2 worker(s) x 16)" in err


def test_the_notes_of_other_settings() -> None:
    def notes(*overrides: str) -> str:
        return " ".join(st.notes(load(SPACES / "smoke.yaml", overrides), CPU))

    # with batch_size 16: one fused task a batch, so the second worker waits; 2 architectures
    said = notes("search.fuse=16", "search.batch_size=16", "search.parallel=2")
    assert "search.fuse 16 cuts a batch of 16 into 1 task(s) for 2 workers: 1 worker(s) wait each batch" in said
    assert "model.args.hidden make(s) 2 architectures: about 8.0 trials per fused model" in said
    assert "fusing pays from 16 on cpu" in said
    # a pruner with one epoch to judge; TPE that never models; idle workers
    said = notes("train.epochs=1", "search.parallel=4", "search.n_trials=3")
    assert "search.pruner.type median with train.epochs 1" in said
    assert "search.sampler tpe samples at random until 10 trials have finished; with 3 trials" in said
    assert "search.parallel 4 > the 3 trials: 1 worker(s) never train" in said
    assert notes() == notes("search.fuse=auto")  # auto on a CPU: nothing fused, nothing to say of it


def test_auto_shorthand_and_contradictions(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "pop.yaml", search={"sampler": "auto", "population": 10, "n_trials": 40})
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2 and "search.population" in proc.stderr, proc.stderr


def test_an_auto_sweep_runs_and_records_its_choices(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "auto.yaml",
        search={"sampler": "auto", "pruner": "auto", "n_trials": 3, "space": {"optimizer.args.lr": LR}},
    )
    # fuse written: kept, and the batch chosen around it (1 worker x 2); run says it cannot pay here
    ran = sweeper("run", str(spec), "train.epochs=1", "search.fuse=2", "--out", "out", "--quiet", check=True)
    assert "search.fuse 2: about 2.0 trials per fused model, and fusing pays from 16 on cpu" in " ".join(
        ran.stderr.split()
    )
    recorded = yaml.safe_load((tmp_path / "out" / "spec.yaml").read_text())["search"]
    chosen = (recorded["sampler"], recorded["pruner"]["type"], recorded["batch_size"], recorded["fuse"])
    assert chosen == ("random", "none", 2, 2)
    assert recorded["lr_finder"]["enabled"] is False and recorded["base_first"] is True
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete"] * 3
    assert summary["trials"][0]["params"] == {"optimizer.args.lr": 1.0e-2}  # the base point: the spec's lr
    assert "auto_space_sized" not in summary  # no derived space, no device-time budget: nothing sized


@pytest.fixture
def lonely(site: Path) -> None:
    """An optimizer plugin that opts out of fusing (tests/plugins/sweeper_test_fusing.py)."""
    install_test_plugin(
        site, "sweeper_test_fusing", {"sweeper.optimizers": {"lonely_sgd": "sweeper_test_fusing:lonely_sgd"}}
    )


def test_a_plugin_that_opts_out_of_fusing_keeps_fusion_off(lonely: None) -> None:
    space = {"optimizer.args.lr": LR, "optimizer.plugin": {"type": "categorical", "choices": ["adam", "lonely_sgd"]}}
    spec = spec_of({"n_trials": 256, "space": space})
    assert "lonely_sgd" in str(host.why_unfusable(spec))
    got = host.choose(spec)
    fuse = next(c for c in got.choices if c.setting == "search.fuse")
    assert fuse.value == "off" and "the optimizer plugin 'lonely_sgd' says it cannot be fused" in fuse.reason
    assert host.why_unfusable(spec_of({"n_trials": 256, "space": {"optimizer.args.lr": LR}})) is None


def test_an_auto_sweep_is_sized_to_its_budget_and_starts_at_the_base_point(tmp_path: Path) -> None:
    """--auto with a device-time budget: a model too costly for it is dropped (validate and run
    say so, summary.json records it); the base point runs first, and once, also when the sweep is
    resumed; the resume keeps the sizing the sweep began with."""
    from sweeper.plan.sized_space import MIN_TRIALS

    # hidden 4096 x 2 layers: ~3 GFLOP a step, 100x and more the cost of hidden 16 (the base point's:
    # the spec's 32 is not offered): a few device-seconds a trial, where the budget (36 s, which
    # start-up on a busy machine also spends) fits under MIN_TRIALS of it
    hidden = {"type": "categorical", "choices": [16, 4096]}
    spec = write_spec(
        tmp_path / "sized.yaml",
        model={"plugin": "mlp", "args": {"depth": 2}},
        train={"epochs": 2, "batch_size": 32, "device": "cpu", "cpu_threads": 1},
        search={
            "sampler": "auto",
            "pruner": "auto",
            "n_trials": 2,
            "budget": {"device_hours": 0.01},
            "auto": {"train": False},
            "space": {"model.args.hidden": hidden},
        },
        tracking={"enabled": False},
        export={"formats": []},
    )
    dropped = "search.space: dropped model.args.hidden=4096: one trial ~"
    checked = sweeper("validate", str(spec), "--auto", check=True).stdout
    assert dropped in checked and f"(fewer than {MIN_TRIALS})" in checked, checked
    listed = next(line for line in checked.splitlines() if line.startswith("#   model.args.hidden "))
    assert listed.split()[2:5] == ["one", "of", "[16]"]  # the sized space is what validate lists

    ran = sweeper("run", str(spec), "--auto", "--out", "out", "--quiet", check=True)
    assert f"note: {dropped}" in ran.stderr, ran.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spec"]["search"]["space"]["model.args.hidden"]["choices"] == [16]
    assert [line.startswith(dropped) for line in summary["auto_space_sized"]] == [True]
    base = summary["trials"][0]["params"]
    assert base["model.args.hidden"] == 16 and base["model.args.dropout"] == 0.0  # mlp's default

    # resumed with one trial more: the sizing is read back (here: a line changed to tell), and the
    # base point is not enqueued again
    sizing = json.loads((out / "auto_space.json").read_text())
    (out / "auto_space.json").write_text(json.dumps({**sizing, "changes": ["as sized before"]}))
    sweeper("run", str(spec), "--auto", "search.n_trials=3", "--out", "out", "--quiet", check=True)
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["auto_space_sized"] == ["as sized before"]
    assert len(resumed["trials"]) == 3 and [t["params"] == base for t in resumed["trials"]] == [True, False, False]
