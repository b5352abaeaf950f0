"""The reproducibility contract: same spec and seed -> the same trial table, whatever `parallel`
is; and any trial can be replayed from its MLflow run with bitwise-equal metrics (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import children, learned, sweeper, write_spec
from mlflow.tracking import MlflowClient

# 10 trials in batches of 4, median pruning from the second batch on
ARGS = ["search.n_trials=10", "train.epochs=4", "search.pruner={type: median, min_epochs: 1, startup_trials: 2}"]


def table(out: Path) -> list:
    trials = json.loads((out / "summary.json").read_text())["trials"]
    return [(t["number"], t["state"], t["params"], t["value"], t["seed"], learned(t["history"])) for t in trials]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> dict[str, Path]:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri
    root = tmp_path_factory.mktemp("repro")
    out = {}
    for label, parallel in (("first", 1), ("again", 1), ("parallel", 2)):
        spec = write_spec(root / f"{label}.yaml", tracking={"experiment": f"repro-{label}"})
        sweeper("run", str(spec), *ARGS, f"search.parallel={parallel}", "--out", str(root / label), "-q", check=True)
        out[label] = root / label
    return out


def test_rerun_gives_an_identical_trial_table(runs):
    first = table(runs["first"])
    assert {t[1] for t in first} == {"complete", "pruned"}  # pruning decisions are covered
    assert table(runs["again"]) == first  # params, states, seeds and every metric, bitwise


def test_parallel_workers_give_the_same_table_as_one(runs):
    assert table(runs["parallel"]) == table(runs["first"])


def test_parallel_workers_share_one_study(runs, mlflow_uri: str):
    """Two worker processes serve one study: every trial once, each its MLflow run, and only the
    best trial's checkpoint kept (the parallel run of the fixture)."""
    summary = json.loads((runs["parallel"] / "summary.json").read_text())
    assert [t["number"] for t in summary["trials"]] == list(range(10))
    assert all(t["state"] in ("complete", "pruned") for t in summary["trials"])
    assert len(children(MlflowClient(mlflow_uri), summary["mlflow"]["parent_run_id"])) == 10
    assert [p.name for p in (runs["parallel"] / "checkpoints").iterdir()] == [
        f"trial-{summary['best']['number']:05d}.pt"
    ]


def test_replay_reproduces_complete_and_pruned_trials(runs, mlflow_uri: str):
    trials = json.loads((runs["parallel"] / "summary.json").read_text())["trials"]
    for state in ("complete", "pruned"):
        trial = next(t for t in trials if t["state"] == state)
        proc = sweeper("replay", trial["mlflow_run_id"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"trial {trial['number']} reproduced" in proc.stdout and "bitwise" in proc.stdout
        assert "warning" not in proc.stdout


def test_replay_detects_a_different_trial(runs, mlflow_uri: str, tmp_path: Path):
    """Not vacuous: a run whose recorded seed is not the one that produced its metrics fails."""
    client = MlflowClient(mlflow_uri)
    trial = json.loads((runs["first"] / "summary.json").read_text())["trials"][0]
    original = client.get_run(trial["mlflow_run_id"])
    record = json.loads(Path(client.download_artifacts(original.info.run_id, "trial.json", str(tmp_path))).read_text())
    forged = client.create_run(original.info.experiment_id, tags=original.data.tags)
    client.log_dict(forged.info.run_id, {**record, "seed": record["seed"] + 1}, "trial.json")
    for key in original.data.metrics:
        for m in client.get_metric_history(original.info.run_id, key):
            client.log_metric(forged.info.run_id, key, m.value, step=m.step)
    proc = sweeper("replay", forged.info.run_id)
    assert proc.returncode == 1 and "metrics differ" in proc.stdout


def test_every_trial_records_what_replay_needs(runs, mlflow_uri: str, tmp_path: Path):
    from sweeper.track.records import TrialJson

    client = MlflowClient(mlflow_uri)
    trial = json.loads((runs["first"] / "summary.json").read_text())["trials"][0]
    run = client.get_run(trial["mlflow_run_id"])
    record = json.loads(Path(client.download_artifacts(run.info.run_id, "trial.json", str(tmp_path))).read_text())
    assert set(record) >= {"spec", "seed", "params", "threads", "sampler_seed", "plugins", "git_rev"}
    assert set(record) == set(TrialJson.model_fields) and record["schema_version"] == 1  # test_ray: the same keys
    assert record["checkpoint"].endswith(f"checkpoints/trial-{trial['number']:05d}.pt")
    for tag in ("torch", "cuda", "device", "device_name", "threads", "data_fingerprint", "seed", "git_rev"):
        assert f"sweeper.{tag}" in run.data.tags


def test_replay_of_an_unknown_run_is_a_user_error():
    proc = sweeper("replay", "0123456789abcdef")
    assert proc.returncode == 2 and "not a sweeper trial run" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "forge, field",
    [
        (lambda r: {k: v for k, v in r.items() if k != "seed"}, "seed: Field required"),
        (lambda r: {**r, "threads": "many"}, "threads: Input should be a valid integer"),
        (
            lambda r: {**r, "spec": {**r["spec"], "train": {**r["spec"]["train"], "epochs": "ten"}}},
            "spec.train.epochs: Input should be a valid integer",
        ),
    ],
)
def test_a_forged_trial_json_is_a_user_error_naming_the_field(runs, mlflow_uri: str, tmp_path: Path, forge, field):
    client = MlflowClient(mlflow_uri)
    trial = json.loads((runs["first"] / "summary.json").read_text())["trials"][0]
    original = client.get_run(trial["mlflow_run_id"])
    record = json.loads(Path(client.download_artifacts(original.info.run_id, "trial.json", str(tmp_path))).read_text())
    forged = client.create_run(original.info.experiment_id, tags=original.data.tags)
    client.log_dict(forged.info.run_id, forge(record), "trial.json")
    for command in ("replay", "export"):
        proc = sweeper(command, forged.info.run_id)
        text = " ".join(proc.stderr.split())
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert f"its trial.json is not valid: {field}" in text and "Traceback" not in proc.stderr, (command, text)
