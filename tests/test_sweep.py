"""End to end through the real CLI: Optuna on sqlite, MLflow on sqlite, TorchScript export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from conftest import SPACES, children, kill_at_gate, learned, sweeper, write_spec
from mlflow.tracking import MlflowClient
from test_faults import faulty  # noqa: F401 (a fixture: the faulty model plugins)


def test_digits_sweep_end_to_end(workdir: Path, mlflow_uri: str):
    proc = sweeper(
        "run",
        str(SPACES / "digits.yaml"),
        "search.n_trials=3",
        "train.epochs=3",
        "tracking.experiment=e2e-digits",
        "--out",
        "out",
        "--quiet",
        check=True,
    )
    assert "output: out" in proc.stdout
    summary = json.loads((workdir / "out" / "summary.json").read_text())

    # summary.json: resolved spec, best trial, every trial
    assert summary["spec"]["train"]["epochs"] == 3 and summary["spec"]["name"] == "digits"
    assert len(summary["trials"]) == 3
    best = summary["best"]
    assert set(best) >= {"number", "params", "value", "seed", "metrics"}
    assert best["value"] == max(t["value"] for t in summary["trials"] if t["state"] == "complete")
    assert best["value"] > 0.8
    for t in summary["trials"]:
        assert set(t) >= {"number", "state", "params", "value", "seed", "reason"}
        assert set(t["params"]) == {"optimizer.args.lr", "optimizer.args.weight_decay", "model.args.channels"}
    assert len({t["seed"] for t in summary["trials"]}) == 3

    # MLflow: one parent run, a nested run per trial with per-epoch history and provenance tags
    client = MlflowClient(mlflow_uri)
    parent_id = summary["mlflow"]["parent_run_id"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper.kind"] == "sweep"
    assert parent.data.metrics["best_val_acc"] == best["value"]
    artifacts = {a.path for a in client.list_artifacts(parent_id)}
    assert {"summary.json", "spec.yaml", "model.torchscript.pt", "spec.json"} <= artifacts
    runs = children(client, parent_id)
    assert len(runs) == 3
    for run in runs:
        tags = run.data.tags
        assert tags["sweeper.state"] in ("complete", "pruned")
        assert {"sweeper.seed", "sweeper.device", "sweeper.plugins", "sweeper.git_rev"} <= set(tags)
        assert json.loads(tags["sweeper.plugins"])["model.cnn"].startswith("sweeper==")
        assert run.data.params["model.plugin"] == "cnn"
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert [m.step for m in history] == list(range(1, len(history) + 1)) and history
    best_run = client.get_run(best["mlflow_run_id"])
    assert best_run.data.tags["sweeper.trial"] == str(best["number"])

    # TorchScript: loads in a process that never imports sweeper and reproduces the val accuracy
    from sweeper.trial.seeding import derive
    from sweeper_plugins.datasets import digits

    data = digits(val_fraction=0.2, seed=derive(0, "data"))  # the split the sweep (seed 0) trained on
    np.save(workdir / "x.npy", data.val_x.numpy())
    np.save(workdir / "y.npy", data.val_y.numpy())
    code = (
        "import sys, numpy as np, torch, warnings; warnings.simplefilter('ignore');"
        "m = torch.jit.load('out/model.torchscript.pt');"
        "x = torch.from_numpy(np.load('x.npy')); y = torch.from_numpy(np.load('y.npy'));"
        "acc = (m(x).argmax(1) == y).float().mean().item();"
        "assert not any(k.startswith('sweeper') for k in sys.modules); print(acc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert abs(float(out.stdout) - best["value"]) < 1e-6


def test_failing_trials_never_kill_the_sweep(workdir: Path, mlflow_uri: str, faulty: None):
    # the `broken` model raises on every training batch over `above` samples: above=16 fails every
    # batch of 32 (an exception of the model plugin itself; the dry build's 4 samples pass), and
    # lr=3e38 makes the loss non-finite (a searched value may diverge: the trial's own failure)
    spec = write_spec(
        workdir / "s.yaml",
        model={"plugin": "broken", "args": {"above": 1000}},
        optimizer={"plugin": "sgd", "args": {"lr": 0.1}},
        search={
            "sampler": "grid",
            "n_trials": 4,
            "space": {
                "model.args.above": {"type": "categorical", "choices": [1000, 16]},
                "optimizer.args.lr": {"type": "categorical", "choices": [0.05, 3.0e38]},
            },
        },
        schedule={"plugin": "none"},
        tracking={"experiment": "e2e-failures"},
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    trials = json.loads((workdir / "out" / "summary.json").read_text())["trials"]
    by_params = {(t["params"]["model.args.above"], t["params"]["optimizer.args.lr"]): t for t in trials}
    assert by_params[(1000, 0.05)]["state"] == "complete"
    assert by_params[(1000, 3.0e38)]["state"] == "failed"
    assert by_params[(1000, 3.0e38)]["reason"].startswith("non-finite loss")
    for lr in (0.05, 3.0e38):  # an exception raised by the model plugin itself
        assert by_params[(16, lr)]["state"] == "failed"
        assert "the fused kernel failed on a batch of 32 samples" in by_params[(16, lr)]["reason"]
    client = MlflowClient(mlflow_uri)
    failed = client.get_run(by_params[(1000, 3.0e38)]["mlflow_run_id"])
    assert failed.info.status == "FAILED" and failed.data.tags["sweeper.reason"].startswith("non-finite loss")
    assert "error.txt" in {a.path for a in client.list_artifacts(failed.info.run_id)}


def test_rerun_resumes_the_study(workdir: Path):
    spec = write_spec(workdir / "s.yaml", tracking={"experiment": "e2e-resume"})
    sweeper("run", str(spec), "search.n_trials=2", "--out", "out", "-q", check=True)
    first = json.loads((workdir / "out" / "summary.json").read_text())
    sweeper("run", str(spec), "search.n_trials=3", "--out", "out", "-q", check=True)
    second = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["number"] for t in second["trials"]] == [0, 1, 2]
    assert [t["params"] for t in second["trials"][:2]] == [t["params"] for t in first["trials"]]
    assert second["mlflow"]["parent_run_id"] == first["mlflow"]["parent_run_id"]
    sweeper("run", str(spec), "search.n_trials=3", "--out", "out", "-q", check=True)
    assert len(json.loads((workdir / "out" / "summary.json").read_text())["trials"]) == 3  # budget spent


def test_trial_of_a_killed_process_is_retried_with_its_params_and_seed(workdir: Path, gate: Path):
    spec = write_spec(workdir / "s.yaml", tracking={"experiment": "e2e-killed"})
    # trial 0 stops at the start of epoch 2 until released (the gate plugin): killed mid-trial
    args = ["search.n_trials=2", "train.epochs=2", f"schedule={{plugin: gate, args: {{folder: '{gate}', epoch: 2}}}}"]
    kill_at_gate(gate, "run", str(spec), *args, "--out", "out", "-q", what="trial 0 reaching its gate")
    storage = f"sqlite:///{workdir / 'out' / 'optuna.db'}"
    trials = optuna.load_study(study_name="smoke", storage=storage).trials
    (running,) = [t for t in trials if t.state.name == "RUNNING"]
    # its epoch 1 reaches the study with the heartbeat's next write (within 1 s), or with its end
    assert running.number == 0 and list(running.intermediate_values) in ([], [1])

    (gate / "release").touch()
    sweeper("run", str(spec), *args, "--out", "out", "-q", check=True)
    trials = json.loads((workdir / "out" / "summary.json").read_text())["trials"]
    killed = trials[running.number]
    # its process is gone (same host, dead pid): no need to wait for its lease to run out
    assert killed["state"] == "failed" and killed["reason"].startswith("interrupted")
    (retry,) = [t for t in trials if t["number"] > 1]  # trial 1 was waiting: the re-run simply trains it
    assert retry["params"] == running.params and retry["seed"] == killed["seed"]
    assert [t["state"] for t in trials if t is not killed] == ["complete", "complete"]  # the budget: 2
    study = optuna.load_study(study_name="smoke", storage=storage)
    assert study.trials[retry["number"]].user_attrs["sweeper_retry_of"] == running.number
    assert not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]


def test_live_display_shows_the_trials_table(workdir: Path):
    proc = sweeper(
        "run", str(SPACES / "smoke.yaml"), "search.n_trials=2", "tracking.enabled=false", "--out", "out", check=True
    )
    assert "best so far" in proc.stdout and "best: trial" in proc.stdout
    assert "trials: 2 complete" in proc.stdout  # median pruning starts after 2 trials: none pruned


@pytest.mark.parametrize("pruner", ["asha", "hyperband"])
def test_asha_and_hyperband_prune_on_the_optuna_backend_whatever_the_workers(workdir: Path, pruner: str):
    """Each trial is pruned against the earlier batches (a shadow study each); the pruner's
    per-trial state (its rungs, as system attrs) reaches the real study; 1 or 2 workers alike."""
    tables = []
    for parallel in (1, 2):
        spec = write_spec(workdir / "s.yaml", tracking={"experiment": f"prune-{pruner}"})
        out = workdir / f"out-{parallel}"
        sweeper(
            "run",
            str(spec),
            f"search.pruner={{type: {pruner}, min_epochs: 1}}",
            "search.n_trials=8",
            "train.epochs=5",  # rungs at epochs 1 and 3 (none past 3: spec.strategy.rungs)
            f"search.parallel={parallel}",
            "--out",
            str(out),
            "-q",
            check=True,
        )
        trials = json.loads((out / "summary.json").read_text())["trials"]
        tables.append([(t["number"], t["state"], t["params"], learned(t["history"])) for t in trials])
        pruned = [t for t in trials if t["state"] == "pruned"]
        assert pruned and all(t["epochs"] in (1, 3) and f"by the {pruner} pruner" in t["reason"] for t in pruned)
        study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'optuna.db'}")
        assert any(k.startswith("completed_rung_") for t in study.trials for k in t.system_attrs)
    assert tables[0] == tables[1]
