"""What a sweep does when its trials fail: the circuit breaker (the first trials all fail alike:
stop, spend nothing more), out of memory (retried with smaller micro-batches), a worker killed
for memory (says so). Real sweeps through the CLI, with test plugins that fail on purpose
(tests/plugins/sweeper_test_faults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import SPACES, make_dist, sweeper, write_spec

from sweeper.search import faults
from sweeper.search.pool import death
from sweeper.spec import load
from sweeper.states import FailureKind, TrialState
from sweeper.track.records import TrialRecord


@pytest.fixture
def faulty(site: Path) -> None:
    source = (Path(__file__).parent / "plugins" / "sweeper_test_faults.py").read_text()
    make_dist(
        site,
        "sweeper-test-faults",
        "1.0",
        {
            "sweeper.models": {
                "greedy": "sweeper_test_faults:greedy",
                "broken": "sweeper_test_faults:broken",
                "faulting": "sweeper_test_faults:faulting",
            }
        },
        {"sweeper_test_faults.py": source},
    )
    from sweeper.pluginhost import registry

    registry.refresh()


def _trials(out: Path, name: str = "smoke") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'optuna.db'}").get_trials()


def test_the_first_trials_failing_alike_stop_the_sweep_and_a_fixed_rerun_resumes(
    workdir: Path, site: Path, faulty: None
):
    spec = write_spec(
        workdir / "spec.yaml",
        model={"plugin": "broken", "args": {}},
        search={
            **yaml.safe_load((SPACES / "smoke.yaml").read_text())["search"],
            "n_trials": 12,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        },
    )
    stopped = sweeper("run", str(spec), "--out", "out", "-q")
    assert stopped.returncode == 1, stopped.stderr
    message = " ".join(stopped.stderr.split())
    assert "the fused kernel failed on a batch of 32 samples" in message
    assert "first 3 trials (0, 1, 2) all failed with the same error" in message
    assert "search.max_failures_in_a_row" in message and "The traceback: error.txt in MLflow run " in message
    trials = _trials(workdir / "out")
    # one batch of 4 was proposed; its fourth trial never started, the other 8 slots were never claimed
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "FAIL", "WAITING"]

    # the user fixes the plugin's bug and runs the same command: the sweep resumes where it stopped
    plugin = site / "sweeper_test_faults.py"
    plugin.write_text(plugin.read_text().replace("if self.training and len(x) > self.limit:", "if False:"))
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert [t["state"] for t in summary["trials"][:3]] == ["failed"] * 3 and len(summary["trials"]) == 12
    assert summary["counts"]["failed"] == 3 and summary["best"] is not None


def test_a_trial_out_of_memory_is_retried_with_smaller_micro_batches(workdir: Path, faulty: None):
    spec = write_spec(
        workdir / "spec.yaml",
        model={"plugin": "greedy", "args": {"fits": 8}},
        search={
            "sampler": "nsga2",
            "population": 2,
            "n_trials": 1,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True}},
        },
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    attempts = summary["trials"]
    # batch 32: micro-batches of 32 and 16 do not fit, 8 do (accumulate 1 -> 2 -> 4)
    assert [t["state"] for t in attempts] == ["failed", "failed", "complete"]
    assert attempts[0]["reason"].startswith("oom: OutOfMemoryError: CUDA out of memory")
    assert attempts[0]["reason"].endswith("retried with train.accumulate=2")
    assert attempts[1]["reason"].endswith("retried with train.accumulate=4")
    assert len({t["seed"] for t in attempts}) == 1 and summary["counts"] == {"failed": 2, "complete": 1}
    study = _trials(workdir / "out")
    assert [t.user_attrs.get("sweeper_accumulate") for t in study] == [None, 2, 4]
    assert [t.user_attrs.get("sweeper_retry_of") for t in study] == [None, 0, 1]
    # a retry stands in for its attempt in the sampler's books too (NSGA-II's generation)
    assert [t.system_attrs.get("NSGAIISampler:generation") for t in study] == [0, 0, 0]
    # the budget is one trial: the retries are attempts at its slot, not new trials
    assert {t.user_attrs["sweeper_slot"] for t in study} == {0}


def test_out_of_memory_is_not_retried_past_the_limit(workdir: Path, faulty: None):
    spec = write_spec(
        workdir / "spec.yaml",
        model={"plugin": "greedy", "args": {"fits": 4}},
        search={"sampler": "random", "n_trials": 1, "max_retries": 1, "max_failures_in_a_row": 0, "space": {}},
    )
    run = sweeper("run", str(spec), "--out", "out", "-q")
    assert run.returncode == 1  # no trial completed
    reasons = [t.user_attrs["sweeper"]["reason"] for t in _trials(workdir / "out")]
    assert len(reasons) == 2 and reasons[1].endswith(
        "not retried (search.max_retries, or train.accumulate is train.batch_size already)"
    )


def _record(number: int, state: str, reason: str | None = None) -> TrialRecord:
    return TrialRecord(number=number, state=state, params={}, reason=reason)


def test_the_breaker_trips_only_on_the_same_error_before_any_trial_trained():
    spec = load(SPACES / "smoke.yaml")
    same = [_record(i, "failed", f"RuntimeError: size mismatch {i} vs {i + 1}") for i in range(3)]
    assert faults.breaker_trips(spec, same) == "RuntimeError: size mismatch 0 vs 1"  # numbers aside, alike
    assert faults.breaker_trips(spec, same[:2]) is None
    assert faults.breaker_trips(spec, [*same[:2], _record(2, "failed", "ValueError: nan")]) is None
    assert faults.breaker_trips(spec, [_record(9, "pruned"), *same]) is None  # a trial trained: no pattern
    lost = [_record(3, "failed", "oom: OutOfMemoryError"), _record(4, "failed", "interrupted: its worker died")]
    assert faults.breaker_trips(spec, [*same[:2], *lost]) is None  # the machine's failures do not count
    leased = TrialRecord(number=5, state=TrialState.FAILED, params={}, failure=FailureKind.LOST_LEASE, reason="x")
    assert faults.breaker_trips(spec, [*same[:2], leased]) is None  # its failure says so, not its reason
    off = load(SPACES / "smoke.yaml", ["search.max_failures_in_a_row=0"])
    assert faults.breaker_trips(off, same) is None


def test_trial_records_of_older_summaries_read_the_same():
    """summary.json's trials (and Optuna's stored trials) before ``failure`` existed said a
    resource failure in the reason's prefix; they read with its FailureKind, and every record
    round-trips through summary.json's strings."""
    old = [
        {"number": 0, "state": "complete", "params": {"a": 1}, "value": 0.5, "epochs": 2},
        {"number": 1, "state": "failed", "params": {}, "reason": "oom: OutOfMemoryError: CUDA out of memory"},
        {"number": 2, "state": "failed", "params": {}, "reason": "interrupted: its worker died; retried"},
        {"number": 3, "state": "failed", "params": {}, "reason": "ValueError: bad"},
        {"number": 4, "state": "pruned", "params": {}, "reason": "oom: not a failure"},
    ]
    records = [TrialRecord.model_validate(t) for t in old]
    assert [r.state for r in records] == [TrialState.COMPLETE, *[TrialState.FAILED] * 3, TrialState.PRUNED]
    assert [r.failure for r in records] == [None, FailureKind.OUT_OF_MEMORY, FailureKind.LOST_WORKER, None, None]
    for r in records:
        dumped = json.loads(json.dumps(r.model_dump(mode="json")))
        assert dumped["state"] == r.state.value and TrialRecord.model_validate(dumped) == r
    assert TrialRecord.model_validate({"number": 5, "state": "interrupted", "params": {}}).state.finished


def test_a_dead_worker_says_why():
    assert death(1, None) == "its worker process died (exit code 1)"
    assert death(-15, None) == "its worker process was killed by SIGTERM"
    assert "out-of-memory killer" in death(-9, None)


def test_the_breaker_stops_a_ray_sweep_too(workdir: Path, faulty: None, mlflow_uri: str):
    spec = write_spec(
        workdir / "spec.yaml",
        name="ray-breaker",
        model={"plugin": "broken", "args": {}},
        train={"epochs": 2, "batch_size": 32},
        search={
            "backend": "ray",
            "sampler": "random",
            "n_trials": 8,
            "resources": {"cpu": 1},
            "ray": {"num_cpus": 1, "max_concurrent_trials": 1},
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1}},
        },
    )
    stopped = sweeper("run", str(spec), "--out", "out", "-q", process=True)
    assert stopped.returncode == 1, stopped.stderr
    message = " ".join(stopped.stderr.split())
    assert "all failed with the same error" in message and "the fused kernel failed on a batch of 32" in message
    # Tune started no trial after the third failure (one at a time): 5 of the 8 never ran
    assert "the other 5 trial(s) of the budget were not started" in message
    # Tune never reuses the actor of a trial that raised (reuse_actors is on): each failed trial
    # ran in a process of its own, so one that broke its CUDA context took no later trial with it
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("ray-breaker").experiment_id
    pids = [
        r.data.tags["sweeper.pid"] for r in client.search_runs([experiment]) if "sweeper.ray_trial_id" in r.data.tags
    ]
    assert len(pids) == 3 and len(set(pids)) == 3, pids


def test_a_lost_cuda_context_replaces_the_worker_and_stops_an_inline_sweep(workdir: Path, faulty: None):
    from conftest import config

    from sweeper.search.pool import ProcessPool

    faulting = config("model={plugin: faulting, args: {}}", "search.space={}", epochs=1)
    pool = ProcessPool(1, lambda *a: False, lambda *a: None)
    try:
        first = pool.procs[0].pid
        pool.submit([faulting])
        (lost,) = list(pool.results(timeout_s=300))
        assert lost.state == "failed" and lost.context_lost and "illegal memory access" in lost.reason
        assert pool.procs[0].pid != first and pool.procs[0].is_alive()  # a new worker took its place
        pool.submit([config("search.space={}", epochs=1)])
        (fine,) = list(pool.results(timeout_s=300))
        assert fine.state == "complete"
    finally:
        pool.close()

    spec = write_spec(
        workdir / "spec.yaml",
        model={"plugin": "faulting", "args": {}},
        search={"sampler": "random", "n_trials": 4, "space": {}},
    )
    stopped = sweeper("run", str(spec), "--out", "out", "-q")
    assert stopped.returncode == 1
    assert "trial 0 broke this process's CUDA context" in " ".join(stopped.stderr.split())
    assert [t.state.name for t in _trials(workdir / "out")][:1] == ["FAIL"]
