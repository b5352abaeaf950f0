"""A sweep's tracker in the registrar's process (track/remote.py): what it writes is what a tracker
in the sweep's process writes; its answers, exceptions and warnings reach the caller; when the
helper is killed the sweep tracks on in its own process; a sweep's process imports no MLflow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SPACES
from mlflow.tracking import MlflowClient

from sweeper.export import registrar
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.outbox import JOURNAL_TAG
from sweeper.track.remote import RemoteTracker


def _sweep_like(tracker: Tracker, artifact: Path) -> str:
    """What a sweep logs: a parent, a nested run made by the sender thread, params, tags, metrics
    per epoch, a JSON artifact and a file (given by a relative path); both ended."""
    parent = tracker.start_run("sweep", tags={"kind": "sweep"}, params={"seed": 1})
    assert parent is not None
    trial = tracker.start_run("trial-0", parent=parent, params={"lr": 0.1}, run_id=tracker.new_run_id())
    for epoch in (1, 2, 3):
        tracker.log_metrics(trial, epoch, {"val_acc": epoch / 10})
    tracker.log_dict(trial, {"number": 0}, "trial.json")
    tracker.end_run(trial)
    tracker.log_files(parent, [artifact])
    assert tracker.found_ids([trial], parent)[0] == tracker.created(trial)
    tracker.end_run(parent)
    tracker.drain()
    return parent


def _written(client: MlflowClient, parent: str) -> list[tuple]:
    """The runs under (and with) ``parent``: names, status, params, tags (sweeper's and the
    placeholder's presence), metric histories, artifacts."""
    experiment = client.get_run(parent).info.experiment_id
    runs = client.search_runs([experiment], order_by=["attributes.run_name"])
    return [
        (
            r.info.run_name,
            r.info.status,
            r.data.params,
            {k: v for k, v in r.data.tags.items() if k.startswith(TAG) and k != JOURNAL_TAG},
            JOURNAL_TAG in r.data.tags,
            {k: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)] for k in r.data.metrics},
            sorted(a.path for a in client.list_artifacts(r.info.run_id)),
        )
        for r in runs
    ]


def _channel():
    registrar.prestart()
    channel = registrar.tracking_channel()
    assert channel is not None
    return channel


def test_the_helpers_tracker_writes_what_one_in_this_process_writes(workdir: Path, mlflow_uri: str):
    (workdir / "notes.txt").write_text("a file of the sweep\n")
    here = Tracker(mlflow_uri, "here", workdir / "journal-here", asynchronous=True)
    there = RemoteTracker(_channel(), mlflow_uri, "there", workdir / "journal-there", asynchronous=True)
    client = MlflowClient(mlflow_uri)
    written_here = _written(client, _sweep_like(here, Path("notes.txt")))
    written_there = _written(client, _sweep_like(there, Path("notes.txt")))
    assert written_there == written_here
    assert [run[0] for run in written_there] == ["sweep", "trial-0"]
    # answers and exceptions come back as they are
    assert there.experiment_id == client.get_experiment_by_name("there").experiment_id
    with pytest.raises(LookupError, match="no-such-run"):
        there.get_run("no-such-run")


def test_a_killed_helper_leaves_the_sweep_tracking_in_its_own_process(
    workdir: Path, mlflow_uri: str, capsys: pytest.CaptureFixture[str]
):
    tracker = RemoteTracker(_channel(), mlflow_uri, "killed", workdir / "journal", asynchronous=True)
    parent = tracker.start_run("sweep", run_id=tracker.new_run_id())
    tracker.log_metrics(parent, 1, {"val_acc": 0.5})
    tracker.drain()  # the helper made the run and logged epoch 1
    served = registrar.process()
    os.kill(served.proc.pid, signal.SIGKILL)
    served.proc.wait()
    tracker.log_metrics(parent, 2, {"val_acc": 0.6})  # its placeholder found in MLflow by its tag
    tracker.end_run(parent)
    tracker.drain()
    assert "the MLflow helper process stopped" in capsys.readouterr().err
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_acc")] == [(1, 0.5), (2, 0.6)]
    assert registrar.tracking_channel() is None  # no registrar runs; the next one gets a new channel
    assert _channel() is registrar.tracking_channel()


def test_the_helpers_warnings_are_printed_by_the_sweeps_process(workdir: Path, capsys: pytest.CaptureFixture[str]):
    """A server that does not answer: the outbox's warning (said in the helper) on this stderr."""
    tracker = RemoteTracker(_channel(), "http://127.0.0.1:9", "away", workdir / "journal", asynchronous=False)
    tracker.log_metrics("local-0123", 1, {"val_acc": 0.5})  # journaled after the retries (~10 s)
    assert "MLflow at http://127.0.0.1:9 does not answer" in capsys.readouterr().err
    assert list((workdir / "journal").glob("*.jsonl"))


def test_a_sweep_as_shipped_imports_no_mlflow_in_its_own_process(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    command = [sys.executable, "-X", "importtime", "-m", "sweeper", "run", str(SPACES / "smoke.yaml")]
    done = subprocess.run(
        [*command, "search.n_trials=2", "--out", "out", "-q"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| mlflow\n" not in done.stderr and " mlflow\n" not in done.stderr
    assert "registered: models:/" in done.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["smoke", "trial-00000", "trial-00001"]
