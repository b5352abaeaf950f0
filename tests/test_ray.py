"""The Ray Tune backend end to end through the real CLI: a real local Ray, a real two-node Ray
cluster on loopback, real MLflow (sqlite). Each test starts and stops its own Ray."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import children, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from raycluster import LoopbackCluster


def ray_spec(path: Path, experiment: str, train: dict | None = None, **search: object) -> Path:
    """smoke.yaml on the Ray backend: 2 epochs, ASHA, one CPU per trial (``train``: more settings)."""
    base = {
        "backend": "ray",
        "sampler": "tpe",
        "n_trials": 4,
        "pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 2},
        "resources": {"cpu": 1},
        "ray": {"num_cpus": 2},
        "space": {
            "optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True},
            "model.args.hidden": {"type": "categorical", "choices": [16, 32]},
        },
    }
    return write_spec(
        path,
        train={"epochs": 2, "batch_size": 32, **(train or {})},
        tracking={"experiment": experiment},
        search={**base, **search},
    )


def test_local_ray_sweep_with_asha_of_two_rank_trials(workdir: Path, mlflow_uri: str):
    # each trial runs as 2 DDP ranks (gloo) inside its Ray actor's resources (trial/launch.py)
    spec = ray_spec(workdir / "s.yaml", "ray-local", train={"devices": 2})
    sweeper("run", str(spec), "--out", "out", "-q", check=True, process=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())

    # summary.json: the same shape as the Optuna backend's
    assert summary["spec"]["search"]["backend"] == "ray"
    assert summary["storage"] == str((workdir / "out" / "ray" / "smoke").resolve())
    trials = summary["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert len({t["seed"] for t in trials}) == 4
    for t in trials:
        assert t["state"] in ("complete", "pruned"), t
        assert set(t["params"]) == {"optimizer.args.lr", "model.args.hidden"}
        assert len(t["history"]) == t["epochs"] and {"val_acc", "train_loss"} <= set(t["history"][-1])
        if t["state"] == "complete":
            assert t["epochs"] == 2 and t["value"] == t["history"][-1]["val_acc"]
        else:
            assert t["epochs"] < 2 and t["reason"].startswith("stopped at epoch 1 by the asha scheduler")
    best = summary["best"]
    assert best["value"] == max(t["value"] for t in trials if t["state"] == "complete")
    assert Path(best["checkpoint"]).is_file()
    exported = summary["export"]["formats"][0]
    assert exported["format"] == "torchscript" and "error" not in exported

    # MLflow: trial runs logged by the workers, nested under the sweep's run, all closed
    client = MlflowClient(mlflow_uri)
    parent_id = summary["mlflow"]["parent_run_id"]
    assert client.get_run(parent_id).info.status == "FINISHED"
    runs = {r.info.run_id: r for r in children(client, parent_id)}
    assert set(runs) == {t["mlflow_run_id"] for t in trials}
    for t in trials:
        run = runs[t["mlflow_run_id"]]
        assert run.info.status == "FINISHED"
        assert run.data.tags["sweeper.state"] == t["state"] and run.data.tags["sweeper.trial"] == str(t["number"])
        assert run.data.tags["sweeper.ray_node_id"] == t["node_id"]
        if t["state"] == "complete":  # closed by its actor with the launcher's info (a stopped one by the driver)
            assert run.data.tags["sweeper.ranks"] == "2"
        history = client.get_metric_history(run.info.run_id, "val_acc")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == [h["val_acc"] for h in t["history"]]
        assert "trial.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Two Ray nodes on this machine (separate `ray start` processes and ports), token auth on."""
    c = LoopbackCluster(tmp_path_factory.mktemp("cluster"), nodes=2, dashboard=True)
    yield c
    c.stop()


def test_sweep_on_a_two_node_cluster_by_address(
    workdir: Path, mlflow_uri: str, cluster: LoopbackCluster, monkeypatch: pytest.MonkeyPatch
):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):  # the cluster's token, as its users would have it
        monkeypatch.setenv(key, cluster.env[key])
    spec = ray_spec(
        workdir / "s.yaml",
        "ray-cluster",
        sampler="random",
        pruner={"type": "none"},
        # no actor reuse: a trial waiting for a new actor on the second node (its start is slower
        # under load) would otherwise take over a finished trial's actor on the first node
        ray={"address": cluster.address, "max_concurrent_trials": 2, "reuse_actors": False},
    )
    refused = sweeper("run", str(spec), "--out", "out", "-q", process=True)  # <out>/ray: not shared storage
    assert refused.returncode == 2 and "this 2-node Ray cluster runs trials on other machines" in " ".join(
        refused.stderr.split()
    )
    # every node of this cluster is on this machine: a local folder is a shared mount for them
    shared = f"search.ray.storage_path=file://{workdir / 'ray'}"
    sweeper("run", str(spec), shared, "export.keep_checkpoints=all", "--out", "out", "-q", check=True, process=True)
    assert len(cluster.alive_nodes()) == 2  # the sweep disconnected from the cluster, it did not stop it
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 4 and all(t["state"] == "complete" for t in trials)
    assert {t["node_id"] for t in trials} == set(cluster.node_ids)  # trials ran on both nodes
    client = MlflowClient(mlflow_uri)
    runs = children(client, summary["mlflow"]["parent_run_id"])
    assert {r.data.tags["sweeper.ray_node_id"] for r in runs} == set(cluster.node_ids)

    # keep_checkpoints: all fetched every trial's final state from the shared storage
    assert sorted(p.name for p in (workdir / "out" / "checkpoints").iterdir()) == [
        f"trial-{n:05d}.pt" for n in range(4)
    ]
    # trial.json: the same fields as on the Optuna backend; `sweeper export` takes a Ray trial's
    # run, here one that is not the best and ran on the other node than the best
    from sweeper.track.records import TrialJson

    record = json.loads(Path(client.download_artifacts(runs[0].info.run_id, "trial.json", str(workdir))).read_text())
    assert set(record) == set(TrialJson.model_fields)
    best = summary["best"]["number"]
    other = next(t for t in trials if t["number"] != best and t["node_id"] != trials[best]["node_id"])
    proc = sweeper("export", other["mlflow_run_id"], "--formats", "onnx", "--out", "later", check=True)
    report = json.loads((workdir / "later" / "export.json").read_text())
    assert report["source"]["trial"] == other["number"] and "error" not in report["formats"][0]
    assert report["eager_val_acc"] == other["value"] and "later/model.onnx" in proc.stdout
    assert "export/model.onnx" in {a.path for a in client.list_artifacts(other["mlflow_run_id"], "export")}


def test_submit_runs_the_sweep_as_a_ray_job(
    workdir: Path, mlflow_uri: str, cluster: LoopbackCluster, monkeypatch: pytest.MonkeyPatch
):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        monkeypatch.setenv(key, cluster.env[key])
    spec = ray_spec(workdir / "s.yaml", "ray-job", n_trials=2, sampler="random", pruner={"type": "none"})
    dashboard = f"http://127.0.0.1:{cluster.dashboard_port}"
    proc = sweeper(
        "submit",
        str(spec),
        "train.epochs=1",
        f"search.ray.storage_path=file://{workdir / 'ray'}",
        "--address",
        dashboard,
        "--out",
        str(workdir / "job-out"),
        check=True,
        process=True,
    )
    job_id = re.search(r"submitted Ray job (\S+);", proc.stdout).group(1)
    assert f"ray job logs --follow --address {dashboard} {job_id}" in proc.stdout

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    deadline = time.time() + 300
    while time.time() < deadline and not client.get_job_status(job_id).is_terminal():
        time.sleep(1)
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED, client.get_job_logs(job_id)[-3000:]
    summary = json.loads((workdir / "job-out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert summary["spec"]["train"]["epochs"] == 1  # the override travelled with the spec
    assert len(children(MlflowClient(mlflow_uri), summary["mlflow"]["parent_run_id"])) == 2


def _finished_in_snapshot(out: Path) -> int:
    """Trials that Tune's latest experiment snapshot (what a re-run restores) holds as finished."""
    snapshots = sorted(out.rglob("experiment_state-*.json"))
    try:
        trials = json.loads(snapshots[-1].read_text())["trial_data"] if snapshots else []
    except (OSError, ValueError, KeyError):  # being replaced: read the next one
        return 0
    return sum(json.loads(state)["status"] == "TERMINATED" for state, _ in trials)


def test_killed_sweep_resumes_without_losing_trials(workdir: Path, mlflow_uri: str, gate: Path):
    # one trial at a time; the third one stops at its second epoch until released (the gate
    # plugin), so the kill lands while trials 0-1 are done and trial 2 runs, whatever the speed
    spec = ray_spec(
        workdir / "s.yaml",
        "ray-resume",
        n_trials=4,
        pruner={"type": "none"},
        ray={"num_cpus": 1, "max_concurrent_trials": 1},
    )
    args = ["train.epochs=3", f"schedule={{plugin: gate, args: {{folder: '{gate}', build: 3, epoch: 2}}}}"]
    cmd = [sys.executable, "-m", "sweeper", "run", str(spec), *args, "--out", "out", "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (gate / "blocked").exists(), proc, what="the third trial reaching its gate")
        # Tune restores what its last snapshot holds: kill once it holds the two finished trials
        wait_for(lambda: _finished_in_snapshot(workdir / "out") == 2, proc, what="a snapshot with 2 finished trials")
    finally:
        # no clean-up: like a crash or a lost login node; the whole process group, so the local Ray
        # this driver started goes with it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("ray-resume")
    runs = client.search_runs([exp.experiment_id], "tags.`sweeper.kind` = 'trial'")
    done_before = [r for r in runs if r.data.tags.get("sweeper.state") == "complete"]
    (running,) = [r for r in runs if r.info.status == "RUNNING"]
    assert len(done_before) == 2 and running.data.tags["sweeper.trial"] == "2"
    assert len(client.get_metric_history(running.info.run_id, "val_acc")) == 1  # stopped in epoch 2

    (gate / "release").touch()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    trials = summary["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert all(t["state"] == "complete" and t["epochs"] == 3 for t in trials)
    by_run = {t["mlflow_run_id"]: t for t in trials}
    for r in done_before:  # finished before the kill: kept as they were, not trained again
        assert r.info.run_id in by_run
        assert by_run[r.info.run_id]["value"] == r.data.metrics["val_acc"]
    # the interrupted trial ran again from its start, in a new MLflow run; the old one is closed
    killed = client.get_run(running.info.run_id)
    assert killed.info.status == "KILLED" and killed.data.tags["sweeper.state"] == "interrupted"
    again = next(t for t in trials if t["number"] == 2)
    assert again["mlflow_run_id"] != running.info.run_id
    assert summary["mlflow"]["parent_run_id"] == running.data.tags["mlflow.parentRunId"]
    assert len(children(client, summary["mlflow"]["parent_run_id"])) == 5  # 4 trials + 1 interrupted run


@pytest.mark.parametrize(
    "override, message",
    [
        ("search.parallel=2", "search.parallel is an Optuna backend option and backend is 'ray'"),
        ("search.storage=sqlite:///x.db", "search.storage is an Optuna backend option"),
    ],
)
def test_optuna_only_options_are_refused_with_ray(workdir: Path, override: str, message: str):
    proc = sweeper("validate", str(ray_spec(workdir / "s.yaml", "x")), override)
    assert proc.returncode == 2 and message in proc.stderr.replace("\n", "")


def test_ray_options_are_refused_with_optuna(workdir: Path):
    spec = write_spec(workdir / "s.yaml", search={"backend": "optuna", "ray": {"address": "10.0.0.1:6379"}})
    proc = sweeper("validate", str(spec))
    assert proc.returncode == 2 and "search.ray configures the Ray backend" in proc.stderr.replace("\n", "")


def test_remote_cluster_with_local_storage_is_refused(workdir: Path):
    spec = ray_spec(workdir / "s.yaml", "x", ray={"address": "10.1.2.3:6379", "storage_path": "/data/ray"})
    proc = sweeper("run", str(spec), "--out", "out", "-q", timeout=120, process=True)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "search.ray.storage_path: '/data/ray' is a path on this machine" in text
    assert "shared storage that every node reaches" in text
    assert "Traceback" not in proc.stderr


def _ray_worker(pid: int) -> bool:
    try:
        return "ray::" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def test_a_killed_worker_retries_its_trial_from_its_last_checkpoint(workdir: Path, mlflow_uri: str, gate: Path):
    # one trial at a time; search.ray.max_failures: 1 makes trials checkpoint every epoch; trial 0
    # stops at the start of epoch 4 (the gate plugin), after report(epoch 3) stored its checkpoint
    spec = ray_spec(
        workdir / "s.yaml",
        "ray-retry",
        n_trials=2,
        sampler="random",
        pruner={"type": "none"},
        ray={"num_cpus": 1, "max_concurrent_trials": 1, "max_failures": 1},
    )
    epochs, stop = 6, 4
    cmd = [
        sys.executable,
        "-m",
        "sweeper",
        "run",
        str(spec),
        f"train.epochs={epochs}",
        "--out",
        "out",
        "-q",
        f"schedule={{plugin: gate, args: {{folder: '{gate}', build: 1, epoch: {stop}}}}}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    client = MlflowClient(mlflow_uri)
    try:
        wait_for(
            lambda: (gate / "blocked").exists() and (gate / "blocked").read_text(),
            proc,
            what="trial 0 reaching its gate",
        )
        exp = client.get_experiment_by_name("ray-retry")
        (victim,) = client.search_runs([exp.experiment_id], "tags.`sweeper.trial` = '0'")
        pid = int(victim.data.tags["sweeper.pid"])
        assert (gate / "blocked").read_text() == str(pid) and _ray_worker(pid), f"pid {pid} is not the trial's worker"
        os.kill(pid, signal.SIGKILL)  # like a lost node: no clean-up in the worker
        done_at_kill = len(client.get_metric_history(victim.info.run_id, "val_acc"))
        assert done_at_kill == stop - 1
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output

    summary = json.loads((workdir / "out" / "summary.json").read_text())
    trial = summary["trials"][0]
    assert [t["state"] for t in summary["trials"]] == ["complete", "complete"]
    assert trial["epochs"] == epochs and len(trial["history"]) == epochs and trial["restarts"] == 1
    assert trial["mlflow_run_id"] == victim.info.run_id  # the same MLflow run went on

    run = client.get_run(victim.info.run_id)
    resumed_from = int(run.data.tags["sweeper.resumed_from_epoch"])
    assert run.info.status == "FINISHED" and run.data.tags["sweeper.restarts"] == "1"
    assert resumed_from == done_at_kill and run.data.tags["sweeper.pid"] != str(pid)
    logged = client.get_metric_history(run.info.run_id, "val_acc")
    steps = [m.step for m in logged]
    assert sorted(set(steps)) == list(range(1, epochs + 1))
    # epochs 1..k were not trained again: each logged once; epoch k+1 twice at most (a kill between
    # its log and its checkpoint), then with the same value (the resume is bitwise)
    assert all(steps.count(e) == 1 for e in range(1, resumed_from + 1))
    assert all(len({m.value for m in logged if m.step == e}) == 1 for e in set(steps))
    assert [h["val_acc"] for h in trial["history"]] == [
        next(m.value for m in logged if m.step == e) for e in range(1, epochs + 1)
    ]
    assert len(children(client, summary["mlflow"]["parent_run_id"])) == 2  # no run for the retry

    # the interrupted-and-resumed trial equals an uninterrupted one, every epoch, bitwise
    replay = sweeper("replay", run.info.run_id)
    assert replay.returncode == 0 and "bitwise" in replay.stdout, replay.stdout + replay.stderr


def test_pbt_exploits_a_donors_checkpoint_with_mutated_hyperparameters(workdir: Path, mlflow_uri: str):
    space = {
        "optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True},
        "optimizer.args.weight_decay": {"type": "float", "low": 1.0e-6, "high": 1.0e-2, "log": True},
        "model.args.hidden": {"type": "categorical", "choices": [16, 32]},
    }
    # a population of 4 side by side (half a CPU each), 4 epochs: a perturbation at epoch 2,
    # synchronous: the round ranks all 4, so the last one always takes over the first one's state
    spec = ray_spec(
        workdir / "s.yaml",
        "ray-pbt",
        n_trials=4,
        sampler="random",
        space=space,
        pruner={"type": "pbt", "perturbation_interval": 2, "synch": True},
        resources={"cpu": 0.5},
    )
    epochs = 4
    sweeper(
        "run",
        str(spec),
        f"train.epochs={epochs}",
        "dataset.args.num_train=2048",
        "--out",
        "out",
        "-q",
        check=True,
        process=True,
    )
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    trials = {t["number"]: t for t in summary["trials"]}
    assert sorted(trials) == [0, 1, 2, 3]
    for t in trials.values():  # every trial ran to the end; its value is its last epoch's
        assert t["state"] == "complete" and t["epochs"] == epochs and len(t["history"]) == epochs, t
        assert t["value"] == t["history"][-1]["val_acc"]
    best = summary["best"]
    assert best["value"] == max(t["value"] for t in trials.values()) and Path(best["checkpoint"]).is_file()
    assert "error" not in summary["export"]["formats"][0]

    exploited = [t for t in trials.values() if t.get("exploits")]
    assert exploited, "no trial exploited another in its perturbation round"
    client = MlflowClient(mlflow_uri)
    for t in exploited:
        exploit = t["exploits"][-1]
        k, donor = exploit["epoch"], exploit["donor"]
        assert exploit["params"] == t["params"] and 1 <= k < epochs

        # Tune's own record of the trial since its last start (Tune rewrites result.json then): after
        # the exploit it reported epochs after k, not from 1, as its iterations k+1, k+2, ...
        rows = [
            json.loads(line)
            for line in next((workdir / "out" / "ray" / "smoke").glob(f"trial-{t['number']:05d}-*/result.json"))
            .read_text()
            .splitlines()
        ]
        rows = [(r["epoch"], r["training_iteration"]) for r in rows if r["mlflow_run_id"] == t["mlflow_run_id"]]
        assert rows and all(e > k and i == e for e, i in rows) and rows[-1][0] == epochs, rows

        # MLflow: a new run tagged with its donor, epochs 1..k the donor's, then its own
        run = client.get_run(t["mlflow_run_id"])
        assert run.data.tags["sweeper.pbt_donor"] == str(donor) and run.data.tags["sweeper.pbt_epoch"] == str(k)
        assert run.info.status == "FINISHED" and run.data.tags["sweeper.state"] == "complete"
        logged = sorted(client.get_metric_history(run.info.run_id, "val_acc"), key=lambda m: m.step)
        assert [m.step for m in logged] == list(range(1, epochs + 1))
        assert [m.value for m in logged] == [h["val_acc"] for h in t["history"]]
        donor_runs = client.search_runs([run.info.experiment_id], f"tags.`sweeper.trial` = '{donor}'")
        donor_curves = [
            [
                m.value
                for m in sorted(client.get_metric_history(r.info.run_id, "val_acc"), key=lambda m: m.step)
                if m.step <= k
            ]
            for r in donor_runs
        ]
        assert [m.value for m in logged[:k]] in donor_curves  # what the donor had logged by epoch k

        # the trial's earlier run is closed as exploited; its lr changed mid-run
        earlier = client.search_runs(
            [run.info.experiment_id], f"tags.`sweeper.trial` = '{t['number']}' and tags.`sweeper.state` = 'exploited'"
        )
        assert earlier and all(r.info.status == "FINISHED" for r in earlier)
        assert float(run.data.params["optimizer.args.lr"]) == exploit["params"]["optimizer.args.lr"]
        assert {float(r.data.params["optimizer.args.lr"]) for r in earlier} != {exploit["params"]["optimizer.args.lr"]}

    refused = sweeper("replay", exploited[0]["mlflow_run_id"])
    assert refused.returncode == 2 and "a PBT exploit" in refused.stderr, refused.stderr


def test_a_snapshot_copy_that_raced_the_next_snapshot_logs_nothing(workdir: Path):
    """Tune's background copy of its staging folder can miss a temporary file the next snapshot
    renamed (CI saw the traceback); that copy is superseded, so sweeper drops its error and keeps
    every other error Tune logs there."""
    import logging

    import pyarrow.fs

    from sweeper.search.ray.driver import STATE_LOGGER, StaleCopyFilter

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    log = logging.getLogger(STATE_LOGGER)
    log.addHandler(handler)
    log.addFilter(stale := StaleCopyFilter())
    try:
        (workdir / "staging").mkdir()
        try:  # what Tune's copy raised: pyarrow's own error for a file gone from the staging folder
            pyarrow.fs.copy_files(str(workdir / "staging" / ".tmp-state.json"), str(workdir / "copy.json"))
        except FileNotFoundError:
            log.error("Saving experiment state to storage failed with exception: ", exc_info=True)
        try:
            raise PermissionError("storage refused the write")
        except PermissionError:
            log.error("Saving experiment state to storage failed with exception: ", exc_info=True)
    finally:
        log.removeHandler(handler)
        log.removeFilter(stale)
    assert [r.exc_info[0] for r in seen if r.exc_info] == [PermissionError]
