"""The MLflow adapter against a real MLflow store (sqlite): nested runs, sweeper's tag namespace,
metrics per step, JSON artifacts read back, open children, and a disabled tracker that does
nothing; where the tracking URI comes from."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from sweeper.track.mlflow import DEFAULT_URI, TAG, Tracker, resolve_uri


def test_runs_nest_and_hold_what_was_logged(mlflow_uri: str, tmp_path: Path):
    tracker = Tracker(mlflow_uri, "tracker-unit")
    parent = tracker.start_run("sweep", tags={"kind": "sweep"}, params={"seed": 3, "long": "x" * 7000})
    child = tracker.start_run("trial-0", parent=parent, tags={"kind": "trial", "trial": 0})
    other = tracker.start_run("trial-1", parent=parent, tags={"kind": "trial", "trial": 1})
    tracker.log_metrics(child, 1, {"val_acc": 0.5, "val_loss": 1.0})
    tracker.log_history(child, [{"val_acc": 0.6}, {"val_acc": 0.7}], first_step=2)
    tracker.log_dict(child, {"a": [1, 2]}, "trial.json")
    (tmp_path / "f.txt").write_text("hello")
    tracker.log_files(child, [tmp_path / "f.txt"], "files")

    client = MlflowClient(mlflow_uri)
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags[f"{TAG}trial"] == "0"
    assert client.get_run(parent).data.params["long"] == "x" * 6000  # MLflow's cap on a param, not an error
    assert [(m.step, m.value) for m in sorted(tracker.metric_history(child, "val_acc"), key=lambda m: m.step)] == [
        (1, 0.5),
        (2, 0.6),
        (3, 0.7),
    ]
    assert tracker.read_json(child, "trial.json") == {"a": [1, 2]}
    assert "files/f.txt" in {a.path for a in client.list_artifacts(child, "files")}

    assert set(tracker.open_children(parent)) == {child, other}
    assert tracker.open_children(parent, {"trial": "1"}) == [other]
    tracker.end_run(other, "KILLED")
    assert tracker.open_children(parent) == [child] and client.get_run(other).info.status == "KILLED"
    tracker.resume_run(other, {"restarts": "1"})
    assert client.get_run(other).info.status == "RUNNING"
    assert client.get_run(other).data.tags[f"{TAG}restarts"] == "1"


def test_reading_what_is_not_there_is_a_lookup_error(mlflow_uri: str):
    tracker = Tracker(mlflow_uri, "tracker-unit")
    with pytest.raises(LookupError, match="run 0123456789abcdef at sqlite"):
        tracker.get_run("0123456789abcdef")
    run = tracker.start_run("no-artifact")
    with pytest.raises(LookupError, match="no readable trial.json"):
        tracker.read_json(run, "trial.json")


def test_a_disabled_tracker_does_nothing(tmp_path: Path):
    tracker = Tracker(None)
    assert not tracker.enabled and tracker.start_run("x", tags={"a": "b"}) is None
    for call in (
        lambda: tracker.log_metrics(None, 1, {"a": 1.0}),
        lambda: tracker.set_tags(None, {"a": 1}),
        lambda: tracker.log_dict(None, {}, "x.json"),
        lambda: tracker.end_run(None),
        lambda: tracker.log_files(None, [tmp_path / "missing"]),
        lambda: tracker.resume_run(None),
    ):
        call()  # no MLflow, no error
    assert tracker.open_children(None) == [] and not list(tmp_path.iterdir())


def test_tracking_uri_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    assert resolve_uri("http://mlflow:5000") == "http://mlflow:5000"  # the spec's or the command's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert resolve_uri(None) == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    # MLflow's default, made absolute: workers and Ray actors log from other folders
    assert DEFAULT_URI == "sqlite:///mlflow.db" and resolve_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"


def test_a_recorded_tracking_uri_holds_no_password():
    from sweeper.track.mlflow import redact

    assert redact("https://ana:s3cret@mlflow.example:5000/x") == "https://ana:***@mlflow.example:5000/x"
    assert redact("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert redact("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db" and redact(None) is None


def test_a_write_mlflow_rejects_is_left_out_with_a_warning(
    mlflow_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture
):
    """A 4xx other than 401/403 is no hiccup: not retried, not journaled; the sweep goes on.
    Without a journal folder (an interactive command) it raises."""
    from mlflow.exceptions import MlflowException

    tracker = Tracker(mlflow_uri, "tracker-unit", tmp_path / "journal")
    run = tracker.start_run("changed-param", params={"lr": 0.1})
    tracker.log_params(run, {"lr": 0.2})  # MLflow keeps a param's first value (HTTP 400)
    tracker.log_metrics(run, 1, {"val_acc": 0.5})
    assert f"rejected a write (log_batch of run {run})" in capsys.readouterr().err
    assert not (tmp_path / "journal").exists() and not tracker.outbox.journal
    client = MlflowClient(mlflow_uri)
    assert client.get_run(run).data.params["lr"] == "0.1" and client.get_run(run).data.metrics == {"val_acc": 0.5}
    with pytest.raises(MlflowException, match="Changing param values is not allowed"):
        Tracker(mlflow_uri, "tracker-unit").log_params(run, {"lr": 0.3})


def test_an_asynchronous_tracker_sends_from_its_own_thread_in_order(mlflow_uri: str, tmp_path: Path):
    import threading

    tracker = Tracker(mlflow_uri, "tracker-async", tmp_path / "journal", asynchronous=True)
    sent: list[tuple[str, str]] = []  # (write, the thread that handed it to MLflow)
    write = tracker.outbox.write

    def recording(entry: dict, file: Path | None = None):
        sent.append((entry["op"], threading.current_thread().name))
        return write(entry, file)

    tracker.outbox.write = recording
    run = tracker.start_run("trial-0", tags={"kind": "trial"}, params={"lr": 0.1})
    for step in range(1, 6):
        tracker.log_metrics(run, step, {"val_acc": step / 10})
    tracker.log_dict(run, {"a": 1}, "trial.json")
    tracker.set_tags(run, {"state": "complete"})
    tracker.end_run(run)
    # a read waits for what was queued: all of it is there
    history = sorted(tracker.metric_history(run, "val_acc"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(step, step / 10) for step in range(1, 6)]
    got = tracker.get_run(run)
    assert got.data.tags[f"{TAG}state"] == "complete" and got.data.params["lr"] == "0.1"
    assert got.info.status == "FINISHED" and tracker.read_json(run, "trial.json") == {"a": 1}
    # the run's creation answered the caller; everything else went out on the sender thread, in order
    assert sent[0] == ("create_run", "MainThread")
    assert {thread for _, thread in sent[1:]} == {"sweeper-mlflow"}
    # its end last (how many calls the batches took depends on timing: see the merge's own test)
    ops = [op for op, _ in sent]
    assert ops[-1] == "set_terminated" and ops.count("log_artifact") == 1


def test_a_run_created_without_waiting_is_known_by_its_placeholder(mlflow_uri: str, tmp_path: Path):
    import threading

    from sweeper.track.journal import is_local

    tracker = Tracker(mlflow_uri, "tracker-placeholder", tmp_path / "journal", asynchronous=True)
    threads: list[tuple[str, str]] = []
    write = tracker.outbox.write

    def recording(entry: dict, file: Path | None = None):
        threads.append((entry["op"], threading.current_thread().name))
        return write(entry, file)

    tracker.outbox.write = recording
    placeholder = tracker.new_run_id()
    run = tracker.start_run("trial-0", tags={"kind": "trial"}, params={"lr": 0.1}, run_id=placeholder)
    assert run == placeholder and is_local(run)  # the caller did not wait for MLflow
    tracker.log_metrics(run, 1, {"val_acc": 0.5})
    tracker.end_run(run)
    tracker.drain()
    made = tracker.created(run)
    assert made and not is_local(made)
    got = MlflowClient(mlflow_uri).get_run(made)
    assert got.data.params["lr"] == "0.1" and got.data.metrics == {"val_acc": 0.5} and got.info.status == "FINISHED"
    assert threads[0] == ("create_run", "sweeper-mlflow") and {t for _, t in threads} == {"sweeper-mlflow"}
    # another process's tracker finds the run by its placeholder (a tag of the run)
    assert Tracker(mlflow_uri, "tracker-placeholder").real_id(run) == made
    assert Tracker(mlflow_uri, "tracker-placeholder").new_run_id() is None  # no sender: created at once


def test_writes_still_queued_when_the_process_exits_are_sent(mlflow_uri: str):
    import subprocess
    import sys

    code = (
        f"from sweeper.track.mlflow import Tracker\n"
        f"tracker = Tracker({mlflow_uri!r}, 'tracker-exit', asynchronous=True)\n"
        f"run = tracker.start_run('trial-0')\n"
        f"for step in range(1, 51):\n    tracker.log_metrics(run, step, {{'m': step}})\n"
        f"tracker.end_run(run)\nprint(run)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    client = MlflowClient(mlflow_uri)
    assert len(client.get_metric_history(run, "m")) == 50 and client.get_run(run).info.status == "FINISHED"


def test_a_new_sqlite_database_starts_as_a_copy_of_an_empty_one_mlflow_made(tmp_path: Path, monkeypatch):
    from sweeper.track import empty_db

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    first = Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "seeded")  # MLflow makes the cached one
    assert empty_db.cache_file().is_file() and (tmp_path / "a" / "mlflow.db").is_file()
    # the next new database is a copy; an existing one is left alone
    assert empty_db.seed("sqlite:///b.db") and not empty_db.seed("sqlite:///b.db")
    assert not empty_db.seed(f"sqlite:///{tmp_path / 'c.db'}?mode=ro")  # a URI with options: MLflow's own
    trackers = {
        f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}": first,
        "sqlite:///b.db": Tracker("sqlite:///b.db", "seeded"),
    }
    for uri, tracker in trackers.items():
        run = tracker.start_run("sweep", tags={"kind": "sweep"})
        tracker.log_metrics(run, 1, {"val_acc": 0.5})
        tracker.drain()
        client = MlflowClient(uri)
        assert client.get_run(run).data.metrics == {"val_acc": 0.5}
        # MLflow's Default experiment, made where the database is opened (not where the cached one was made)
        default = client.get_experiment("0")
        assert default.name == "Default" and default.artifact_location == str(tmp_path / "mlruns" / "0")
    # sweeper's sqlite databases log ahead (WAL: a commit syncs nothing to disk); the cached copy is one file
    import sqlite3

    mode = {
        path: sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
        for path in (tmp_path / "a" / "mlflow.db", tmp_path / "b.db", empty_db.cache_file())
    }
    assert list(mode.values()) == ["wal", "wal", "delete"]


def test_the_sender_merges_a_runs_batches_until_its_status_changes():
    from sweeper.track.sender import coalesce

    def batch(run: str, **parts):
        return {"op": "log_batch", "run": run, **parts}, None

    items = [
        batch("a", params={"lr": "0.1"}, tags={"k": "trial"}),
        ({"op": "log_artifact", "run": "a", "folder": None}, ("trial.json", "{}")),
        batch("a", metrics=[["loss", 1.0, 0, 1]]),
        batch("b", metrics=[["loss", 2.0, 0, 1]]),
        batch("a", metrics=[["loss", 0.5, 0, 2]]),
        batch("a", tags={"k": "done", "state": "complete"}),
        ({"op": "set_terminated", "run": "a", "status": "FINISHED", "time": 0}, None),
        batch("a", tags={"after": "end"}),
        batch("b", metrics=[["loss", 1.5, 0, 2]]),
    ]
    out = coalesce(items)
    assert [(e["op"], e["run"]) for e, _ in out] == [
        ("log_batch", "a"),
        ("log_artifact", "a"),
        ("log_batch", "b"),
        ("set_terminated", "a"),
        ("log_batch", "a"),
    ]
    first, _, b, _, last = (e for e, _ in out)
    assert first["params"] == {"lr": "0.1"} and first["tags"] == {"k": "done", "state": "complete"}
    assert first["metrics"] == [["loss", 1.0, 0, 1], ["loss", 0.5, 0, 2]]
    assert b["metrics"] == [["loss", 2.0, 0, 1], ["loss", 1.5, 0, 2]]
    assert last["tags"] == {"after": "end"}  # written after the run's end: stays after it
    # MLflow's cap of 1000 entities a call: a batch that would pass it starts a new call
    big = [batch("c", metrics=[["m", 0.0, 0, s] for s in range(600)]) for _ in range(2)]
    assert len(coalesce(big)) == 2
