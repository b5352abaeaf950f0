"""What proposing trials in batches costs TPE (sweeper/plan/strategy.py's batch and fuse rules):
the same budget of trials, proposed b at a time (each batch knowing only the earlier batches'
results, as sweeper's reproducible batches do), on a cheap synthetic objective shaped like a
sweep's (a log-scale learning rate with a narrow good range, a log-scale weight decay, a width
choice); the median and mean best value over seeds, against random sampling.

    python benchmarks/strategy.py                      # 64 trials, b = 1 2 8 16 32 64, 20 seeds
    python benchmarks/strategy.py --trials 32 --batches 1 4 8 --seeds 10
"""

from __future__ import annotations

import argparse
import math
import statistics

import optuna


def draw(trial: optuna.Trial) -> dict[str, float]:
    """A trial's values, drawn when it is proposed (before any other trial of its batch ends)."""
    return {
        "lr": trial.suggest_float("lr", 1e-5, 1.0, log=True),
        "wd": trial.suggest_float("wd", 1e-6, 1e-2, log=True),
        "width": trial.suggest_categorical("width", [8, 16, 32, 64]),
    }


def loss(p: dict[str, float]) -> float:
    """Its minimum, 0, at lr 3e-3, weight decay 1e-4, width 32."""
    return (
        (math.log10(p["lr"]) - math.log10(3e-3)) ** 2
        + 0.2 * (math.log10(p["wd"]) + 4) ** 2
        + 0.3 * abs(math.log2(p["width"] / 32))
    )


def best(sampler: optuna.samplers.BaseSampler, trials: int, batch: int) -> float:
    study = optuna.create_study(sampler=sampler)
    done = 0
    while done < trials:
        asked = [study.ask() for _ in range(min(batch, trials - done))]
        drawn = [draw(trial) for trial in asked]  # all drawn before any result of the batch
        for trial, values in zip(asked, drawn):
            study.tell(trial, loss(values))
        done += len(asked)
    return study.best_value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 2, 8, 16, 32, 64])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = range(args.seeds)
    rows = [("random", [best(optuna.samplers.RandomSampler(seed=s), args.trials, 1) for s in seeds])]
    for b in args.batches:
        rows.append((f"tpe, batches of {b}", [best(optuna.samplers.TPESampler(seed=s), args.trials, b) for s in seeds]))
    print(f"{args.trials} trials, {args.seeds} seeds: best loss (0 is the optimum; lower is better)")
    print(f"{'sampler':<22} {'median':>8} {'mean':>8}")
    for name, values in rows:
        print(f"{name:<22} {statistics.median(values):>8.3f} {statistics.fmean(values):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
