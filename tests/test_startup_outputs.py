"""What a user gets from a sweep, compared with a golden made before the start-up work.

Why: the start-up work (the MLflow tracker set up, the export check and the model registration
overlapped with other work) must only make a sweep start sooner. It must leave what a user gets
unchanged: the same summary.json, the same MLflow runs, the same export files and the same
registered model. This test runs a one-trial digits sweep with the real CLI and compares a
normalised description of all four (observe()) with tests/golden/one_trial_sweep.json.

The golden was made from commit 62186fa030fab2d9cc9a8adf570bddee7082d32d (the commit before any
start-up change), in an empty folder, with

    python -m sweeper run search_spaces/digits.yaml search.n_trials=1 search.parallel=1 --out out -q

(MLflow in ./mlflow.db of that folder; no $MLFLOW_TRACKING_URI; CPU only). To regenerate it (only
when a change of the outputs is intended), from the tree that should define it:

    PYTHONPATH=/path/to/that/tree python tests/test_startup_outputs.py --regenerate /tmp/empty-folder

observe() keeps what is the same on any machine: structure, names, params, seeds, states, paths
relative to the run folder, and numbers, compared within REL/ABS (CPU kernels round differently on
other CPUs). It leaves out times, run/model ids, absolute paths, hosts, pids, git revisions, file
sizes and versions of the environment (torch, CUDA, Python, MLflow).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import SPACES, TIMING, sweeper

GOLDEN = Path(__file__).resolve().parent / "golden" / "one_trial_sweep.json"
ARGS = ("run", str(SPACES / "digits.yaml"), "search.n_trials=1", "search.parallel=1", "--out", "out", "-q")
REL = ABS = 1e-4  # numbers: math.isclose with these tolerances
# ... but a gradient's norm at the epoch's last step: it moved by 1e-3 relative between two 2-core
# AMD EPYC machines (0.12585 against 0.12597, 2026-12-06) where every other number kept 1e-4
GRAD_NORM_REL = 1e-2

# Keys whose values measure the machine or the moment, not the sweep
TIME_WORDS = ("seconds", "time", "wall", "date", "device_hours")
# Keys that name this run's ids, machine or checkout; "bytes": a file's size depends on torch's serialisation
MACHINE_KEYS = {"git_rev", "hostname", "host", "pid", "node_ip", "bytes"}
# sweeper.* tags whose values describe the environment (versions, core count, device model)
ENV_TAGS = {"torch", "cuda", "threads", "device_name"}


def _left_out(key: str) -> bool:
    """Whether a key's value is time-like, an id or machine-specific (the key is dropped)."""
    k = key.lower()
    return (
        any(word in k for word in TIME_WORDS)
        or k.endswith("_s")  # export_s, samples_per_s, heartbeat_s...
        or k in TIMING
        or k.endswith(("_id", "_uuid"))  # mlflow_run_id, parent_run_id, journal_id...
        or k in MACHINE_KEYS
    )


def _clean(value: object, folder: Path) -> object:
    """``value`` without left-out keys, with the run folder's absolute path as ``<folder>``."""
    if isinstance(value, dict):
        return {str(k): _clean(v, folder) for k, v in value.items() if not _left_out(str(k))}
    if isinstance(value, list | tuple):
        return [_clean(v, folder) for v in value]
    if isinstance(value, str):
        # both spellings: pytest's tmp_path may sit behind a symlink
        for prefix in {str(folder.resolve()), str(folder)}:
            value = value.replace(prefix, "<folder>")
    return value


def _parsed(text: str) -> object:
    """A tag's value: JSON when it is (numbers then compare within tolerance), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _sweeper_tags(tags: dict[str, str], folder: Path) -> dict[str, object]:
    """sweeper.* tags, values parsed and cleaned, without ids, times and environment versions."""
    out = {}
    for key, text in tags.items():
        name = key.removeprefix("sweeper.")
        if key.startswith("sweeper.") and not _left_out(name) and name not in ENV_TAGS:
            out[key] = _clean(_parsed(text), folder)
    return out


def _kept(path: Path, root: Path) -> bool:
    """Whether a file is listed: not a lock, a temporary file, SQLite's rollback journal (there only
    mid-transaction) or anything under a journal or tmp folder. A SQLite -wal/-shm pair IS listed:
    left after the command ends, it holds committed rows that the .db file alone lacks (a user who
    copies mlflow.db or optuna.db would get an empty store)."""
    return not path.name.endswith((".lock", ".tmp", "-journal")) and not {"journal", "tmp"} & set(
        path.relative_to(root).parts
    )


def _files(root: Path) -> list[str]:
    """Files under ``root``: relative paths, sorted (their bytes are not compared)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and _kept(p, root))


def _artifacts(list_artifacts, path: str | None = None) -> list[str]:
    """All artifact paths, recursively (``list_artifacts(path)`` lists one level)."""
    paths = []
    for info in list_artifacts(path):
        paths += _artifacts(list_artifacts, info.path) if info.is_dir else [info.path]
    return sorted(paths)


def _mlflow(folder: Path) -> dict:
    """Experiments, runs and registered models in ``folder``/mlflow.db."""
    import mlflow.artifacts
    import yaml
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri="sqlite:///" + str(folder / "mlflow.db"))
    experiments = {}
    for exp in client.search_experiments():
        runs = []
        for run in client.search_runs([exp.experiment_id]):
            tags = run.data.tags
            runs.append(
                {
                    "name": run.info.run_name,
                    "nested": "mlflow.parentRunId" in tags,
                    "status": run.info.status,
                    "params": _clean(run.data.params, folder),
                    "tag_keys": sorted(tags),
                    "tags": _sweeper_tags(tags, folder),
                    "metrics": {k: v for k, v in run.data.metrics.items() if not _left_out(k)},  # last values
                    "artifacts": _artifacts(lambda p, run=run: client.list_artifacts(run.info.run_id, p)),
                }
            )
        # the parent first, then the trials by name: the order does not depend on start times
        experiments[exp.name] = sorted(runs, key=lambda r: (r["nested"], r["name"]))

    registry = {}
    for model in client.search_registered_models():
        versions = []
        for found in client.search_model_versions(f"name='{model.name}'"):
            version = client.get_model_version(model.name, found.version)  # search leaves aliases out
            uri = client.get_model_version_download_uri(model.name, version.version)
            with tempfile.TemporaryDirectory() as tmp:
                mlmodel = yaml.safe_load(
                    Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{uri}/MLmodel", dst_path=tmp)).read_text()
                )
            signature = mlmodel.get("signature") or {}
            versions.append(
                {
                    "version": int(version.version),
                    "aliases": sorted(version.aliases),
                    "status": version.status,
                    "tags": _sweeper_tags(version.tags, folder),
                    "source_run": client.get_run(version.run_id).info.run_name if version.run_id else None,
                    "flavors": sorted(mlmodel.get("flavors", {})),
                    "signature": {k: _parsed(signature[k]) for k in ("inputs", "outputs") if signature.get(k)},
                    "files": _artifacts(get_artifact_repository(uri).list_artifacts),
                }
            )
        registry[model.name] = {
            "aliases": dict(model.aliases),
            "tags": _sweeper_tags(model.tags, folder),
            "versions": sorted(versions, key=lambda v: v["version"]),
        }
    return {"experiments": experiments, "registry": registry}


def observe(folder: Path) -> dict:
    """What a user gets from the sweep run in ``folder``, normalised to be the same on any machine
    (a JSON round trip, so that it compares with the golden as loaded)."""
    out = folder / "out"
    observed = {
        "summary": _clean(json.loads((out / "summary.json").read_text()), folder),
        "export": _clean(json.loads((out / "export.json").read_text()), folder),
        "out_files": _files(out),
        "folder": sorted(p.name for p in folder.iterdir() if _kept(p, folder)),  # mlflow.db, mlruns, out
        **_mlflow(folder),
    }
    return json.loads(json.dumps(observed))


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 200 else text[:200] + "..."


def differences(golden: object, now: object, where: str = "") -> list[str]:
    """Each place where ``now`` differs from ``golden``: ``where: golden ..., now ...``. Integers,
    strings and structure exactly; floats within REL/ABS."""
    if isinstance(golden, dict) and isinstance(now, dict):
        found = []
        for key in sorted(set(golden) | set(now)):
            here = f"{where}.{key}" if where else key
            if key not in now:
                found.append(f"{here}: missing now (golden: {_short(golden[key])})")
            elif key not in golden:
                found.append(f"{here}: not in the golden (now: {_short(now[key])})")
            else:
                found += differences(golden[key], now[key], here)
        return found
    if isinstance(golden, list) and isinstance(now, list):
        if len(golden) != len(now) and all(isinstance(x, str) for x in golden + now):  # a listing: name the changes
            gone, new = [x for x in golden if x not in now], [x for x in now if x not in golden]
            return [f"{where}: missing now {_short(gone)}, not in the golden {_short(new)}"]
        if len(golden) != len(now):
            return [f"{where}: {len(golden)} items in the golden, {len(now)} now: {_short(golden)} -> {_short(now)}"]
        return [d for i, (g, n) in enumerate(zip(golden, now)) for d in differences(g, n, f"{where}[{i}]")]
    numbers = (int, float)
    if (
        isinstance(golden, numbers)
        and isinstance(now, numbers)
        and not isinstance(golden, bool)
        and not isinstance(now, bool)
        and (isinstance(golden, float) or isinstance(now, float))
    ):
        rel = GRAD_NORM_REL if "grad_norm" in where else REL
        same = math.isclose(golden, now, rel_tol=rel, abs_tol=ABS) or (math.isnan(golden) and math.isnan(now))
    else:
        same = type(golden) is type(now) and golden == now
    return [] if same else [f"{where}: golden {_short(golden)}, now {_short(now)}"]


def run_sweep() -> None:
    """The golden's command, with the real CLI in a new process, in the current folder, MLflow in
    ./mlflow.db (not the tests' shared database: the registered model must be version 1), on the CPU
    (a GPU would train to other numbers)."""
    sweeper(*ARGS, process=True, check=True)


def test_a_sweep_gives_the_user_what_it_gave_before_the_startup_work(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_sweep()
    found = differences(json.loads(GOLDEN.read_text()), observe(workdir))
    assert not found, (
        f"what the sweep gives differs from {GOLDEN.name} (regenerate only if intended; see the docstring):\n"
        + "\n".join(found)
    )


if __name__ == "__main__":
    # python tests/test_startup_outputs.py --regenerate FOLDER: run the sweep in FOLDER (new or
    # empty) with the sweeper that `python -m sweeper` imports here, and write its golden
    if len(sys.argv) != 3 or sys.argv[1] != "--regenerate":
        sys.exit(f"usage: {sys.argv[0]} --regenerate FOLDER")
    folder = Path(sys.argv[2]).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        sys.exit(f"{folder} is not empty")
    os.chdir(folder)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    run_sweep()
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(observe(folder), indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
