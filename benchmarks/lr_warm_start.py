"""Does the LR-finder warm start pay? Digits, a deliberately wide LR range, same trial budget.

    python benchmarks/lr_warm_start.py [--seeds 0 1 2 3 4 5 6 7] [--trials 12] [--targets 0.98 0.99]

For each seed, runs search_spaces/digits.yaml with optimizer.args.lr searched over 1e-5..1,
once without and once with ``search.lr_finder`` (policy both), one process with 2 threads, no
MLflow (its cost is the same either way). Prints per run: best val_acc; the number of trials,
the epochs trained and the seconds until a trial first reached each target (LR finder included:
its steps count as steps / steps-per-epoch epochs); the trials that never got past 0.9 (wasted on
a hopeless LR); then the means and ratios with / without. Epochs are the cost measure that does
not move with machine load; seconds do. A run that never reaches a target counts as the whole
budget plus one trial (and all its epochs and time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from sweeper import spec as spec_mod
from sweeper.search import runner
from sweeper.track.progress import QuietObserver
from sweeper.trial.batching import steps_per_epoch
from sweeper.trial.build import load_data

SPEC = Path(__file__).resolve().parents[1] / "search_spaces" / "digits.yaml"
WIDE = [
    "search.space.optimizer.args.lr={type: float, low: 1.0e-5, high: 1.0, log: true}",
    "search.parallel=1",
    "train.cpu_threads=2",
    "tracking.enabled=false",
    "export.formats=[]",
]
HOPELESS = 0.9  # a trial whose best epoch stays below this val_acc was spent on a useless LR


def sweep(seed: int, trials: int, warm: bool) -> dict:
    spec = spec_mod.load(
        SPEC, [*WIDE, f"seed={seed}", f"search.n_trials={trials}", f"search.lr_finder.enabled={str(warm).lower()}"]
    )
    with tempfile.TemporaryDirectory() as out:
        return runner.run_sweep(spec, Path(out), QuietObserver())


def finder_seconds(summary: dict) -> float:
    return sum(f["seconds"] for f in summary.get("lr_finder", {}).get("findings", []))


def finder_epochs(summary: dict, epoch_steps: int) -> float:
    return sum(f["steps"] for f in summary.get("lr_finder", {}).get("findings", [])) / epoch_steps


def reached(summary: dict, target: float, budget: int, epoch_steps: int) -> tuple[int, float, float]:
    """(trials, epochs, seconds) until the first trial at or above the target, in trial order;
    the budget + 1 trials and all the epochs and time when no trial got there."""
    seconds, epochs = finder_seconds(summary), finder_epochs(summary, epoch_steps)
    for i, t in enumerate(summary["trials"]):
        seconds += t["seconds"] or 0.0
        epochs += t["epochs"]
        if t["value"] is not None and t["value"] >= target:
            return i + 1, epochs, seconds
    return budget + 1, epochs, seconds


def hopeless(summary: dict) -> int:
    return sum(max((h["val_acc"] for h in t["history"]), default=0.0) < HOPELESS for t in summary["trials"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.98, 0.99])
    args = parser.parse_args()
    sweep(99, 1, False)  # warm-up: imports and first-call costs out of the measured runs
    base = spec_mod.load(SPEC, WIDE)
    epoch_steps = steps_per_epoch(load_data(base, torch.device("cpu"))[0], base.train.batch_size)
    targets = "".join(f" {f'trials→{t}':>11} {f'epochs→{t}':>11} {f's→{t}':>8}" for t in args.targets)
    print(
        f"{'seed':>4} {'warm':>5} {'best':>7}{targets} {'hopeless':>8} {'epochs':>6} {'total s':>7} "
        f"{'finder s':>8} suggestion"
    )
    rows: dict[bool, list[dict]] = {False: [], True: []}
    for i, seed in enumerate(args.seeds):
        for warm in (False, True) if i % 2 == 0 else (True, False):  # alternate which runs first
            summary = sweep(seed, args.trials, warm)
            row = {
                "best": summary["best"]["value"] if summary["best"] else 0.0,
                "hopeless": hopeless(summary),
                "total epochs": finder_epochs(summary, epoch_steps) + sum(t["epochs"] for t in summary["trials"]),
                "total s": finder_seconds(summary) + sum(t["seconds"] or 0.0 for t in summary["trials"]),
            }
            cells = ""
            for target in args.targets:
                n, e, s = reached(summary, target, args.trials, epoch_steps)
                row[f"trials→{target}"], row[f"epochs→{target}"], row[f"s→{target}"] = n, e, s
                cells += f" {n if n <= args.trials else '-':>11} {e:11.1f} {s:8.1f}"
            rows[warm].append(row)
            found = [f["suggestion"] for f in summary.get("lr_finder", {}).get("findings", [])]
            print(
                f"{seed:>4} {str(warm):>5} {row['best']:7.4f}{cells} {row['hopeless']:>8} "
                f"{row['total epochs']:6.1f} {row['total s']:7.1f} "
                f"{finder_seconds(summary):8.1f} {', '.join(f'{s:.3g}' for s in found if s)}",
                flush=True,
            )
    print(f"\nmeans over {len(args.seeds)} seeds, {args.trials} trials each (lower is better except best):")
    for key in rows[False][0]:
        without = statistics.mean(r[key] for r in rows[False])
        with_ = statistics.mean(r[key] for r in rows[True])
        ratio = f"{with_ / without:5.2f}" if without else "  n/a"
        print(f"  {key:>14}: without {without:8.3f}   with {with_:8.3f}   with/without {ratio}")


if __name__ == "__main__":
    main()
