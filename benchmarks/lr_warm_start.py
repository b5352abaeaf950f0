"""Does the LR-finder warm start pay? Digits, a deliberately wide LR range, same trial budget.

    python benchmarks/lr_warm_start.py [--seeds 0 1 2] [--trials 12] [--target 0.98]

For each seed, runs search_spaces/digits.yaml with optimizer.args.lr searched over 1e-5..1,
once without and once with ``search.lr_finder`` (policy both), one process with 2 threads, no
MLflow (its cost is the same either way). Prints per run: best val_acc, the number of trials
and the time (LR finder included) until a trial first reached the target, and the ratios
with / without.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from sweeper import runner
from sweeper import spec as spec_mod
from sweeper.progress import QuietObserver

SPEC = Path(__file__).resolve().parents[1] / "search_spaces" / "digits.yaml"
WIDE = ["search.space.optimizer.args.lr={type: float, low: 1.0e-5, high: 1.0, log: true}",
        "search.parallel=1", "train.cpu_threads=2", "tracking.enabled=false", "export.formats=[]"]


def sweep(seed: int, trials: int, warm: bool) -> dict:
    spec = spec_mod.load(SPEC, [*WIDE, f"seed={seed}", f"search.n_trials={trials}",
                                f"search.lr_finder.enabled={str(warm).lower()}"])
    with tempfile.TemporaryDirectory() as out:
        return runner.run_sweep(spec, Path(out), QuietObserver())


def reached(summary: dict, target: float) -> tuple[int | None, float | None]:
    """(trials, seconds) until the first trial at or above the target, in trial order."""
    seconds = sum(f["seconds"] for f in summary.get("lr_finder", {}).get("findings", []))
    for i, t in enumerate(summary["trials"]):
        seconds += t["seconds"] or 0.0
        if t["value"] is not None and t["value"] >= target:
            return i + 1, seconds
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--target", type=float, default=0.98)
    args = parser.parse_args()
    sweep(99, 1, False)  # warm-up: imports and first-call costs out of the measured runs
    print(f"{'seed':>4} {'warm':>5} {'best':>7} {'trials→target':>13} {'s→target':>9} {'finder s':>8}")
    rows = {False: [], True: []}
    for i, seed in enumerate(args.seeds):
        for warm in ((False, True) if i % 2 == 0 else (True, False)):  # alternate which runs first
            summary = sweep(seed, args.trials, warm)
            n, s = reached(summary, args.target)
            finder = sum(f["seconds"] for f in summary.get("lr_finder", {}).get("findings", []))
            best = summary["best"]["value"] if summary["best"] else 0.0
            rows[warm].append((best, n, s))
            print(f"{seed:>4} {str(warm):>5} {best:7.4f} {n if n else '-':>13} "
                  f"{f'{s:.1f}' if s else '-':>9} {finder:8.1f}")
    for label, i in (("best val_acc", 0), ("trials to target", 1), ("seconds to target", 2)):
        # a run that never reached the target counts as the whole budget (+1 trial)
        fill = args.trials + 1 if i == 1 else None
        without = [r[i] if r[i] is not None else fill for r in rows[False]]
        with_ = [r[i] if r[i] is not None else fill for r in rows[True]]
        if None in without or None in with_:
            print(f"{label}: not reached in every run")
            continue
        print(f"{label}: mean without {statistics.mean(without):.3f}, with {statistics.mean(with_):.3f}, "
              f"ratio with/without {statistics.mean(with_) / statistics.mean(without):.2f}")


if __name__ == "__main__":
    main()
