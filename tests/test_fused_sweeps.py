"""Fused sweeps through the CLI (search.fuse): every member is an ordinary trial (its own MLflow
run, trial.json, checkpoint), the table equals the same sweep trained solo within the stated
tolerance, a rerun gives the same table, `sweeper replay` of a member trains it solo and matches,
a killed fused sweep resumes, and what cannot fuse trains alone with a note saying why."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from conftest import config, kill_at_gate, learned, make_dist, sweeper, write_spec
from mlflow import MlflowClient
from test_faults import faulty  # noqa: F401 (a fixture: the greedy model plugin)

from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import execute

# fp32 on the CPU: the per-epoch metrics of a fused member against its solo run (see tests/test_fused.py)
TOLERANCE = 1e-5
# two batches of 4 fused in chunks of 4; model.args.hidden in the space: each batch may hold two architectures
FUSED = ["search.n_trials=8", "search.batch_size=4", "search.fuse=4"]


def table(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["trials"]


def same_trials(a: list[dict], b: list[dict], rel: float) -> None:
    assert [(t["number"], t["state"], t["params"], t["seed"]) for t in a] == [
        (t["number"], t["state"], t["params"], t["seed"]) for t in b
    ]
    for x, y in zip(a, b):
        for ex, ey in zip(learned(x["history"]), learned(y["history"]), strict=True):
            for key, value in ey.items():
                assert ex[key] == pytest.approx(value, rel=rel, abs=1e-12), (x["number"], key)


def test_a_fused_sweep_reruns_identically_matches_its_solo_twin_and_replays(workdir: Path, mlflow_uri: str):
    spec = write_spec(workdir / "s.yaml", tracking={"experiment": "fused-sweep"})
    first = sweeper("run", str(spec), *FUSED, "--out", "fused", check=True)
    fused = table(workdir / "fused")
    assert any(len(t["fused_with"]) > 1 for t in fused)
    for t in fused:  # a member's group holds it; a trial alone in its chunk's architecture trains solo
        assert t["number"] in t["fused_with"] or t["fused_with"] == []
    if any(len({tuple(sorted(t["fused_with"])) for t in fused if t["number"] // 4 == b}) > 1 for b in (0, 1)):
        assert "fused models, one per architecture" in " ".join(first.stdout.split())

    # the same sweep again, on two worker processes: the same table, bitwise
    sweeper("run", str(spec), *FUSED, "search.parallel=2", "--out", "again", "-q", check=True)
    same_trials(table(workdir / "again"), fused, rel=0)
    sweeper("run", str(spec), *FUSED[:2], "search.fuse=off", "--out", "solo", "-q", check=True)
    solo = table(workdir / "solo")
    assert all(t["fused_with"] == [] for t in solo)
    same_trials(fused, solo, rel=TOLERANCE)

    client = MlflowClient(mlflow_uri)
    member = next(t for t in fused if len(t["fused_with"]) > 1 and t["state"] == "complete")
    run = client.get_run(member["mlflow_run_id"])  # an ordinary trial run: per-epoch metrics, trial.json
    assert run.data.tags["sweeper.state"] == "complete" and run.data.tags["sweeper.fused_with"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [1, 2, 3]
    assert "trial.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    best = json.loads((workdir / "fused" / "summary.json").read_text())["best"]
    assert Path(best["checkpoint"]).is_file() and (workdir / "fused" / "model.torchscript.pt").is_file()

    replayed = sweeper("replay", member["mlflow_run_id"])  # trained again with its fused model's members
    text = " ".join(replayed.stdout.split())
    assert replayed.returncode == 0, replayed.stdout
    assert f"trial {member['number']} reproduced (trained again fused with trials {member['fused_with']})" in text
    assert "every metric equal bitwise" in text
    replayed = sweeper("replay", member["mlflow_run_id"], "--solo")  # trained alone, compared with the fused record
    text = " ".join(replayed.stdout.split())
    assert replayed.returncode == 0, replayed.stdout
    assert f"trial {member['number']} reproduced:" in text and "within relative 1e-05" in text


def test_a_killed_fused_sweep_resumes_to_the_table_of_an_uninterrupted_one(workdir: Path, gate: Path):
    spec = write_spec(
        workdir / "s.yaml",
        tracking={"experiment": "fused-killed"},
        search={
            "sampler": "random",
            "n_trials": 8,
            "batch_size": 4,
            "fuse": 4,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
        },
    )
    # the fifth schedule built (the second batch's first member) stops at the start of its epoch 2:
    # the first batch is finished, the second (one fused model) is mid-way
    killed = [f"schedule={{plugin: gate, args: {{folder: '{gate}', build: 5, epoch: 2}}}}"]
    kill_at_gate(gate, "run", str(spec), *killed, "--out", "out", "-q", what="the second fused batch reaching its gate")
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{workdir / 'out' / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4 + ["RUNNING"] * 4

    (gate / "release").touch()
    sweeper("run", str(spec), *killed, "--out", "out", "-q", check=True)
    resumed = table(workdir / "out")
    assert [t["state"] for t in resumed[4:8]] == ["failed"] * 4  # interrupted, retried as one fused model
    assert all(t["reason"].startswith("interrupted") for t in resumed[4:8])
    assert sorted(resumed[8]["fused_with"]) == [8, 9, 10, 11]

    plain = [f"schedule={{plugin: gate, args: {{folder: '{workdir / 'open'}', build: 0}}}}"]
    sweeper("run", str(spec), *plain, "--out", "whole", "-q", check=True)
    whole = table(workdir / "whole")
    finished = [t for t in resumed if t["state"] != "failed"]
    assert len(finished) == len(whole) == 8
    for again, once in zip(finished, whole):  # the same trials, the same results
        assert (again["params"], again["seed"], again["state"]) == (once["params"], once["seed"], once["state"])
        assert learned(again["history"]) == learned(once["history"])


@pytest.fixture
def unfusable(site: Path) -> None:
    source = (Path(__file__).parent / "plugins" / "sweeper_test_fusing.py").read_text()
    make_dist(
        site,
        "sweeper-test-fusing",
        "1.0",
        {
            "sweeper.models": {"branchy": "sweeper_test_fusing:branchy"},
            "sweeper.optimizers": {"lonely_sgd": "sweeper_test_fusing:lonely_sgd"},
        },
        {"sweeper_test_fusing.py": source},
    )
    from sweeper.pluginhost import registry

    registry.refresh()


def members(*overrides: str) -> list[TrialConfig]:
    configs = [config("train.epochs=2", *overrides, seed=20 + k) for k in range(3)]
    return [TrialConfig(k, c.seed, {}, c.spec) for k, c in enumerate(configs)]


def test_what_cannot_fuse_trains_alone_and_says_why(workdir: Path, unfusable: None):
    from sweeper.trial import fused

    # an optimizer plugin that opts out: the plan makes solo tasks, and says why
    lonely = members("optimizer={plugin: lonely_sgd, args: {lr: 0.05}}")
    tasks, notes = fused.plan(lonely, size=4)
    assert tasks == [[c] for c in lonely]
    assert "the optimizer plugin 'lonely_sgd' says it cannot be fused" in notes[0]

    # a model vmap cannot batch: the fused step fails before anything trained; each trains alone
    branchy = members("model={plugin: branchy, args: {}}")
    assert fused.plan(branchy, size=4)[0] == [branchy]
    outcomes = execute(branchy, lambda *a: False)
    assert [o.state for o in outcomes] == ["complete"] * 3
    assert all("the fused step failed" in o.info["fuse_fallback"] for o in outcomes)
    assert "fused_with" not in outcomes[0].info  # they trained solo: replayed bitwise

    spec = write_spec(
        workdir / "s.yaml",
        model={"plugin": "branchy", "args": {}},
        tracking={"experiment": "unfusable"},
        search={
            "sampler": "random",
            "n_trials": 4,
            "batch_size": 4,
            "fuse": 4,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 0.1}},
        },
    )
    ran = sweeper("run", str(spec), "--out", "out", check=True)
    assert "a fused task trained its trials one at a time" in " ".join(ran.stdout.split())
    assert [t["state"] for t in table(workdir / "out")] == ["complete"] * 4


def test_fusing_is_spec_checked():
    from sweeper.spec.search import SearchSpec

    assert SearchSpec(fuse=False).fuse == "off"  # YAML's bare `off`
    assert SearchSpec(fuse=8).fuse_size(cuda=False) == 8
    assert SearchSpec().fuse_size(cuda=False) == 1  # auto: on CUDA only
    assert SearchSpec(batch_size=64, parallel=2).fuse_size(cuda=True) == 32  # the batch shared by the workers
    assert SearchSpec(reproducible=False).fuse_size(cuda=True) == 1  # auto: no batches, no fusing
    with pytest.raises(ValueError, match="fuse needs proposed batches"):
        SearchSpec(fuse=8, reproducible=False)
    with pytest.raises(ValueError, match="search.fuse is an Optuna backend option"):
        SearchSpec(backend="ray", fuse=8)


def test_a_fused_model_that_fails_midway_keeps_the_ends_of_members_that_had_left():
    configs = members("train.epochs=3")

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        if epoch == 2:
            raise RuntimeError("the fused model broke at epoch 2")
        return number == 1  # trial 1 is pruned after epoch 1

    outcomes = execute(configs, decide)
    assert [o.state for o in outcomes] == ["failed", "pruned", "failed"]
    assert outcomes[1].reason == "pruned at epoch 1" and len(outcomes[1].history) == 1
    assert all("the fused model broke at epoch 2" in outcomes[k].reason for k in (0, 2))
    assert all(o.info["fused_with"] == [0, 1, 2] for o in outcomes)


def test_a_fused_model_out_of_memory_retries_its_members_fused_with_smaller_micro_batches(workdir: Path, faulty: None):
    spec = write_spec(
        workdir / "s.yaml",
        model={"plugin": "greedy", "args": {"fits": 8}},
        search={
            "sampler": "random",
            "n_trials": 2,
            "batch_size": 2,
            "fuse": 2,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 0.1}},
        },
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    attempts = table(workdir / "out")
    # batch 32: micro-batches of 32 and 16 do not fit, 8 do (accumulate 1 -> 2 -> 4), both members each time
    assert [t["state"] for t in attempts] == ["failed"] * 4 + ["complete"] * 2
    assert all(t["reason"].startswith("oom: OutOfMemoryError") for t in attempts[:4])
    assert [sorted(t["fused_with"]) for t in attempts] == [[0, 1]] * 2 + [[2, 3]] * 2 + [[4, 5]] * 2
    assert [t["params"] for t in attempts[4:]] == [t["params"] for t in attempts[:2]]  # the same two trials
