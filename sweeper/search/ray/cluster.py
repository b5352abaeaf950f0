"""Where a Ray sweep runs: a local Ray started for it, or a cluster joined by address (with
token authentication when one is configured), and the storage and tracking every node reaches."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.spec import SweepSpec

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "auto")


def address(spec: SweepSpec) -> str | None:
    """The cluster to join: search.ray.address, else $RAY_ADDRESS; None: a local Ray."""
    return spec.search.ray.address or os.environ.get("RAY_ADDRESS") or None


def is_remote(addr: str | None) -> bool:
    """True when the address names another machine (one where this machine's disk is not)."""
    if not addr:
        return False
    host = addr.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host in LOCAL_HOSTS:
        return False
    try:  # an address of this machine can be bound to (a Ray job's RAY_ADDRESS is the head's own IP)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
        return False
    except OSError:
        return True


def storage_path(spec: SweepSpec, out_dir: Path, addr: str | None, nodes: int = 1) -> str:
    """Tune's storage: a URI as given, else an absolute local path (default <out>/ray), which
    only a single-node cluster on this machine can use."""
    path = spec.search.ray.storage_path
    if path and "://" in path:
        return path
    if is_remote(addr) or nodes > 1:
        where = f"the Ray cluster at {addr}" if is_remote(addr) else f"this {nodes}-node Ray cluster"
        raise UserError(
            f"search.ray.storage_path: {path or 'the default <out>/ray'!r} is a path on this machine, but "
            f"{where} runs trials on other machines, which cannot write there or "
            f"read each other's checkpoints; expected shared storage that every node reaches: an "
            f"s3://bucket/prefix or gs://bucket/prefix URI, or file:///mnt/shared/... on a file system "
            f"mounted at that path on every node"
        )
    return str(Path(path).resolve() if path else (out_dir / "ray").resolve())


def check_tracking(uri: str | None, addr: str | None) -> None:
    """Trials on other machines log to MLflow from there: they need a server, not a local file."""
    if uri and is_remote(addr) and not uri.startswith(("http://", "https://", "databricks")):
        raise UserError(
            f"tracking.mlflow_uri: {uri!r} is a store on this machine, but the trials run on the Ray "
            f"cluster at {addr} and log from there; expected an MLflow server every node reaches, "
            f"e.g. http://mlflow.internal:5000 (or tracking.enabled: false)"
        )


def use_auth_token() -> None:
    """Ray does not turn token authentication on for an explicit address: do as `ray start
    --head` does and use the token when one is configured (a cluster without auth ignores it)."""
    token = (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").is_file()
    )
    if "RAY_AUTH_MODE" not in os.environ and token:
        os.environ["RAY_AUTH_MODE"] = "token"


def connect(spec: SweepSpec, addr: str | None) -> None:
    import ray

    # Tune passes this to the trial actors: keep relative paths (data roots) as in the spec. Not a
    # runtime_env: in a Ray job, a driver's own runtime_env replaces the job's working_dir.
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables (sweeper shows its own)
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
    if addr is None:  # a new local Ray for this sweep ("local": never a cluster found on the machine);
        # ray.init turns token authentication on for it
        from sweeper.trial.seeding import cpu_cores

        # worker_niceness 0: trials are this Ray's work. Ray's default (15) has them yield to anything
        # else on the machine, which starves them under load (docs/ray.md#measured).
        ray.init(
            address="local",
            num_cpus=spec.search.ray.num_cpus or cpu_cores(),
            include_dashboard=False,
            object_store_memory=spec.search.ray.object_store_mb * 2**20,
            _system_config={"worker_niceness": 0},
            **quiet,
        )
        return
    use_auth_token()
    ray.init(address=addr, **quiet)
