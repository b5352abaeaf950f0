"""Tracking never kills a trial or a sweep: while the MLflow server is away, writes wait in a
journal in the output folder and are sent once it is back, each once and in order.

A real `mlflow server` (sqlite store) is stopped and started again: under a sweep run by the
real CLI (at known points: the `gates` test schedule holds a trial until the test releases
it), and under trackers in this process; ``sweeper sync`` sends what a stopped process left.
A replay that a crash cut short (its first writes marked sent, or sent but not marked) is
replayed into a sqlite store: no run or metric twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import children, make_dist, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer, free_port

from sweeper.track import outbox
from sweeper.track.journal import FOLDER, Journal, is_local, journals, known_ids
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.outbox import JOURNAL_TAG
from sweeper.track.sync import send_journals

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the module (it takes ~15 s to start); tests stop and start it."""
    running = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield running
    running.stop()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trackers in this process go offline after one failed try, and while offline try to send
    their journal before every write (the sweep's CLI process keeps the real delays)."""
    monkeypatch.setattr(outbox, "RETRY_DELAYS_S", ())
    monkeypatch.setattr(outbox, "OFFLINE_RETRY_S", 0.0)


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's (step, value)s in the order MLflow's timestamps put them."""
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


def offline_trial(tracker: Tracker, artifact: Path, epochs: int = 3) -> tuple[str, str]:
    """What a sweep logs: a parent run, a nested trial run with params, tags, metrics per epoch,
    trial.json and a file; both ended. Returns (parent, trial) ids."""
    parent = tracker.start_run("sweep", tags={"kind": "sweep"}, params={"seed": 1})
    trial = tracker.start_run("trial-0", parent=parent, tags={"kind": "trial"}, params={"lr": 0.1})
    for epoch in range(1, epochs + 1):
        tracker.log_metrics(trial, epoch, {"val_acc": epoch / 10, "val_loss": 1 / epoch})
    tracker.log_dict(trial, {"number": 0}, "trial.json")
    tracker.log_files(trial, [artifact], "checkpoints")
    tracker.end_run(trial)
    tracker.end_run(parent)
    return parent, trial


def test_a_replay_cut_short_by_a_crash_sends_nothing_twice(tmp_path: Path, mlflow_uri: str, quick_retries: None):
    folder = tmp_path / "out" / FOLDER
    tracker = Tracker(f"http://127.0.0.1:{free_port()}", "journal-crash", folder)  # nothing listens there
    artifact = tmp_path / "model.pt"
    artifact.write_bytes(b"weights")
    parent, trial = offline_trial(tracker, artifact)
    artifact.unlink()  # the journal holds its own copy
    assert is_local(parent) and is_local(trial) and tracker.outbox.waiting() == 11
    tracker.outbox.journal.close()  # its process ends: the journal stays for another to send
    [path] = journals(folder)
    copies = {case: shutil.copytree(folder, tmp_path / case) for case in ("marked", "unmarked")}

    report = send_journals(folder, uri=mlflow_uri)  # `sweeper sync --tracking-uri`: another server
    assert (report.sent, report.waiting) == (11, 0) and not journals(folder) and not (folder / "files").exists()
    ids = known_ids(folder)  # kept after the journal was sent: records may hold the placeholders
    real_parent, real_trial = ids[parent], ids[trial]
    # a crash after 4 writes were sent and marked (the runs made, params and tags logged); and
    # one right after the runs were made, before any write was marked: both sent again here
    with Journal.adopt(copies["marked"] / path.name) as journal:
        journal.mark_sent(3, {parent: real_parent, trial: real_trial})
    for case in ("marked", "unmarked"):
        again = send_journals(copies[case], uri=mlflow_uri)
        assert again.sent == (7 if case == "marked" else 11) and again.waiting == 0

    client = MlflowClient(mlflow_uri)
    [sweep] = [
        r
        for r in client.search_runs([client.get_experiment_by_name("journal-crash").experiment_id])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    [run] = children(client, sweep.info.run_id)
    assert (sweep.info.run_id, run.info.run_id) == (real_parent, real_trial)
    assert run.data.tags[JOURNAL_TAG] == trial and run.data.params == {"lr": "0.1"}
    assert run.data.tags[f"{TAG}kind"] == "trial" and run.info.status == "FINISHED"
    assert history(client, real_trial, "val_acc") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert {a.path for a in client.list_artifacts(real_trial)} == {"trial.json", "checkpoints"}
    assert (
        Path(client.download_artifacts(real_trial, "checkpoints/model.pt", str(tmp_path / "dl"))).read_bytes()
        == b"weights"
    )


def test_writes_wait_while_the_server_is_away_and_sweeper_sync_sends_them(
    server: MlflowServer, tmp_path: Path, quick_retries: None, capsys: pytest.CaptureFixture
):
    server.stop()
    out = tmp_path / "out"
    artifact = tmp_path / "model.pt"
    artifact.write_bytes(b"weights")
    stopped = Tracker(server.url, "journal-server", out / FOLDER)  # a process that ends while the server is away
    _, left = offline_trial(stopped, artifact)
    stopped.outbox.journal.close()
    live = Tracker(server.url, "journal-server", out / FOLDER)  # a process that goes on
    going = live.start_run("trial-1", tags={"kind": "trial"})
    live.log_metrics(going, 1, {"val_acc": 0.5})
    assert is_local(going) and live.outbox.journal is not None

    waiting = sweeper("sync", str(out))
    assert waiting.returncode == 2, waiting.stdout + waiting.stderr
    assert (
        f"MLflow at {server.url} ([Errno 111] Connection refused)" in waiting.stderr
        and f"sweeper sync {out}" in waiting.stderr
    )
    assert len(journals(out / FOLDER)) == 2  # nothing lost

    server.start()
    live.log_metrics(going, 2, {"val_acc": 0.6})  # the journal first, then this write
    live.end_run(going)
    assert live.outbox.journal is None and not is_local(live.real_id(going))
    assert f"MLflow at {server.url} answers again" in capsys.readouterr().err
    sent = sweeper("sync", str(out), check=True)
    assert "sent 11 MLflow write(s)" in sent.stdout and not journals(out / FOLDER)

    client = MlflowClient(server.url)
    runs = {
        r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("journal-server").experiment_id])
    }
    assert set(runs) == {"sweep", "trial-0", "trial-1"}
    assert history(client, live.real_id(going), "val_acc") == [(1, 0.5), (2, 0.6)]
    assert history(client, runs["trial-0"].info.run_id, "val_loss") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert all(r.info.status == "FINISHED" for r in runs.values()) and runs["trial-0"].data.tags[JOURNAL_TAG] == left


@pytest.fixture
def gates(site: Path, tmp_path: Path) -> Path:
    """The `gates` schedule plugin (tests/plugins/sweeper_test_gates.py) installed; its folder."""
    make_dist(
        site,
        "sweeper-test-gates",
        "1.0",
        {"sweeper.schedules": {"gates": "sweeper_test_gates:gates"}},
        {name: (PLUGINS / name).read_text() for name in ("sweeper_test_gate.py", "sweeper_test_gates.py")},
    )
    from sweeper.pluginhost import registry

    registry.refresh()
    return tmp_path / "gates"


def test_a_sweep_goes_on_while_the_server_restarts_and_mlflow_gets_every_metric_once(
    server: MlflowServer, tmp_path: Path, gates: Path, monkeypatch: pytest.MonkeyPatch
):
    """Trial 1 stops at epoch 2 while the server stops; trials 1-3 log to the journal; trial 3
    stops at epoch 2 while the server starts again; the sweep ends normally."""
    if server.proc is None:
        server.start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    epochs, trials = 3, 4
    spec = write_spec(
        tmp_path / "spec.yaml",
        tracking={"experiment": "journal-sweep"},
        schedule={"plugin": "gates", "args": {"folder": str(gates), "epoch": 2, "first": 2, "second": 4}},
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sweeper",
            "run",
            str(spec),
            f"search.n_trials={trials}",
            f"train.epochs={epochs}",
            "search.pruner.type=none",
            "--out",
            str(out),
            "-q",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (gates / "1" / "blocked").exists(), proc, what="trial 1 held at epoch 2")
    server.stop()
    (gates / "1" / "release").touch()
    wait_for(lambda: (gates / "2" / "blocked").exists(), proc, what="trial 3 held at epoch 2")
    # trials 1-3 are logged meanwhile: the sender thread's writes go to a journal after their retries
    wait_for(lambda: journals(out / FOLDER), proc, what="the writes going to a journal")
    server.start()
    (gates / "2" / "release").touch()
    stdout, stderr = proc.communicate(timeout=600)

    assert proc.returncode == 0 and "Traceback" not in stdout + stderr, stdout + stderr
    assert "does not answer" in stderr and "sweeper sync" not in stderr  # it went offline; nothing was left
    assert not journals(out / FOLDER) and not (out / FOLDER / "files").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"complete": trials}
    client = MlflowClient(server.url)
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    assert parent.info.status == "FINISHED" and "summary.json" in {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }
    runs = {int(r.data.tags[f"{TAG}trial"]): r for r in children(client, parent.info.run_id)}
    assert sorted(runs) == list(range(trials)) and len(children(client, parent.info.run_id)) == trials  # each once
    # each known by its placeholder until made (by the sender thread, or from the journal for 2 and 3)
    assert all(r.data.tags.get(JOURNAL_TAG, "").startswith("local-") for r in runs.values())
    for record in summary["trials"]:
        run = runs[record["number"]]
        assert record["mlflow_run_id"] == run.info.run_id and run.info.status == "FINISHED"
        assert run.data.tags[f"{TAG}state"] == "complete"
        for key in record["history"][0]:  # every epoch's metric, once, in step order
            assert history(client, run.info.run_id, key) == [(e, h[key]) for e, h in enumerate(record["history"], 1)]
