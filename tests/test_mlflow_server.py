"""MLflow tracking server mode, end to end: a real `mlflow server` (PostgreSQL backend store,
basic auth, artifacts proxied by the server) and the real CLI logging to it with credentials
from the environment, as a team's shared server is used. The password is searched for in
everything sweeper writes; a refused login or a missing permission is a user error (exit 2).

Needs the PostgreSQL server of tests/pg.py ($SWEEPER_TEST_PG) and mlflow[auth].
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import children, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from mlflow_server import free_port, healthy, stop_group
from pg import pg_database
from test_distributed import trials as study_trials

ADMIN, ADMIN_PASSWORD = "admin", "admin-" + secrets.token_hex(8)  # >= 12 characters: MLflow requires it
# A sweeper user, not the admin: the rights of an ordinary account. Random, so that finding it
# anywhere means it leaked, and a wrong password never contains the right one.
USER, PASSWORD = "sweeper-ci", "pw-" + secrets.token_hex(12)
# Leaks to look for: the password, and the Basic auth header's encoding of it.
SECRETS = (PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
FAST = ["search.n_trials=2", "train.epochs=1"]


@dataclass(frozen=True)
class Server:
    url: str
    log: Path

    def admin(self, method: str, path: str, **json: str) -> dict:
        """A call to the server's REST API as its admin."""
        response = requests.request(
            method,
            f"{self.url}/api/{path}",
            auth=(ADMIN, ADMIN_PASSWORD),
            json=json or None,
            params=json if method == "GET" else None,
            timeout=30,
        )
        assert response.ok, f"{method} {path}: {response.status_code} {response.text}\n{self.log.read_text()}"
        return response.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the module (it takes ~20 s to start): its store and its user database are
    fresh PostgreSQL databases, dropped after the server has stopped."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    with pg_database("mlflow") as store, pg_database("mlflow_auth") as users:
        # default_permission READ: a user may read others' experiments, write only its own.
        # The credential cache: without it each request costs a PBKDF2 hash (~0.5 s on a small CI machine).
        (tmp / "auth.ini").write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = {users}\nadmin_username = {ADMIN}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 3600\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        env.update(
            MLFLOW_AUTH_CONFIG_PATH=str(tmp / "auth.ini"),
            MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN_PASSWORD,
            MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16),
            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        )  # GenAI job runners: processes sweeper never uses
        url, log = f"http://127.0.0.1:{(port := free_port())}", tmp / "server.log"
        with log.open("w") as out:  # its own process group: the server's workers stop with it
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    store,
                    "--artifacts-destination",
                    str(tmp / "artifacts"),
                    "--app-name",
                    "basic-auth",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            try:
                wait_for(lambda: healthy(url), proc, timeout=300, what="the MLflow server's /health answering")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- {log}:\n{log.read_text()}") from None
            running = Server(url, log)
            running.admin("POST", "2.0/mlflow/users/create", username=USER, password=PASSWORD)
            yield running
        finally:
            stop_group(proc)


def login(monkeypatch: pytest.MonkeyPatch, server: Server, password: str) -> None:
    """The CLI's (and this test's MlflowClient's) server and credentials: the environment only."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def leaks(text: str) -> bool:
    return any(s in text for s in SECRETS)


def test_a_sweep_logs_to_the_server_and_its_password_goes_nowhere(
    server: Server, tmp_path: Path, gate: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two processes serve one sweep (a worker and `sweeper run`, sharing a PostgreSQL study) and
    both log to the server; the worker holds trial 0 at the gate until the run has trained the rest."""
    login(monkeypatch, server, PASSWORD)
    with pg_database("study") as storage:
        spec = write_spec(
            tmp_path / "spec.yaml",
            tracking={"experiment": "server-mode"},
            schedule={"plugin": "gate", "args": {"folder": str(gate), "epoch": 1}},
        )
        args = [str(spec), "search.n_trials=4", "train.epochs=1", f"search.storage={storage}", "-q"]

        def serve(role: str) -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, "-m", "sweeper", role, *args, "--out", str(tmp_path / role)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )

        def completed() -> int:
            return sum(t.state.name == "COMPLETE" for t in study_trials(storage))

        procs = {"worker": serve("worker")}
        wait_for(lambda: (gate / "blocked").exists(), procs["worker"], what="the worker holding trial 0")
        procs["run"] = serve("run")
        wait_for(lambda: completed() == 3, procs["run"], what="the run training trials 1-3")
        (gate / "release").touch()
        outputs = {role: p.communicate(timeout=600)[0] for role, p in procs.items()}
        assert all(p.returncode == 0 for p in procs.values()), outputs
        owners = {t.system_attrs["sweeper_owner"] for t in study_trials(storage)}
    assert len(owners) == 2 and not leaks("".join(outputs.values())) and "Traceback" not in "".join(outputs.values())
    tmp_out = [tmp_path / "worker", tmp_path / "run"]

    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name("server-mode")
    # created as the sweeper user (its creator gets MANAGE), so the credentials were the ones used
    granted = server.admin("GET", "3.0/mlflow/users/permissions/list", username=USER)["permissions"]
    assert ("experiment", experiment.experiment_id, "MANAGE") in {
        (g["resource_type"], g["resource_pattern"], g["permission"]) for g in granted
    }
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = children(client, parent.info.run_id)
    assert len(runs) == 5 and len(trials) == 4
    assert parent.info.status == "FINISHED" and parent.data.tags["sweeper.kind"] == "sweep"
    assert all(t.info.status == "FINISHED" and t.data.tags["sweeper.state"] == "complete" for t in trials)
    # the best model registered, and logged in the sweep's experiment (the user may write only there)
    registry = json.loads((tmp_path / "run" / "summary.json").read_text())["registry"]
    assert registry.get("version") == 1, registry
    assert client.get_model_version(registry["name"], "1").run_id == parent.info.run_id
    [model] = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    assert model.source_run_id == parent.info.run_id

    for run in runs:  # what the server holds: tags, params, and every artifact (trial.json, ...)
        assert not leaks(repr(run.data.tags) + repr(run.data.params)), run.info.run_name
        files = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id)))
        names = {p.name for p in files.rglob("*") if p.is_file()}
        assert names >= ({"spec.json", "summary.json"} if run.info.run_id == parent.info.run_id else {"trial.json"})
        assert not [p for p in files.rglob("*") if p.is_file() and leaks(p.read_bytes().decode("latin-1"))]
    # what the sweep left on disk: checkpoints, exports, summary.json
    written = [p for out in tmp_out for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if leaks(p.read_bytes().decode("latin-1"))]


@pytest.mark.parametrize("case", ["wrong password", "no permission"])
def test_a_refused_login_or_permission_is_a_user_error(
    server: Server, tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
):
    wrong = "not-" + secrets.token_hex(12)
    login(monkeypatch, server, wrong if case == "wrong password" else PASSWORD)
    experiment = "refused"
    if case == "no permission":  # the admin's experiment: with default_permission READ, the user
        # may read it (the sweep's first call, finding it, succeeds) but not create runs in it
        experiment = "locked"
        server.admin("POST", "2.0/mlflow/experiments/create", name=experiment)
    spec = write_spec(tmp_path / "spec.yaml", tracking={"experiment": experiment})
    proc = sweeper("run", str(spec), *FAST, "--out", str(tmp_path / "out"), "-q")  # asserts: no traceback

    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the spec's warnings (settings without effect in this tiny sweep) come first; the error is last
    lines = proc.stderr.strip().splitlines()
    assert all(line.startswith("warning:") for line in lines[:-1]), lines
    message = lines[-1]
    assert message.startswith("error:"), message  # one paragraph
    assert f"tracking server at {server.url} refused" in message
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in message
    assert ("HTTP 401" if case == "wrong password" else "HTTP 403, permission denied") in message
    assert wrong not in proc.stdout + proc.stderr and not leaks(proc.stdout + proc.stderr)
    # nothing was logged: a refused login creates no experiment, a refused user no run
    client = MlflowClient(server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    found = client.get_experiment_by_name(experiment)
    assert (found is None) if case == "wrong password" else not client.search_runs([found.experiment_id])
