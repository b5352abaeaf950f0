"""Trials larger than one device (issue #32): `train.devices: N` runs each trial as N processes
under DistributedDataParallel, gloo on the CPU here (trial/launch.py, trial/rank.py,
trial/ddp.py). Real processes, a real process group, a rank killed with a real SIGKILL; the test
synchronises on the gate plugin's files, never on how fast a rank trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import config, learned, sweeper, wait_for, write_spec

from sweeper.errors import TrialPreempted
from sweeper.search import faults
from sweeper.states import FailureKind, TrialState
from sweeper.trial import checkpoint
from sweeper.trial.execute import execute

# A 2-rank trial and a 1-device trial of the same global batch differ by float rounding only:
# DDP averages the ranks' gradients (a sum in another order), the epoch's loss is summed per rank
# first. Relative, per epoch metric; the timings are not compared.
TOLERANCE = 1e-4
NEVER = lambda number, epoch, metrics: False  # noqa: E731 (a pruner that never prunes)


def close(a: list[dict[str, float]], b: list[dict[str, float]]) -> None:
    assert len(a) == len(b)
    for epoch, (x, y) in enumerate(zip(learned(a), learned(b), strict=True), 1):
        assert x.keys() == y.keys()
        for name in x:
            assert y[name] == pytest.approx(x[name], rel=TOLERANCE, abs=1e-6), (epoch, name, x[name], y[name])


def test_two_ranks_train_as_one_device_and_their_checkpoint_resumes_on_one(tmp_path: Path):
    cpu = ("train.device=cpu", "train.cpu_threads=2")
    (one,) = execute([config(*cpu, epochs=3)], NEVER)
    assert one.state == TrialState.COMPLETE

    def preempted_after_2(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        if epoch == 2:
            raise TrialPreempted("preempted after epoch 2 for a test")
        return False

    two = replace(config(*cpu, "train.devices=2", epochs=3), checkpoint=str(tmp_path / "two.pt"), checkpoint_every=1)
    (first,) = execute([two], preempted_after_2)  # every rank stops after epoch 2; rank 0 saved the state
    assert first.state == TrialState.INTERRUPTED and first.failure == FailureKind.PREEMPTED, first.reason
    assert first.info["ranks"] == 2 and first.info["device"] == "cpu"
    close(one.history[:2], first.history)
    # the same trial again: the same numbers, bitwise (the sharding is the trial seed's)
    (again,) = execute([replace(two, checkpoint=str(tmp_path / "again.pt"))], NEVER)
    assert again.state == TrialState.COMPLETE, again.reason
    assert learned(again.history[:2]) == learned(first.history)
    close(one.history, again.history)

    # the pruner's answer reaches every rank: they all stop after the epoch it was given for
    (pruned,) = execute([replace(two, checkpoint=None)], lambda number, epoch, metrics: epoch == 1)
    assert pruned.state == TrialState.PRUNED and len(pruned.history) == 1

    # the checkpoint holds the plain module's state (no DDP "module." prefix) and resumes on one device
    state = checkpoint.load(tmp_path / "two.pt")
    assert state["epoch"] == 2 and not any(k.startswith("module.") for k in state["model"])
    (third,) = execute([replace(config(*cpu, epochs=3), resume=str(tmp_path / "two.pt"))], NEVER)
    assert third.state == TrialState.COMPLETE, third.reason
    close(one.history, third.history)


def test_a_rank_killed_mid_epoch_fails_its_trial_and_the_sweep_goes_on(workdir: Path, gate: Path):
    spec = write_spec(
        workdir / "ranks.yaml",
        name="ranks",
        tracking={"enabled": False},
        train={"epochs": 2, "batch_size": 32, "device": "cpu", "devices": 2, "cpu_threads": 2},
        # the first rank to build its schedule stops at the first step of epoch 2 (epoch 1 reported)
        schedule={"plugin": "gate", "args": {"folder": str(gate), "epoch": 2}},
        search={
            "sampler": "random",
            "pruner": {"type": "none"},
            "n_trials": 2,
            "batch_size": 2,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        },
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweeper", "run", str(spec), "--out", str(workdir / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for(lambda: (gate / "blocked").exists() and (gate / "blocked").read_text(), proc, what="a rank at its gate")
    rank = int((gate / "blocked").read_text())
    assert rank != proc.pid
    os.kill(rank, signal.SIGKILL)
    (gate / "release").touch()  # the gate opens for nobody else: the retry goes through
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    states = [t["state"] for t in summary["trials"]]
    assert states.count("complete") == 2, summary["trials"]
    # the attempt whose rank died is said, and was retried with the same params
    lost = [t for t in summary["trials"] if "died" in (t.get("reason") or "")]
    assert lost and "killed by SIGKILL" in lost[0]["reason"], summary["trials"]
    with pytest.raises(ProcessLookupError):  # every rank of the lost attempt was reaped
        os.kill(rank, 0)

    # the same table from a clean run with 2 workers (each training 2-rank trials), tracked in
    # MLflow: the retried trial trained from scratch as it would have, bitwise
    clean_run = ("search.parallel=2", "tracking.enabled=true", "--out", str(workdir / "clean"))
    sweeper("run", str(spec), *clean_run, check=True)
    clean = json.loads((workdir / "clean" / "summary.json").read_text())
    assert "error" not in clean["export"]["formats"][0]  # exported from rank 0's checkpoint

    def table(trials: list[dict]) -> dict[str, list[dict]]:  # by params (a retry has a number of its own)
        return {json.dumps(t["params"]): learned(t["history"]) for t in trials if t["state"] == "complete"}

    assert table(clean["trials"]) == table(summary["trials"])
    # and a trial replays: its 2 ranks trained again, every epoch equal
    replay = sweeper("replay", clean["trials"][0]["mlflow_run_id"])
    assert replay.returncode == 0 and "bitwise" in replay.stdout, replay.stdout + replay.stderr


def test_a_rank_that_raises_fails_its_trial_with_its_reason(gate: Path):
    # the first rank to build its schedule raises at the first step of epoch 2; its peer, blocked
    # in the step's all-reduce, is killed by the launcher
    gated = config("train.devices=2", "schedule.plugin=gate", f"schedule.args={{folder: {gate}, epoch: 2, fail: true}}")
    (out,) = execute([replace(gated, spec=gated.spec.with_values({"train.epochs": 3}))], NEVER)
    assert out.state == TrialState.FAILED and out.failure is None, out.reason  # its own fault: not retried
    assert "the gate fails here on purpose" in out.reason and len(out.history) == 1
    # rank 0's own failure as it is; another rank's named
    assert out.reason.startswith(("RuntimeError", "rank 1: RuntimeError")), out.reason


def test_a_hung_rank_is_stopped_by_the_trial_time_limit(gate: Path):
    # the first rank to build its schedule waits at its gate for a release that never comes (its
    # peer waits for it in the step's all-reduce): train.max_trial_seconds stops the trial
    # (the limit: well past epoch 1 of two gloo ranks on a loaded 2-core machine, so the trial is
    # stopped at the gate, which is asserted, not before it)
    hung = config("train.devices=2", "schedule.plugin=gate", f"schedule.args={{folder: {gate}, epoch: 2}}", epochs=3)
    (out,) = execute([replace(hung, spec=hung.spec.with_values({"train.max_trial_seconds": 15}))], NEVER)
    assert out.state == TrialState.FAILED and out.failure == FailureKind.TIMED_OUT, out.reason
    assert "ran past train.max_trial_seconds=15" in out.reason
    assert (gate / "blocked").exists() and len(out.history) == 1, "stopped before the rank hung at its gate"


def test_rank_settings_are_checked_before_any_compute(workdir: Path):
    base = {"tracking": {"enabled": False}}
    cases = {
        "train.batch_size=30 train.devices=4": "must divide evenly among them",
        "train.devices=2 train.sync_batchnorm=true": "SyncBatchNorm does not run on the CPU",
        "train.devices=2 search.fuse=2": "set search.fuse: off",
    }
    for overrides, said in cases.items():
        spec = write_spec(workdir / "bad.yaml", name="bad", **base)
        out = sweeper("validate", str(spec), *overrides.split())
        assert out.returncode == 2 and said in out.stderr, (overrides, out.stderr)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_cuda_ranks_train_with_nccl():
    (out,) = execute([config("train.device=cuda", "train.devices=2", epochs=2)], NEVER)
    assert out.state == TrialState.COMPLETE, out.reason
    assert out.failure is not FailureKind.LOST_WORKER and out.info["ranks"] == 2


def test_an_out_of_memory_retry_doubles_accumulate_within_each_ranks_share():
    spec = config("train.devices=2", "train.batch_size=32", "train.accumulate=8").spec
    assert faults.oom_retry(spec, 1) == 16
    assert faults.oom_retry(spec.with_values({"train.accumulate": 16}), 1) is None  # 16 samples per rank
