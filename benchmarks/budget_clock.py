"""search.budget true to the clock on a busy machine: when `sweeper run` ends, against the clock
its budget buys, with 0, 2 and 4 loops spinning on the cores beside it.

    python benchmarks/budget_clock.py                  # 40 device-s, loops 0 2 4
    python benchmarks/budget_clock.py --seconds 60 --loops 0 8

The sweep is tests/test_budgets.py's (the smoke task, one worker of one torch thread, random
sampling until the clock runs out). Each row: the wall seconds from launch to the process's end
and their ratio to the clock (the goal is at most 1.1), when the trials phase ended
($SWEEPER_PHASES) and the finish after it (summary, test score, export, report).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SMOKE = Path(__file__).resolve().parent.parent / "search_spaces" / "smoke.yaml"


def spin() -> None:
    """One busy loop: a process that wants a core all the time."""
    while True:
        pass


def sweep_spec(folder: Path, seconds: float) -> Path:
    spec = yaml.safe_load(SMOKE.read_text())
    spec["train"] = {"epochs": 3, "batch_size": 32, "device": "cpu", "cpu_threads": 1}
    spec["search"] = {
        "sampler": "random",
        "n_trials": 100_000,  # never the limit
        "budget": {"device_hours": seconds / 3600},
        "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_once(folder: Path, seconds: float, loops: int) -> dict[str, float]:
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(loops)]
    for spinner in spinners:
        spinner.start()
    phases = folder / f"phases-{loops}.jsonl"
    try:
        command = [sys.executable, "-m", "sweeper", "run", str(sweep_spec(folder, seconds))]
        started = time.time()
        subprocess.run(
            [*command, "--out", str(folder / f"out-{loops}")],
            capture_output=True, check=True, env={**os.environ, "SWEEPER_PHASES": str(phases)},
        )  # fmt: skip
        ended = time.time()
    finally:
        for spinner in spinners:
            spinner.terminate()
    trials_end = max(row["end"] for row in map(json.loads, phases.read_text().splitlines()) if row["phase"] == "trials")
    return {"took_s": ended - started, "trials_end_s": trials_end - started, "finish_s": ended - trials_end}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="the budget in device-seconds (1 device)")
    parser.add_argument("--loops", type=int, nargs="+", default=[0, 2, 4], help="busy loops beside the sweep")
    args = parser.parse_args()
    print(f"search.budget of {args.seconds:g} device-s on 1 device, {os.cpu_count()} cores")
    print(f"{'busy loops':>10} {'took s':>7} {'/ clock':>8} {'trials end s':>13} {'finish s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for loops in args.loops:
            row = run_once(Path(tmp), args.seconds, loops)
            print(
                f"{loops:>10} {row['took_s']:>7.1f} {row['took_s'] / args.seconds:>8.2f} "
                f"{row['trials_end_s']:>13.1f} {row['finish_s']:>9.1f}"
            )


if __name__ == "__main__":
    main()
