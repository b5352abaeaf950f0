"""Orchestration per trial, timed directly on the coordinator's thread (no subtraction of noisy
wall times: overhead.py's per-trial figure is the difference of two ~20 s runs).

    python benchmarks/orchestration.py [--trials 40] [--epochs 2]

Runs search_spaces/smoke.yaml (synthetic data, tiny MLP: training is ~10 ms a trial) in this
process, sequential (parallel 1, 1 thread), median pruning, MLflow and Optuna on sqlite in a
fresh folder, with timers around the coordinator's steps: reading the ledger, looking for lost
trials, proposing and claiming a batch, each trial's config and MLflow run, each epoch's pruning
decision and record, its end. Prints
each step's milliseconds a trial, their sum (the issue's goal: <= 20 ms), and the MLflow calls
the sender thread made a trial and their time (off the coordinator's thread, but on the CPU).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (module, class, method) timed: what the coordinator's loop (search/optuna/coordinator.py) calls
TIMED = [
    ("coordinator", "Coordinator", "_read"),
    ("recovery", "Recovery", "recover"),
    ("proposer", "Proposer", "next"),
    ("live", "LiveTrials", "start"),
    ("live", "LiveTrials", "decide"),
    ("live", "LiveTrials", "record"),
    ("live", "LiveTrials", "finish"),
]
STEPS = [f"{cls}.{method}" for _, cls, method in TIMED]


def timed(stats: dict, key: str, method):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            stats[key][0] += 1
            stats[key][1] += time.perf_counter() - started

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    import importlib

    from sweeper.cli import app
    from sweeper.track.outbox import Outbox

    stats: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for module, name, method in TIMED:
        cls = getattr(importlib.import_module(f"sweeper.search.optuna.{module}"), name)
        setattr(cls, method, timed(stats, f"{name}.{method}", getattr(cls, method)))
    write = Outbox.write
    Outbox.write = lambda self, entry, *a, **k: timed(stats, "mlflow " + entry["op"], write)(self, entry, *a, **k)
    folder = tempfile.mkdtemp(prefix="sweeper-orchestration-")
    os.chdir(folder)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder}/mlflow.db"
    sys.argv = [
        "sweeper",
        "run",
        str(REPO / "search_spaces" / "smoke.yaml"),
        f"search.n_trials={args.trials}",
        f"train.epochs={args.epochs}",
        "search.parallel=1",
        "train.cpu_threads=1",
        "export.formats=[]",
        "--out",
        "out",
        "-q",
    ]
    try:
        app()
    except SystemExit as stop:
        if stop.code:
            raise
    n = args.trials
    print(f"\n{n} trials x up to {args.epochs} epochs, in {folder}")
    print(f"{'coordinator step':24s} {'calls':>5s} {'ms a trial':>10s}")
    for step in STEPS:
        calls, seconds = stats[step]
        print(f"{step:24s} {calls:5d} {seconds / n * 1000:10.1f}")
    total = sum(stats[s][1] for s in STEPS) / n * 1000
    print(f"{'sum':24s} {'':5s} {total:10.1f}   (goal <= 20 ms a trial)")
    for key in sorted(k for k in stats if k.startswith("mlflow ")):
        calls, seconds = stats[key]
        print(f"{key:24s} {calls / n:5.2f} {seconds / n * 1000:10.1f}   (calls a trial, on the sender thread)")


if __name__ == "__main__":
    main()
