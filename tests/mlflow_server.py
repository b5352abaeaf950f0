"""A real `mlflow server` process for tests: on a loopback port, in its own process group (its
workers stop with it), and able to stop and start again on the same port and stores, as a
tracking server that goes away and comes back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from conftest import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:  # not listening yet, or not ready
        return False


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM a process started with start_new_session and its children; SIGKILL after 60 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class MlflowServer:
    """``mlflow server`` with proxied artifacts; by default a sqlite backend store and the
    artifacts under ``folder``. ``backend`` and ``artifacts`` name others (PostgreSQL, s3://),
    ``args`` adds options (``--app-name basic-auth``), ``env`` sets the server's environment."""

    def __init__(
        self,
        folder: Path,
        backend: str | None = None,
        artifacts: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.folder, self.port = folder, free_port()
        self.url, self.log = f"http://127.0.0.1:{self.port}", folder / "server.log"
        self.backend = backend or f"sqlite:///{folder / 'store.db'}"
        self.artifacts = artifacts or str(folder / "artifacts")
        self.args, self.env = args, env or {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # GenAI job runners: processes sweeper never uses
        env.update(self.env)
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    self.backend,
                    "--artifacts-destination",
                    self.artifacts,
                    *self.args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            wait_for(lambda: healthy(self.url), self.proc, timeout=300, what="the MLflow server's /health answering")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- {self.log}:\n{self.log.read_text()}") from None

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_group(self.proc)
        self.proc = None
        wait_for(lambda: not healthy(self.url), timeout=60, what="the MLflow server's port closing")
