"""Fused trials vs solo trials: the digits CNN, the same N trials (each its own seed and learning
rate) trained one after another, then as one fused model (layered, and with vmap: see
sweeper/trial/fused_forward.py); trials per hour and the ratios, side by side in one run.
Training only (sweeper/trial/fused.py's engine), in this process: the sweep's
orchestration around it is benchmarks/overhead.py's subject.

    python benchmarks/fused.py              # N = 1, 8, 32, 64, 3 epochs each
    python benchmarks/fused.py 8 32 --epochs 2
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from sweeper.spec import load
from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
from sweeper.trial.fused import fit_fused
from sweeper.trial.seeding import configure_torch, trial_seed

DIGITS = Path(__file__).resolve().parents[1] / "search_spaces" / "digits.yaml"


def configs(n: int, epochs: int) -> list[TrialConfig]:
    """N digits.yaml trials of the base architecture, learning rates spread log-uniformly."""
    out = []
    for number in range(n):
        lr = 10 ** (-3.5 + 2 * number / max(1, n - 1))
        spec = load(DIGITS, [f"train.epochs={epochs}", "search.space={}", f"optimizer.args.lr={lr}"])
        out.append(TrialConfig(number, trial_seed(spec.seed, number), {"optimizer.args.lr": lr}, spec))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    configure_torch(threads=torch.get_num_threads(), deterministic=False)
    cpu = torch.device("cpu")
    cache = ProcessCache()
    cache.data.load(configs(1, args.epochs)[0].spec, cpu)  # loaded once per process, for both
    warm = configs(2, 1)  # first calls (lazy imports, allocator) out of the timings
    run_trial(warm[0], lambda epoch, metrics: None, cpu, cache=cache)
    fit_fused(warm, cpu, lambda k, epoch, metrics: None, cache=cache)
    print(f"digits CNN, {args.epochs} epochs a trial, {torch.get_num_threads()} threads")
    print(
        f"{'N':>4} {'solo s':>8} {'fused s':>8} {'vmap s':>8} {'solo trials/h':>14} {'fused trials/h':>15} "
        f"{'ratio':>6} {'vmap ratio':>10}  best val_acc solo / fused"
    )
    for n in args.sizes:
        trials = configs(n, args.epochs)
        started = time.perf_counter()
        solo = [run_trial(c, lambda epoch, metrics: None, cpu, cache=cache).history[-1]["val_acc"] for c in trials]
        solo_s = time.perf_counter() - started
        started = time.perf_counter()
        fused = [
            m.history[-1]["val_acc"] if m.history else math.nan
            for m in fit_fused(trials, cpu, lambda k, epoch, metrics: None, cache=cache)
        ]
        fused_s = time.perf_counter() - started
        started = time.perf_counter()
        fit_fused(trials, cpu, lambda k, epoch, metrics: None, layered=False, cache=cache)
        vmap_s = time.perf_counter() - started
        print(
            f"{n:>4} {solo_s:>8.1f} {fused_s:>8.1f} {vmap_s:>8.1f} {n * 3600 / solo_s:>14,.0f} "
            f"{n * 3600 / fused_s:>15,.0f} {solo_s / fused_s:>6.2f} {solo_s / vmap_s:>10.2f}  "
            f"{max(solo):.4f} / {max(fused):.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
