"""A sweep's start and end, made cheap without changing what they do: torch's compiler not
imported for an optimizer (trial/lazy_dynamo.py), the command's exit without Python's teardown
(cli/base.py) that still leaves whole sqlite databases, the model registered by a process of its
own (export/registrar.py) and the export's check process started early. What a sweep leaves is
compared with a golden copy in tests/test_startup_outputs.py; the seconds are benchmarks/startup.py's."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import REPO, SPACES

# Trains a small model with each torch optimizer sweeper ships, resumes one from its state
# dict, and prints whether torch._dynamo was imported and a digest of the parameters.
_TRAIN = """
import hashlib, sys, torch
if sys.argv[1] == "defer":
    from sweeper.trial import lazy_dynamo
    lazy_dynamo.defer()
digest = hashlib.sha256()
for make in (lambda p: torch.optim.AdamW(p, lr=0.01), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
             lambda p: torch.optim.Adam(p, lr=0.01)):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = make(model.parameters())
    for step in range(5):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
        if step == 2:
            opt.load_state_dict(opt.state_dict())
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
print("torch._dynamo" in sys.modules, digest.hexdigest())
"""


def _train(mode: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _TRAIN, mode], capture_output=True, text=True, check=True)
    imported, digest = out.stdout.split()
    return imported, digest


def test_optimizers_train_the_same_without_importing_torchs_compiler():
    assert _train("plain") == ("True", _train("plain")[1])  # what torch does: imports it on the first step
    imported, digest = _train("defer")
    assert imported == "False"
    assert digest == _train("plain")[1]  # bitwise the same parameters


def test_once_the_compiler_is_in_torch_s_own_wrappers_take_over():
    code = """
import sys, torch
from sweeper.trial import lazy_dynamo
lazy_dynamo.defer()
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
assert "torch._dynamo" not in sys.modules
compiled = torch.compile(model, backend="eager")  # imports dynamo
opt.zero_grad(); compiled(torch.randn(3, 4)).sum().backward(); opt.step()
cached = getattr(torch.optim.Optimizer.zero_grad.__wrapped__, "__dynamo_disable")
print(type(cached).__name__, cached.__module__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kind, module = out.stdout.split()
    assert module.startswith("torch._dynamo")  # what torch._dynamo.disable made, not the stand-in
    assert kind != "_Lazy"


def test_validate_builds_every_choice_without_torchs_compiler(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sweeper", "validate", str(SPACES / "digits.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# dry build:" in proc.stdout  # the dry build ran: models, optimizers, schedules built and stepped
    assert " torch._dynamo\n" not in proc.stderr and "| torch._dynamo\n" not in proc.stderr


def test_the_command_exits_with_its_status_and_whole_databases(tmp_path: Path):
    """The `sweeper` command leaves without Python's teardown: its exit codes are still what they
    were, and its sqlite databases (study, MLflow) are whole without their -wal files."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}

    def command(*args: str) -> subprocess.CompletedProcess:
        script = Path(sys.executable).with_name("sweeper")  # the console script a user runs
        return subprocess.run([str(script), *args], capture_output=True, text=True, cwd=tmp_path, env=env)

    assert command("validate", str(tmp_path / "missing.yaml")).returncode == 2
    assert command("--help").returncode == 0
    spec = str(SPACES / "smoke.yaml")
    done = command("run", spec, "search.n_trials=2", "export.formats=[torchscript]", "--out", "out", "-q")
    assert done.returncode == 0, done.stderr[-2000:]
    left = sorted(p.name for p in [*tmp_path.iterdir(), *(tmp_path / "out").iterdir()])
    assert not [name for name in left if name.endswith(("-wal", "-shm"))], left
    # each database file alone holds everything (a copy of the file is the database)
    for db, table in ((tmp_path / "mlflow.db", "runs"), (tmp_path / "out" / "optuna.db", "trials")):
        copy = tmp_path / f"copy-{db.name}"
        copy.write_bytes(db.read_bytes())
        with sqlite3.connect(copy) as connection:
            assert connection.execute(f"select count(*) from {table}").fetchone()[0] >= 2, db


def test_a_model_the_registrar_cannot_take_is_registered_by_the_sweeps_process(workdir: Path, mlflow_uri: str):
    """A model that does not pickle (a lambda in it) is registered where it was trained; one the
    registrar takes is registered by the registrar; after the registrar was killed, a new one."""
    import torch
    from mlflow.tracking import MlflowClient

    from sweeper.export import publish, registrar
    from sweeper.spec import load
    from sweeper_plugins.datasets import digits

    spec = load(SPACES / "smoke.yaml", ["name=registrar-test", "tracking.experiment=registrar-test"])
    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("registrar-test")).info.run_id
    data = digits(val_fraction=0.2)

    def registered(model: torch.nn.Module, value: float) -> dict:
        made = publish.registration(model, data, spec, mlflow_uri, run, {"val_acc": value}, 10)
        assert isinstance(made, publish.Registration)
        return registrar.register(made)

    plain = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    first = registered(plain, 0.5)
    pid = registrar.process().proc.pid  # the one that took it
    assert first["version"] == 1 and first["champion"]
    odd = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    odd.scale = lambda x: x  # type: ignore[assignment]  # not picklable
    second = registered(odd, 0.7)
    assert second["version"] == 2 and second["champion"]
    os.kill(pid, signal.SIGKILL)
    registrar.process().proc.wait()
    third = registered(plain, 0.6)
    assert third["version"] == 3 and not third["champion"]
    assert registrar.process().proc.pid != pid
    versions = client.search_model_versions("name='registrar-test'")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3]
    assert json.loads(client.get_model_version("registrar-test", "3").tags["sweeper.objective_values"]) == {
        "val_acc": 0.6
    }


def test_the_export_check_process_is_started_with_what_it_will_load():
    from sweeper.export import verify

    verify.consumer().close()  # this test process's, which an earlier test may have started
    verify.prestart(["onnx", "torchscript"])
    consumer = verify.consumer()
    assert consumer.proc.poll() is None
    assert consumer.proc.args[-2:] == ["torch", "onnxruntime"]  # imported while the sweep trains


def test_one_complete_trial_ranks_the_parameters_as_optunas_evaluator_does():
    """Optuna ranks every parameter equal with one complete trial: the plots take the parameters'
    order without asking its evaluator (which imports scikit-learn: 1.5 s of a one-trial sweep;
    its order of equals is no order: it varies from run to run)."""
    import optuna

    from sweeper.review import plots

    study = optuna.create_study()
    study.optimize(lambda t: t.suggest_float("b", 0, 1) + t.suggest_int("a", 0, 3) + t.suggest_float("c", 0, 1), 1)
    ranked = optuna.importance.get_param_importances(study)
    assert len(set(ranked.values())) == 1  # all equal: its order says nothing (it varies between runs)
    assert plots.top_params(study) == ["b", "a", "c"]  # the order the trial names them in


def _startup_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("startup_benchmark", REPO / "benchmarks" / "startup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_startup_gate_fails_where_a_phase_grew_by_half_and_not_on_noise():
    bench = _startup_benchmark()
    recorded = {"sweep": {"tracker": 0.8, "export": 0.3, "total": 5.0, "trial seconds": 1.0, "[plots]": 0.8}}
    assert bench.gate({"sweep": dict(recorded["sweep"])}, recorded) == []
    grown = {"sweep": {**recorded["sweep"], "tracker": 1.3}}  # 0.8 -> 1.3: more than 1.5x
    assert [g.split(":")[1].split()[0] for g in bench.gate(grown, recorded)] == ["tracker"]
    # a small phase's noise (0.1 -> 0.2: under the 0.25 floor), training and overlapped work are not gated
    noisy = {"sweep": {**recorded["sweep"], "export": 0.2, "trial seconds": 3.0, "[plots]": 2.0}}
    assert bench.gate(noisy, {"sweep": {**recorded["sweep"], "export": 0.1}}) == []
    assert bench.gate({"sweep": {**recorded["sweep"], "export": 0.5}}, recorded)  # 0.3 -> 0.5: grown


def test_the_phases_of_a_command_are_its_own_seconds():
    """A phase inside another is taken out of it; imports run from the launch to the first phase;
    other threads' and processes' phases stand apart, in brackets."""
    bench = _startup_benchmark()
    lines = [
        {"phase": "resolve", "start": 1.0, "end": 3.0, "thread": "MainThread", "pid": 7},
        {"phase": "dry build", "start": 1.5, "end": 2.5, "thread": "MainThread", "pid": 7},
        {"phase": "export", "start": 4.0, "end": 5.0, "thread": "MainThread", "pid": 7},
        {"phase": "registry", "start": 3.5, "end": 6.0, "thread": "sweeper-registry", "pid": 7},
        {"phase": "registrar job", "start": 4.0, "end": 5.5, "thread": "MainThread", "pid": 8},
    ]
    got = bench.phases_of(lines, 7, launched=0.0, ended=6.5)
    assert got == {
        "resolve": 1.0,
        "dry build": 1.0,
        "export": 1.0,
        "[registry]": 2.5,
        "[registrar job]": 1.5,
        "imports": 1.0,
        "exit": 1.5,
        "other": 1.0,  # 6.5 s in all, 5.5 s accounted for
    }
