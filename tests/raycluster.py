"""A real multi-node Ray cluster on loopback for tests: `ray start --head` plus `ray start
--address` nodes, each a `--block` process that takes its Ray processes down when terminated
(never `ray stop`: it would kill every Ray process on the machine)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackCluster:
    def __init__(self, workdir: Path, nodes: int = 2, dashboard: bool = False) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_port = free_port() if dashboard else None
        # token authentication on, with a token of this cluster's own (not ~/.ray/auth_token); trial
        # workers at normal priority, as sweeper's own local Ray (search/ray/cluster.py: Ray's default
        # niceness 15 starves them whenever the machine is loaded)
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
            "RAY_worker_niceness": "0",
        }
        self.logs = workdir / "ray-nodes"
        self.logs.mkdir(exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        try:
            head = ["--head", "--port", str(self.port), "--ray-client-server-port", str(free_port())]
            head += (
                [
                    "--include-dashboard",
                    "true",
                    "--dashboard-host",
                    "127.0.0.1",
                    "--dashboard-port",
                    str(self.dashboard_port),
                ]
                if dashboard
                else ["--include-dashboard", "false"]
            )
            self._start("head", head)
            for i in range(1, nodes):
                self._start(f"node{i}", ["--address", self.address])
            self.node_ids = self._wait_for_nodes(nodes)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: list[str]) -> None:
        cmd = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            *args,
            "--num-cpus",
            "1",
            "--node-ip-address",
            "127.0.0.1",
            "--object-store-memory",
            str(100 * 2**20),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--block",
        ]
        log = open(self.logs / f"{name}.log", "w")
        self.procs.append(
            subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def alive_nodes(self) -> list[str]:
        """Node ids of the live nodes (asked from a separate driver process)."""
        code = (
            f"import ray; ray.init(address='{self.address}', logging_level='ERROR');"
            "print(' '.join(x['NodeID'] for x in ray.nodes() if x['Alive']))"
        )
        out = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True)
        return out.stdout.split() if out.returncode == 0 else []

    def _wait_for_nodes(self, n: int, timeout: float = 120) -> list[str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a ray node exited; see {self.logs}")
            ids = self.alive_nodes()
            if len(ids) == n:
                return ids
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {n} nodes in {timeout:.0f} s; see {self.logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first, then the head
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)  # its own session: only this node's processes
                    p.wait()
