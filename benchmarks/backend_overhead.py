"""Per-trial orchestration overhead: the same small sweep through the Optuna and the Ray backend.

    python benchmarks/backend_overhead.py [--trials 12] [--epochs 2]

Both runs: search_spaces/smoke.yaml (synthetic data, tiny MLP), TPE, no pruning, one trial at a
time (Optuna: parallel 1; Ray: max_concurrent_trials 1 on a local Ray with 1 CPU, reused
actors), MLflow on sqlite, each in a fresh process and folder. Per-trial overhead is the
search's wall time minus the trials' own time (build + train + checkpoint, measured inside the
worker), divided by the number of trials. Ray's one-off start (ray.init of a local instance) is
reported apart: it is paid once per sweep.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "smoke.yaml"


def run(backend: str, trials: int, epochs: int) -> dict:
    common = [
        f"search.n_trials={trials}",
        f"train.epochs={epochs}",
        "search.pruner.type=none",
        "search.sampler=tpe",
        "export.formats=[]",
    ]
    extra = (
        ["search.backend=ray", "search.ray.max_concurrent_trials=1", "search.ray.num_cpus=1", "search.resources.cpu=1"]
        if backend == "ray"
        else ["search.parallel=1", "train.cpu_threads=1"]
    )
    with tempfile.TemporaryDirectory() as folder:
        env_uri = f"sqlite:///{folder}/mlflow.db"
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "sweeper", "run", str(SPEC), *common, *extra, "--out", "out", "-q"],
            cwd=folder,
            check=True,
            capture_output=True,
            env={**__import__("os").environ, "MLFLOW_TRACKING_URI": env_uri},
        )
        wall = time.perf_counter() - started
        summary = json.loads((Path(folder) / "out" / "summary.json").read_text())
    seconds = [t["seconds"] for t in summary["trials"]]
    search = summary["search_seconds"]
    return {
        "backend": backend,
        "trials": len(seconds),
        "process_s": wall,
        "search_s": search,
        "trial_s": sum(seconds),
        "overhead_per_trial_ms": 1000 * (search - sum(seconds)) / len(seconds),
    }


def ray_start_seconds() -> float:
    """What starting and stopping a local Ray costs, alone (paid once per sweep)."""
    code = (
        "import time, ray; t = time.perf_counter(); ray.init(address='local', num_cpus=1, "
        "include_dashboard=False, object_store_memory=256 * 2**20, logging_level='ERROR'); "
        "ray.shutdown(); print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    rows = [run("optuna", args.trials, args.epochs), run("ray", args.trials, args.epochs)]
    start = ray_start_seconds()
    print(f"{'backend':8} {'trials':>6} {'search s':>9} {'in trials s':>11} {'overhead/trial':>15}")
    for r in rows:
        print(
            f"{r['backend']:8} {r['trials']:>6} {r['search_s']:>9.2f} {r['trial_s']:>11.2f} "
            f"{r['overhead_per_trial_ms']:>12.0f} ms"
        )
    ray = rows[1]
    per_trial = 1000 * (ray["search_s"] - ray["trial_s"] - start) / ray["trials"]
    print(f"ray: local Ray start+stop alone {start:.1f} s; per trial without it: {per_trial:.0f} ms")


if __name__ == "__main__":
    main()
