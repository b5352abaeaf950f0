"""Shared fixtures: every test runs in its own folder, all tests share one MLflow sqlite DB
(creating an MLflow database costs seconds), each test in its own experiment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPACES = REPO / "search_spaces"
# Metrics that measure the machine, not the training: left out of bitwise comparisons.
TIMING = ("epoch_seconds", "samples_per_s", "gpu_mem_peak_mb")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one (docs/gpu.md lists these tests)")


# Modules whose tests start a local Ray (or join one): kept on one test worker, one Ray at a time
RAY_MODULES = {"test_ray", "test_faults", "test_objectives", "test_peers"}
# The groups that take longest (each 1-10 worker-minutes), handed out first, longest first
# (./dev test passes --no-loadscope-reorder, which keeps this order): one of them started last
# would keep one worker busy while the other has nothing left to do. Measured under load with
# `./dev test --durations=0` (a group's time: its tests' setup, call and teardown summed).
LONGEST_FIRST = (
    "ray",
    "test_queue",
    "test_distributed",
    "test_gpu_check",
    "test_deploy_rehearsal",
    "test_ddp",
    "test_sweep",
    "test_export",
    "test_example_plugin",
    "test_budgets",
    "test_mlflow_server",
    "test_earlier_sweeps",
    "test_wheel",
    "test_fused_sweeps",
    "test_fused",
    "test_journal",
    "test_browser",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run only where CUDA is available (tests/test_gpu.py). Each test gets
    its pytest-xdist group (``./dev test`` runs two workers, ``--dist loadgroup``): its module, so
    that a module's shared sweeps (module fixtures) are made once, on one worker; the Ray modules
    share one group; the gpu_check processes are groups of their own, so both workers take some.
    The groups of LONGEST_FIRST come first, in its order (a stable sort keeps a module's tests
    together and in their order)."""
    for item in items:
        module = item.path.stem
        group = item.name if module == "test_gpu_check" else "ray" if module in RAY_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        module = item.path.stem
        name = "ray" if module in RAY_MODULES else module
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return tmp_path


def write_spec(path: Path, base: str = "smoke", **changes: object) -> Path:
    """A copy of search_spaces/<base>.yaml with top-level sections replaced."""
    spec = yaml.safe_load((SPACES / f"{base}.yaml").read_text())
    spec.update(changes)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sweeper(
    *args: str, check: bool = False, timeout: float = 600, process: bool = False
) -> subprocess.CompletedProcess:
    """Run the real CLI, as a user would: its exit code, stdout and stderr. Whatever the outcome (a
    result, a user error with exit 2, a sweep without a completed trial), the CLI never shows a
    traceback.

    In this process by default (tests/inprocess.py: a new process costs ~5 s of imports).
    ``process=True``: ``python -m sweeper`` in a new process, for what needs one: a Ray sweep
    (Ray never starts in the test process), a process that is killed, or one whose environment is
    not this process's. ``timeout``: seconds, a bound for a hung test."""
    if process:
        proc = subprocess.run(
            [sys.executable, "-m", "sweeper", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "200"},
        )
    else:
        import inprocess

        proc = inprocess.invoke(list(args), {"COLUMNS": "200"}, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sweeper {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    assert "Traceback" not in proc.stdout + proc.stderr, f"sweeper {' '.join(args)}:\n{proc.stderr}"
    return proc


# Runs each command of argv[1] (a JSON list of argument lists) with sweeper's CLI in this one
# interpreter; prints a JSON list of {"code", "output"}
_CALLS = """
import json, sys
from typer.testing import CliRunner
from sweeper.cli import app
runner = CliRunner()
results = [runner.invoke(app, args, prog_name="sweeper") for args in json.loads(sys.argv[1])]
print(json.dumps([{"code": r.exit_code, "output": r.output} for r in results]))
"""


def sweeper_calls(python: Path | str, *commands: list[str], cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """The outputs of several quick sweeper commands (``plugins``, ``init``, ``validate``...), run
    by ``python`` (another environment's interpreter) in one process: a new process for each would
    pay its imports (~5 s) again. Each must exit 0."""
    proc = subprocess.run(
        [str(python), "-c", _CALLS, json.dumps(list(commands))],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**(env if env is not None else os.environ), "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for args, result in zip(commands, results, strict=True):
        assert result["code"] == 0, f"sweeper {' '.join(args)} exited {result['code']}\n{result['output']}"
        assert "Traceback" not in result["output"]
    return [r["output"] for r in results]


@pytest.fixture(scope="session", autouse=True)
def _test_plugins_are_forgotten(tmp_path_factory: pytest.TempPathFactory) -> None:
    """An in-process CLI call imports the test plugins (made under pytest's temporary folder) anew."""
    import inprocess

    inprocess.test_folders.append(tmp_path_factory.getbasetemp())


def make_dist(
    site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]], files: dict[str, str]
) -> Path:
    """A real installed distribution in folder ``site`` (put it on sys.path / PYTHONPATH):
    ``NAME-VERSION.dist-info`` with METADATA and entry_points.txt, plus the given source files
    (paths relative to ``site``). importlib.metadata finds it like any pip-installed package."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(groups))
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    return info


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder for made-up distributions, on sys.path here and on PYTHONPATH for the CLI;
    the registry forgets them afterwards."""
    from sweeper.pluginhost import registry

    folder = tmp_path / "site"
    folder.mkdir()
    sys.path.insert(0, str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    yield folder
    sys.path.remove(str(folder))
    for name in [m for m, mod in sys.modules.items() if str(getattr(mod, "__file__", "")).startswith(str(folder))]:
        del sys.modules[name]
    registry.refresh()


def learned(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per-epoch metrics without the timing ones: what must match bitwise between two runs."""
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def config(*overrides: str, seed: int = 1, epochs: int | None = None):
    """A TrialConfig of search_spaces/smoke.yaml with overrides (trial number 0)."""
    from sweeper.spec import load
    from sweeper.trial.build import TrialConfig

    spec = load(SPACES / "smoke.yaml", [*([f"train.epochs={epochs}"] if epochs else []), *overrides])
    return TrialConfig(number=0, seed=seed, params={}, spec=spec)


def children(client, parent_id: str) -> list:
    """The MLflow runs nested under ``parent_id``."""
    exp = client.get_run(parent_id).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


def write_tiny_cifar(root: Path, per_batch: int = 20) -> None:
    """CIFAR-10's on-disk 'python version': pickled dicts of uint8 rows (3072 = 3x32x32) + labels."""
    from sweeper_plugins.cifar import write_random

    write_random(root, per_batch)


def install_test_plugin(site: Path, module: str, entry_points: dict[str, dict[str, str]]) -> None:
    """tests/plugins/<module>.py installed in ``site`` as distribution ``module`` (dashes for
    underscores) with ``entry_points``, and the plugin registry refreshed to see it."""
    source = (Path(__file__).parent / "plugins" / f"{module}.py").read_text()
    make_dist(site, module.replace("_", "-"), "1.0", entry_points, {f"{module}.py": source})
    from sweeper.pluginhost import registry

    registry.refresh()


@pytest.fixture
def gate(site: Path, tmp_path: Path) -> Path:
    """The `gate` schedule plugin (tests/plugins/sweeper_test_gate.py) installed as a distribution;
    returns the folder to pass as its ``folder`` argument."""
    install_test_plugin(site, "sweeper_test_gate", {"sweeper.schedules": {"gate": "sweeper_test_gate:gate"}})
    return tmp_path / "gate"


def kill_at_gate(gate: Path, *args: str, what: str = "") -> None:
    """Run ``sweeper ARGS`` until a trial reaches its gate (the gate plugin writes gate/blocked),
    then SIGKILL it: no chance to clean up, like a crash or an OOM kill."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweeper", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: (gate / "blocked").exists(), proc, what=what or "a trial reaching its gate")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 300, what: str = "") -> None:
    """Poll ``condition`` until it holds. ``timeout`` only bounds a broken run: a test synchronises
    on the event, never on how fast something runs. Fails at once if ``proc`` exits first."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before {what or 'the event'}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what or 'event'} within {timeout:.0f} s")
        time.sleep(0.2)
