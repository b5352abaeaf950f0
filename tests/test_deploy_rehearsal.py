"""The compose topology of deploy/compose, rehearsed as processes on loopback (no container
runtime): the machine's PostgreSQL (one database for the studies, one for MLflow's store), an
S3-compatible object store (moto's server mode), `mlflow server` with basic auth and its
artifacts in that store (proxied: the sweep's processes hold no S3 credentials), two
`sweeper worker` processes and one `sweeper run`, and optuna-dashboard on the studies. One sweep
end to end; then the queue's pool (service queue-worker) serving two queued sweeps. Synchronised
on events (the gate plugin's files, rows in the study)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import children, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer, free_port, stop_group
from pg import pg_database
from test_distributed import count, finish, gated, start, trials

COMPOSE = Path(__file__).resolve().parents[1] / "deploy" / "compose"
BUCKET = "sweeper"
# moto accepts any key pair; the MLflow server is the only process that holds them (as in compose)
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "rehearsal",
    "AWS_SECRET_ACCESS_KEY": "rehearsal-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def compose_mlflow_options() -> tuple[str, ...]:
    """The MLflow server's options of deploy/compose/compose.yaml, but those naming a place (its
    address, its stores: the rehearsal puts them on loopback), with ${VAR:-default} defaulted."""
    command = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]["mlflow"]["command"]
    placed = ("--host", "--port", "--workers", "--backend-store-uri", "--artifacts-destination")
    return tuple(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", option) for option in command if not option.startswith(placed))


def compose_auth_ini(database_uri: str) -> str:
    """deploy/compose/mlflow-auth.ini with its users database on ``database_uri``."""
    text = (COMPOSE / "mlflow-auth.ini").read_text()
    return re.sub(r"(?m)^database_uri = .*$", f"database_uri = {database_uri}", text)


def answers(url: str, auth: tuple[str, str] | None = None, host: str | None = None) -> int | None:
    """The HTTP status of GET ``url`` (with basic auth, a Host header), or None while nothing listens."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def serve(workdir: Path, name: str, *command: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(workdir / f"{name}.log", "w")
    return subprocess.Popen(
        list(command), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
    )


def stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None:
            stop_group(proc)


@pytest.fixture
def s3(workdir: Path):
    """moto's S3 server on a loopback port, with the bucket the MLflow server writes to."""
    import boto3

    port = free_port()
    proc = serve(workdir, "s3", str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(url) is not None, proc, timeout=120, what="the S3 server answering")
        client = boto3.client(
            "s3",
            endpoint_url=url,
            **{k.lower(): v for k, v in S3_KEYS.items() if k != "AWS_DEFAULT_REGION"},
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        yield url, client
    finally:
        stop(proc)


def test_the_compose_topology_runs_one_sweep_end_to_end(workdir: Path, gate: Path, s3, monkeypatch: pytest.MonkeyPatch):
    s3_url, bucket = s3
    password = secrets.token_urlsafe(18)
    dashboard = a = b = run = None
    with pg_database("studies") as studies, pg_database("mlflow") as store:
        # compose's server options and auth file, its stores on loopback: users beside the tracking store
        options = compose_mlflow_options()
        assert "--app-name=basic-auth" in options and any(o.startswith("--allowed-hosts=") for o in options)
        auth_ini = workdir / "auth.ini"
        auth_ini.write_text(compose_auth_ini(store))
        server = MlflowServer(
            workdir,
            backend=store,
            artifacts=f"s3://{BUCKET}/artifacts",
            args=options,
            env={
                **S3_KEYS,
                "MLFLOW_S3_ENDPOINT_URL": s3_url,
                "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
                "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
                "MLFLOW_AUTH_ADMIN_PASSWORD": password,
                "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
            },
        )  # CSRF tokens
        server.start()
        try:
            # the sweep's processes: tracking server and credentials only (no S3 keys, no MLflow store URL)
            clients = {
                "MLFLOW_TRACKING_URI": server.url,
                "MLFLOW_TRACKING_USERNAME": "admin",
                "MLFLOW_TRACKING_PASSWORD": password,
            }
            for key, value in clients.items():
                monkeypatch.setenv(key, value)
            for key in S3_KEYS:
                monkeypatch.delenv(key, raising=False)
            spec = gated(workdir, gate, "rehearsal", storage=studies, n_trials=6)  # batch 1: trials 0-3; 4-5 after
            a = start(workdir, "worker", str(spec), "--out", "a", "-q", log="a")
            wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
            # the dashboard reads the study's tables, which the sweep's first process creates
            # (in compose it restarts until they exist)
            dashboard_port = free_port()
            dashboard = serve(
                workdir,
                "dashboard",
                str(Path(sys.executable).parent / "optuna-dashboard"),
                studies,
                "--host",
                "127.0.0.1",
                "--port",
                str(dashboard_port),
            )
            b = start(workdir, "worker", str(spec), "--out", "b", "-q", log="b")
            wait_for(lambda: count(studies, "COMPLETE", "PRUNED") == 3, b, what="worker b finishing trials 1-3")
            run = start(workdir, "run", str(spec), "--out", "r", "-q", log="run")
            (gate / "release").touch()
            for proc, log in ((a, "a"), (b, "b"), (run, "run")):
                finish(proc, workdir, log)

            summary = json.loads((workdir / "r" / "summary.json").read_text())
            assert len(summary["trials"]) == 6 and summary["counts"].get("failed", 0) == 0
            # every trial in MLflow, nested under the sweep's one parent run, all closed
            client = MlflowClient(server.url)
            parent = summary["mlflow"]["parent_run_id"]
            runs = children(client, parent)
            assert len(runs) == 6 and {r.info.status for r in runs} == {"FINISHED"}
            assert len({t.system_attrs["sweeper_owner"] for t in trials(studies)}) >= 2  # by several processes
            # checkpoints and the exported model went through the server into the bucket
            keys = [
                o["Key"]
                for page in bucket.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
                for o in page.get("Contents", [])
            ]
            assert any("/checkpoint/trial-" in k for k in keys), keys
            assert any(k.endswith("model.torchscript.pt") for k in keys), keys
            exported = summary["export"]["formats"][0]
            assert "error" not in exported and exported["max_abs_diff"] <= 1e-4
            # the best model registered, with the champion alias
            champion = client.get_model_version_by_alias("smoke", "champion")  # export.registered_name: the spec's name
            assert champion.version == str(summary["registry"]["version"])
            # a wrong password is refused; the right one is let in
            search = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=10"
            assert answers(search, ("admin", password + "x")) == 401
            assert answers(search) == 401
            assert answers(search, ("admin", password)) == 200
            # --allowed-hosts: a request naming another host (DNS rebinding) is refused
            assert answers(search, ("admin", password), host="attacker.example") == 403
            # optuna-dashboard answers on loopback with the study
            wait_for(
                lambda: answers(f"http://127.0.0.1:{dashboard_port}/api/studies") == 200,
                dashboard,
                timeout=120,
                what="optuna-dashboard answering",
            )
            with urllib.request.urlopen(f"http://127.0.0.1:{dashboard_port}/api/studies", timeout=10) as response:
                names = [s["study_name"] for s in json.loads(response.read())["study_summaries"]]
            assert "smoke" in names

            # the queue's pool (service queue-worker): two sweeps submitted, two workers as compose
            # runs them (its database on loopback), draining the queue; tracked through the server
            pool = yaml.safe_load((COMPOSE / "compose.yaml").read_text())["services"]["queue-worker"]["command"]
            assert pool[:2] == ["worker", "--queue"]
            for name in ("team-a", "team-b"):
                queued = write_spec(workdir / f"{name}.yaml", name=name, tracking={"experiment": name})
                sweeper("submit", str(queued), "--queue", studies, "--owner", name, check=True)
            args = [
                studies if a.startswith("postgresql") else str(workdir / "q") if a.startswith("/") else a for a in pool
            ]
            queue = [start(workdir, *args, "--drain", log=f"q{i}") for i in (1, 2)]
            for i, proc in enumerate(queue, 1):
                finish(proc, workdir, f"q{i}")
            listed = {r["name"]: r for r in json.loads(sweeper("queue", studies, "--json", check=True).stdout)}
            for name in ("team-a", "team-b"):
                assert listed[name]["state"] == "finished" and listed[name]["trials_done"] == 4
                done = json.loads(Path(listed[name]["note"]).read_text())
                assert client.get_run(done["mlflow"]["parent_run_id"]).info.status == "FINISHED"
                assert "error" not in done["export"]["formats"][0]
        finally:
            for proc in (a, b, run):  # a failed assertion leaves no process behind
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            stop(dashboard)
            server.stop()
