"""The in-process CLI of the tests (tests/inprocess.py) answers as `python -m sweeper` does, and
a command leaves nothing of its run behind in the test process."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from conftest import SPACES, sweeper


def test_in_process_answers_as_a_new_process_does(workdir: Path):
    for args in (["schema"], ["validate", str(workdir / "nowhere.yaml")], ["plugins", "schedules"]):
        here, there = sweeper(*args), sweeper(*args, process=True)
        assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr), args


def test_a_run_in_process_leaves_the_test_process_as_it_was(workdir: Path):
    from mlflow.tracking._tracking_service import utils as mlflow_tracking

    tracking_uri = mlflow_tracking._tracking_uri  # a sweep registering its model sets it for log_model
    threads, deterministic, environ = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        dict(os.environ),
    )
    state = torch.get_rng_state()
    sweeper(
        "run",
        str(SPACES / "smoke.yaml"),
        "search.n_trials=1",
        "train.epochs=1",
        "train.cpu_threads=1",
        f"train.deterministic={str(not deterministic).lower()}",
        "--out",
        "out",
        "-q",
        check=True,
    )
    assert (workdir / "out" / "summary.json").is_file()
    assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == deterministic
    assert dict(os.environ) == environ and torch.equal(torch.get_rng_state(), state)
    assert mlflow_tracking._tracking_uri == tracking_uri  # MLflow's process-wide URI as it was
