"""Many processes, one study: `sweeper worker` and `sweeper run` processes sharing a sweep on a
real PostgreSQL server (tests/pg.py), killed with real SIGKILLs. Every test synchronises on
events (the gate plugin's files, rows in the study), never on how fast trials run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import TIMING, children, make_dist, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from pg import pg_url  # noqa: F401 (a fixture: a fresh database per test)


def start(workdir: Path, *args: str, env: dict[str, str] | None = None, log: str = "proc") -> subprocess.Popen:
    """The real CLI in the background; its output goes to <log>.log (read when it fails)."""
    out = open(workdir / f"{log}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def finish(proc: subprocess.Popen, workdir: Path, log: str = "proc") -> None:
    assert proc.wait(timeout=600) == 0, (workdir / f"{log}.log").read_text()
    assert "Traceback" not in (workdir / f"{log}.log").read_text()


def trials(url: str, name: str = "smoke") -> list[optuna.trial.FrozenTrial]:
    """The study's trials, read without keeping a connection: tests poll this, and a pooled
    engine per call would hold PostgreSQL connections until the server has none left."""
    from sqlalchemy.pool import NullPool

    storage = optuna.storages.RDBStorage(url, engine_kwargs={"poolclass": NullPool})
    try:
        return optuna.load_study(study_name=name, storage=storage).trials
    finally:
        storage.engine.dispose()


def count(url: str, *states: str) -> int:
    try:
        return sum(1 for t in trials(url) if t.state.name in states)
    except KeyError:  # the study does not exist yet
        return 0


def table(summary: dict) -> list:
    """What must not depend on how many processes ran the sweep (lost attempts aside)."""
    return sorted(
        (
            json.dumps(t["params"], sort_keys=True),
            t["state"],
            t["seed"],
            [{k: v for k, v in h.items() if k not in TIMING} for h in t["history"]],
        )
        for t in summary["trials"]
        if not (t["reason"] or "").startswith("interrupted")
    )


def gated(workdir: Path, folder: Path, experiment: str | None, **search: object) -> Path:
    """The smoke spec whose first trial stops at the start of epoch 2 until ``folder``/release
    exists; tracked in MLflow ``experiment`` (None: not tracked, a faster start)."""
    tracking = {"experiment": experiment} if experiment else {"enabled": False}
    return write_spec(
        workdir / f"{experiment or 'untracked'}.yaml",
        tracking=tracking,
        schedule={"plugin": "gate", "args": {"folder": str(folder), "epoch": 2}},
        search={**_smoke_search(), **search},
    )


def _smoke_search() -> dict:
    import yaml
    from conftest import SPACES

    return yaml.safe_load((SPACES / "smoke.yaml").read_text())["search"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The gated sweep, 8 trials, run by one process on sqlite with its gate open from the start:
    the table that every many-process run below must reproduce (its first 4 trials are batch 1)."""
    return one_process(tmp_path_factory.mktemp("reference"), n_trials=8)


def one_process(root: Path, **search: object) -> dict:
    """The gated sweep with ``search``'s settings run by one process on sqlite, its gate open from
    the start: its summary."""
    source = (Path(__file__).parent / "plugins" / "sweeper_test_gate.py").read_text()
    make_dist(
        root / "site",
        "sweeper-test-gate",
        "1.0",
        {"sweeper.schedules": {"gate": "sweeper_test_gate:gate"}},
        {"sweeper_test_gate.py": source},
    )
    (root / "gate").mkdir()
    (root / "gate" / "release").touch()
    spec = gated(root, root / "gate", None, **search)
    subprocess.run(
        [sys.executable, "-m", "sweeper", "run", str(spec), "--out", "out", "-q"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "site")},
        check=True,
        capture_output=True,
    )
    return json.loads((root / "out" / "summary.json").read_text())


def first(summary: dict, n: int) -> dict:
    return {**summary, "trials": [t for t in summary["trials"] if t["number"] < n]}


def test_two_workers_share_one_study_with_the_table_of_one_process(
    workdir: Path, gate: Path, pg_url: str, mlflow_uri: str, reference: dict
):
    spec = gated(workdir, gate, "two-workers", storage=pg_url, n_trials=8)
    a = start(workdir, "worker", str(spec), "--out", "a", "-q", log="a")
    wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
    b = start(workdir, "worker", str(spec), "--out", "b", "-q", log="b")
    # worker b trains the rest of the first batch; the next batch waits for trial 0's result
    wait_for(lambda: count(pg_url, "COMPLETE", "PRUNED") == 3, b, what="worker b finishing trials 1-3")
    assert count(pg_url, "WAITING") == 0 and len(trials(pg_url)) == 4
    (gate / "release").touch()
    finish(a, workdir, "a")
    finish(b, workdir, "b")
    owners = {t.system_attrs["sweeper_owner"] for t in trials(pg_url)}
    assert len(owners) == 2 and all(":" in o for o in owners)  # host:pid:tag of each worker

    # `sweeper run` joins the finished sweep from a third folder: it trains nothing, summarises,
    # and exports the best trial from the checkpoint its worker published to MLflow
    sweeper("run", str(spec), "--out", "r", "-q", check=True)
    summary = json.loads((workdir / "r" / "summary.json").read_text())
    assert len(summary["trials"]) == 8 and summary["counts"].get("failed", 0) == 0
    assert table(summary) == table(reference)
    exported = summary["export"]["formats"][0]
    assert "error" not in exported and exported["max_abs_diff"] <= 1e-4
    assert exported["val_acc"] == summary["best"]["value"]
    assert Path(summary["best"]["checkpoint"]).resolve().parent == (workdir / "r" / "checkpoints").resolve()
    assert not (workdir / "a" / "summary.json").exists()  # workers do not summarise
    client = MlflowClient(mlflow_uri)
    runs = children(client, summary["mlflow"]["parent_run_id"])
    assert len(runs) == 8 and {r.info.status for r in runs} == {"FINISHED"}

    # any finished trial exports later from a folder that never saw its checkpoint
    best = summary["best"]["mlflow_run_id"]
    sweeper("export", best, "--out", "elsewhere", "--formats", "torchscript", check=True)
    later = json.loads((workdir / "elsewhere" / "export.json").read_text())["formats"][0]
    assert "error" not in later and later["val_acc"] == summary["best"]["value"]


def test_a_killed_workers_trial_is_retried_when_its_lease_runs_out(
    workdir: Path, gate: Path, pg_url: str, mlflow_uri: str, reference: dict
):
    spec = gated(workdir, gate, "killed-worker", storage=pg_url, n_trials=4)
    # another "machine": its pid means nothing here, so only its lease can tell that it stopped
    a = start(workdir, "worker", str(spec), "--out", "a", "-q", env={"SWEEPER_HOST": "machine-a"}, log="a")
    wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
    # its MLflow run is created by the sender thread, within LINGER_S of the claim: there is one to close
    client = MlflowClient(mlflow_uri)

    def run_made() -> bool:
        exp = client.get_experiment_by_name("killed-worker")
        return bool(exp and client.search_runs([exp.experiment_id], "tags.`sweeper.trial` = '0'"))

    wait_for(run_made, a, what="trial 0's MLflow run")
    os.kill(a.pid, signal.SIGKILL)  # no chance to clean up: a machine lost mid-trial
    a.wait()
    assert [t.state.name for t in trials(pg_url)][0] == "RUNNING"
    # the gate blocks only once: the retry goes through
    sweeper("run", str(spec), "search.heartbeat_s=1", "search.lease_s=3", "--out", "r", "-q", check=True)
    summary = json.loads((workdir / "r" / "summary.json").read_text())
    lost = summary["trials"][0]
    assert lost["state"] == "failed" and "machine-a" in lost["reason"] and "lease" in lost["reason"]
    (retry,) = [t for t in summary["trials"] if t["number"] == 4]
    assert (retry["params"], retry["seed"]) == (lost["params"], lost["seed"])
    assert all(t.state.name not in ("RUNNING", "WAITING") for t in trials(pg_url))
    assert trials(pg_url)[4].user_attrs["sweeper_retry_of"] == 0
    assert table(summary) == table(first(reference, 4))  # nothing lost, nothing changed
    attempt = client.get_run(lost["mlflow_run_id"])
    assert attempt.info.status == "FAILED" and attempt.data.tags["sweeper.state"] == "interrupted"
    assert client.get_run(retry["mlflow_run_id"]).data.tags["sweeper.retry_of"] == "0"


def test_with_staleness_a_worker_trains_past_a_held_trial_and_a_kill_keeps_the_table(
    workdir: Path, gate: Path, pg_url: str, tmp_path_factory: pytest.TempPathFactory
):
    """Issue #56 item 2: search.staleness 1, batches of 4. Worker a holds trial 0 at its gate;
    worker b trains the rest of batch 0 and all of batch 4 (proposed knowing no result) instead of
    idling, and waits only for batch 8, which must know batch 0's results. Worker a is then killed:
    its trial is retried, and the table is the one process's with the same settings."""
    stale = {"n_trials": 12, "batch_size": 4, "staleness": 1}
    spec = gated(workdir, gate, None, storage=pg_url, **stale)
    a = start(workdir, "worker", str(spec), "--out", "a", "-q", env={"SWEEPER_HOST": "machine-a"}, log="a")
    wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
    b = start(workdir, "worker", str(spec), "--out", "b", "-q", log="b")
    wait_for(lambda: count(pg_url, "COMPLETE", "PRUNED") == 7, b, what="worker b finishing trials 1-7")
    assert len(trials(pg_url)) == 8  # batch 8 is not proposed while trial 0 runs
    os.kill(a.pid, signal.SIGKILL)  # another machine lost mid-trial: only its lease tells
    a.wait()
    sweeper("run", str(spec), "search.heartbeat_s=1", "search.lease_s=3", "--out", "r", "-q", check=True)
    finish(b, workdir, "b")
    summary = json.loads((workdir / "r" / "summary.json").read_text())
    assert summary["trials"][0]["state"] == "failed" and "machine-a" in summary["trials"][0]["reason"]
    assert len(summary["trials"]) == 13 and {t["state"] for t in summary["trials"][1:]} <= {"complete", "pruned"}
    assert table(summary) == table(one_process(tmp_path_factory.mktemp("stale-reference"), **stale))


def test_the_first_process_killed_the_worker_goes_on_and_a_restart_joins(
    workdir: Path, gate: Path, pg_url: str, reference: dict
):
    shared = workdir / "shared"  # a folder every machine mounts: where checkpoints are published
    spec = gated(workdir, gate, None, storage=pg_url, n_trials=8, artifact_root=str(shared))
    first = start(workdir, "run", str(spec), "--out", "r", "-q", log="first")
    wait_for(lambda: (gate / "blocked").exists(), first, what="the first process holding trial 0")
    w = start(workdir, "worker", str(spec), "--out", "w", "-q", log="w")
    wait_for(lambda: count(pg_url, "COMPLETE", "PRUNED") == 3, w, what="the worker finishing trials 1-3")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # same host, dead pid: the worker retries trial 0 at once and serves the rest of the budget
    finish(w, workdir, "w")
    assert count(pg_url, "COMPLETE", "PRUNED") == 8 and count(pg_url, "RUNNING", "WAITING") == 0
    sweeper("run", str(spec), "--out", "r", "-q", check=True)  # the kernel dropped the folder lock
    summary = json.loads((workdir / "r" / "summary.json").read_text())
    assert len(summary["trials"]) == 9 and summary["trials"][0]["reason"].startswith("interrupted")
    assert table(summary) == table(reference)
    # the best trial's checkpoint came from the shared folder; the others' were deleted there
    assert "error" not in summary["export"]["formats"][0]
    assert [p.name for p in (shared / "smoke").iterdir()] == [f"trial-{summary['best']['number']:05d}.pt"]


def test_status_shows_who_holds_what_and_stop_lets_running_trials_finish(workdir: Path, gate: Path):
    spec = gated(workdir, gate, None)
    first = start(workdir, "run", str(spec), "--out", "out", "-q", log="first")
    wait_for(lambda: (gate / "blocked").exists(), first, what="trial 0 at its gate")
    info = json.loads(sweeper("status", "out", "--json", check=True).stdout)
    assert info["state"] == "running" and info["counts"] == {"running": 1, "waiting": 3}
    (me,) = [p for p in info["processes"] if p["alive"]]
    assert me["pid"] == first.pid and me["role"] == "run" and me["holds"] in (["#0 (epoch 0)"], ["#0 (epoch 1)"])
    # the epochs a trial has done reach the study with its heartbeat's next write (within 1 s)
    wait_for(lambda: "#0 (epoch 1)" in sweeper("status", "out", check=True).stdout, first, what="epoch 1 shown")
    assert "stop requested" in sweeper("stop", "out", check=True).stdout
    shown = sweeper("status", "out", check=True).stdout
    assert "stopping" in shown and "1 running, 3 waiting" in shown and f"{first.pid}" in shown
    (gate / "release").touch()
    finish(first, workdir, "first")  # trial 0 finished; trials 1-3 were never claimed
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"]] == ["complete", "waiting", "waiting", "waiting"]
    sweeper("run", str(spec), "--out", "out", "-q", check=True)  # resumes the stopped sweep
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert len(summary["trials"]) == 4 and "waiting" not in summary["counts"]


def test_budget_is_spent_exactly_once_without_batches_and_no_point_twice(workdir: Path, pg_url: str):
    """reproducible: false: each slot once, and each sampled by its own seed (processes that
    shared the sweep's seed proposed the same points in the same order)."""
    spec = write_spec(
        workdir / "s.yaml",
        tracking={"enabled": False},
        search={**_smoke_search(), "storage": pg_url, "reproducible": False, "n_trials": 6},
    )
    procs = [start(workdir, "worker", str(spec), "--out", f"w{i}", "-q", log=f"w{i}") for i in range(2)]
    for i, proc in enumerate(procs):
        finish(proc, workdir, f"w{i}")
    made = trials(pg_url)
    assert len(made) == 6 and count(pg_url, "COMPLETE", "PRUNED") == 6
    assert len({tuple(sorted(t.params.items())) for t in made}) == 6


def test_a_second_run_on_a_folder_in_use_exits_2(workdir: Path, gate: Path):
    spec = gated(workdir, gate, None)
    first = start(workdir, "run", str(spec), "--out", "out", "-q", log="first")
    try:
        wait_for(lambda: (gate / "blocked").exists(), first, what="the first run training")
        second = sweeper("run", str(spec), "--out", "out", "-q")
        assert second.returncode == 2
        assert "in use by `sweeper run` (pid" in second.stderr and "sweeper worker" in second.stderr
    finally:
        first.kill()
        first.wait()


def test_a_worker_with_another_spec_is_refused(workdir: Path):
    spec = write_spec(workdir / "s.yaml", tracking={"enabled": False})
    sweeper("run", str(spec), "search.n_trials=1", "--out", "out", "-q", check=True)
    proc = sweeper("worker", str(spec), "model.args.depth=2", "--out", "out", "-q")
    assert proc.returncode == 2
    assert "model.args.depth (the sweep's: 1, yours: 2)" in proc.stderr


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_pool_workers_die_with_their_parent(workdir: Path, gate: Path):
    spec = gated(workdir, gate, None, parallel=2)
    main = start(workdir, "run", str(spec), "--out", "out", "-q", log="main")
    wait_for(lambda: (gate / "blocked").exists(), main, what="a pool worker at its gate")
    pool = [p for p in _children(main.pid) if p != os.getpid()]
    blocked = int((gate / "blocked").read_text())
    assert blocked in pool and len(pool) >= 2
    os.kill(main.pid, signal.SIGKILL)
    main.wait()
    wait_for(lambda: not any(_alive(p) for p in pool), what="the orphaned pool workers exiting")


def test_a_dead_pool_workers_trial_is_retried(workdir: Path, gate: Path):
    spec = gated(workdir, gate, None, parallel=2, n_trials=4)
    main = start(workdir, "run", str(spec), "--out", "out", "-q", log="main")
    wait_for(lambda: (gate / "blocked").exists(), main, what="a pool worker at its gate")
    os.kill(int((gate / "blocked").read_text()), signal.SIGKILL)  # an OOM kill, say
    finish(main, workdir, "main")
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    (lost,) = [t for t in summary["trials"] if t["state"] == "failed"]  # the gate held trial 0 or 1
    assert lost["number"] in (0, 1) and "its worker process was killed (SIGKILL)" in lost["reason"]
    (retry,) = [t for t in summary["trials"] if t["number"] == 4]
    assert (retry["params"], retry["seed"], retry["state"]) == (lost["params"], lost["seed"], "complete")
    assert summary["counts"] == {"complete": 4, "failed": 1}


def test_two_workers_ride_out_two_database_restarts_with_the_table_of_one_process(
    workdir: Path, gate: Path, reference: dict
):
    """Issue #56 item 4: the server goes away under two workers (a fast shutdown: every
    connection cut) while one trains and one waits at the batch's end, and again while both
    train; each worker says once that it waits, goes on when the server is back, and the sweep
    ends with no exit, no traceback, no trial lost or trained twice: the table of one process,
    one finished MLflow run per trial (MLflow on the same server). The cluster is the test's own
    (tests/pg.py), never the machine's shared server."""
    import yaml
    from pg import own_cluster

    with own_cluster() as cluster:
        spec = gated(workdir, gate, "restarts", storage=cluster.url, n_trials=8)
        tree = yaml.safe_load(spec.read_text())  # MLflow on the same server, as a team would run it
        tree["tracking"]["mlflow_uri"] = cluster.database("mlflow")
        spec.write_text(yaml.safe_dump(tree, sort_keys=False))
        a = start(workdir, "worker", str(spec), "--out", "a", "-q", log="a")
        wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
        b = start(workdir, "worker", str(spec), "--out", "b", "-q", log="b")
        wait_for(lambda: count(cluster.url, "COMPLETE", "PRUNED") == 3, b, what="worker b finishing trials 1-3")

        cluster.stop()  # b polls for the batch's end, a trains trial 0
        waiting = "does not answer"
        wait_for(lambda: waiting in (workdir / "b.log").read_text(), b, what="worker b waiting for the server")
        (gate / "release").touch()  # a's result is written once the server is back
        wait_for(lambda: waiting in (workdir / "a.log").read_text(), a, what="worker a waiting for the server")
        cluster.start()
        wait_for(lambda: count(cluster.url, "COMPLETE", "PRUNED") >= 5, b, what="a trial of batch 2 ending")
        cluster.restart()  # while batch 2 trains
        finish(a, workdir, "a")
        finish(b, workdir, "b")
        for log in ("a", "b"):
            said = (workdir / f"{log}.log").read_text()
            assert said.count(waiting) >= 1 and said.count("answers again") == said.count(waiting), said
        sweeper("run", str(spec), "--out", "r", "-q", check=True)
        summary = json.loads((workdir / "r" / "summary.json").read_text())
        runs = children(MlflowClient(tree["tracking"]["mlflow_uri"]), summary["mlflow"]["parent_run_id"])
        assert len(runs) == 8 and {r.info.status for r in runs} == {"FINISHED"}  # none lost, none twice
    assert len(summary["trials"]) == 8 and summary["counts"].get("failed", 0) == 0
    assert table(summary) == table(reference)


def test_a_server_that_stays_away_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch):
    """Past the wait for a server that answered before: one clear error (exit 2 at the CLI)
    naming it. A server that never answered (a wrong address) fails at once, as before."""
    import socket

    import sqlalchemy as sa
    from pg import own_cluster

    from sweeper.errors import UserError
    from sweeper.search.optuna import engine

    monkeypatch.setattr(engine, "SERVER_WAIT_S", 1.0)
    # this test's own memory of the servers that answered: an earlier test's cluster in this
    # process may have had the port the probe gets (then waited for, not refused at once)
    monkeypatch.setattr(engine, "_OUTAGE", engine._Outage())
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{probe.getsockname()[1]}/sweeps"
    with pytest.raises(sa.exc.OperationalError):
        engine.waiting_for_server(sa.create_engine(nowhere)).connect()
    with own_cluster() as cluster:
        away = engine.waiting_for_server(sa.create_engine(cluster.url))
        away.connect().close()
        away.dispose()  # no pooled connection left: the next one is new
        cluster.stop()
        with pytest.raises(UserError, match=f"the database at {cluster.url.replace('+', '[+]')} has not answered"):
            away.connect()
        cluster.start()  # for own_cluster's stop


def test_a_cut_statement_runs_again_told_that_its_first_try_may_have_gone_through(monkeypatch: pytest.MonkeyPatch):
    """riding_out: a statement cut by the server going away (an OperationalError) runs again,
    with ``cut`` set so that a compare-and-set checks what the lost try left; other errors, and
    sqlite's (locks, not outages), are raised at once."""
    import sqlalchemy as sa

    from sweeper.search.optuna import engine

    def cut_once() -> object:
        tries: list[bool] = []

        def op(cut: bool) -> list[bool]:
            tries.append(cut)
            if len(tries) == 1:
                raise sa.exc.OperationalError("COMMIT", {}, Exception("terminating connection"))
            return tries

        return op

    server = sa.engine.make_url("postgresql+psycopg://postgres@127.0.0.1:1/sweeps")
    with pytest.raises(sa.exc.OperationalError):  # a server that never answered this process: at once
        engine.riding_out(cut_once(), server, "a test")
    monkeypatch.setattr(engine._OUTAGE, "servers", {"127.0.0.1:1"})  # as if it had answered before
    assert engine.riding_out(cut_once(), server, "a test") == [False, True]
    with pytest.raises(sa.exc.OperationalError):
        engine.riding_out(cut_once(), sa.engine.make_url("sqlite://"), "a test")
    with pytest.raises(ValueError):
        engine.riding_out(lambda cut: int("not a number"), server, "a test")


def test_workers_share_a_study_through_pgbouncer_in_transaction_pooling(
    workdir: Path, gate: Path, pg_url: str, reference: dict
):
    """Issue #56 item 5: past about 30 workers their connections outgrow PostgreSQL's default
    max_connections (docs/many-machines.md#connections); pgbouncer in transaction pooling lets
    them share a few. Two workers and the summarising run, each through a pooler that holds 2
    server connections in all, give the table of one process: nothing of sweeper's (nor of
    Optuna's) needs a session of its own (no statement prepared on the server, no session
    setting, no lock held between transactions)."""
    from pg import pgbouncer

    with pgbouncer(pg_url, server_connections=2) as pooled:
        spec = gated(workdir, gate, None, storage=pooled, n_trials=8)
        gate.mkdir(parents=True, exist_ok=True)
        (gate / "release").touch()  # no trial waits: the workers run side by side at once
        workers = [start(workdir, "worker", str(spec), "--out", name, "-q", log=name) for name in ("a", "b")]
        for name, worker in zip(("a", "b"), workers):
            finish(worker, workdir, name)
        sweeper("run", str(spec), "--out", "r", "-q", check=True)
    summary = json.loads((workdir / "r" / "summary.json").read_text())
    assert len(summary["trials"]) == 8 and summary["counts"].get("failed", 0) == 0
    assert table(summary) == table(reference)
