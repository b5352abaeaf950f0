"""Search quality at equal device-time budgets (issue #30 item 5): the anytime best validation
accuracy of five strategies, each a real `sweeper run` with the same `search.budget.device_hours`,
side by side for each task and seed:

- random: the shipped hand-written space, random sampler, no pruner;
- peer: Optuna's defaults on the hand-written space (TPE, median pruner, no warm start);
- top-k: the one-epoch baseline (arXiv 2307.15422): random candidates trained one epoch for
  `--topk-share` of the budget, then the best k (3) re-trained with full epochs (a second sweep
  warm-started from the first, whose first trials re-evaluate its best three); both phases count;
- auto: `sweeper run --auto` with `search.sampler=auto search.pruner=auto`;
- warm: the same, warm-started from the auto sweep of another seed of the same task (that
  earlier sweep's cost is not counted: it is the "earlier sweep" a user already has).

Anytime curve: trials in order (parallel 1, one CPU thread per trial, so device seconds are wall
seconds), cumulative device seconds, best validation accuracy so far. Two targets, each time as a
ratio to the peer's (median over seeds; inf when never reached): `--target` x the best accuracy any
strategy reached on that task, and, per seed, the best the peer reached in its whole budget (the
speed-up to match the baseline's final result). Validation accuracy throughout (the MNIST-1D paper's 94 % is test).

    python benchmarks/search_quality.py                              # both tasks, 5 seeds, 5 device-min
    python benchmarks/search_quality.py --tasks digits --seeds 2 --budget-minutes 0.5
    python benchmarks/search_quality.py --quick                      # digits, 1 seed, tiny budget
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import describe

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ["random", "peer", "top-k", "auto", "warm"]
FRACTIONS = [0.1, 0.25, 0.5, 1.0]
TOP_K = 3


def sweep(task: str, out: Path, seed: int, budget_s: float, *extra: str, auto: bool = False) -> list[dict]:
    """One `sweeper run` (a subprocess: each sweep's state is its own) and its summary's trials."""
    cmd = [sys.executable, "-m", "sweeper", "run", str(ROOT / "search_spaces" / f"{task}.yaml")]
    cmd += ["--out", str(out), "--quiet"] + (["--auto"] if auto else [])
    cmd += [
        "tracking.enabled=false",
        "export.formats=[]",
        f"seed={seed}",
        "search.n_trials=10000",  # the budget ends the sweep
        "search.parallel=1",
        "train.cpu_threads=1",
        f"search.budget={{device_hours: {budget_s / 3600.0}}}",
        *extra,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())["trials"]


def curve(trials: list[dict]) -> list[tuple[float, float]]:
    """(cumulative device seconds, best value so far) after each trial with a value."""
    points, spent, best = [], 0.0, -math.inf
    for trial in sorted(trials, key=lambda t: t["number"]):
        spent += trial.get("device_seconds") or 0.0
        if trial.get("value") is not None:
            best = max(best, trial["value"])
        if best > -math.inf:
            points.append((spent, best))
    return points


def best_at(points: list[tuple[float, float]], seconds: float) -> float:
    return max((value for spent, value in points if spent <= seconds), default=math.nan)


def time_to(points: list[tuple[float, float]], target: float) -> float:
    return next((spent for spent, value in points if value >= target), math.inf)


def run_seed(task: str, seed: int, budget_s: float, share: float, work: Path, warm_from: Path) -> dict:
    runs: dict[str, list[dict]] = {}
    runs["random"] = sweep(task, work / "random", seed, budget_s, "search.sampler=random", "search.pruner.type=none")
    runs["peer"] = sweep(task, work / "peer", seed, budget_s, "search.sampler=tpe", "search.pruner.type=median")
    one = sweep(
        task,
        work / "topk1",
        seed,
        budget_s * share,
        "search.sampler=random",
        "search.pruner.type=none",
        "train.epochs=1",
    )
    spent = sum(t.get("device_seconds") or 0.0 for t in one)
    full = sweep(
        task,
        work / "topk2",
        seed,
        max(budget_s - spent, 1.0),
        "search.sampler=random",
        "search.pruner.type=none",
        f"search.n_trials={TOP_K}",
        f"search.warm_start=[{work / 'topk1'}]",
    )
    runs["top-k"] = one + [dict(t, number=t["number"] + 10**6) for t in full]
    runs["auto"] = sweep(task, work / "auto", seed, budget_s, "search.sampler=auto", "search.pruner=auto", auto=True)
    runs["warm"] = sweep(
        task,
        work / "warm",
        seed,
        budget_s,
        "search.sampler=auto",
        "search.pruner=auto",
        f"search.warm_start=[{warm_from}]",
        auto=True,
    )
    return {name: curve(trials) for name, trials in runs.items()}


def fmt(values: list[float], digits: int = 3) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    med = statistics.median(finite)
    if len(finite) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{min(finite):.{digits}f}-{max(finite):.{digits}f}]"


def report(task: str, curves: list[dict], budget_s: float, target_share: float) -> None:
    top = max(value for seed in curves for points in seed.values() for _, value in points)
    target = target_share * top
    print(f"\n{task}: best val_acc any strategy reached {top:.4f}; target {target_share:.0%} of it = {target:.4f}")
    head = "".join(f"{f'@{f:.0%}':>22}" for f in FRACTIONS)
    print(f"{'strategy':<8}{head}{'to target (s)':>16}{'x peer':>8}{'to peer final (s)':>20}{'x peer':>8}")
    peer_t = [time_to(seed["peer"], target) for seed in curves]
    # the second target, per seed: the best the peer reached in its whole budget; the ratio is the
    # speed-up to match the peer's final result (how HPO papers compare a method with a baseline)
    peer_final = [best_at(seed["peer"], budget_s) for seed in curves]
    peer_final_t = [time_to(seed["peer"], final) for seed, final in zip(curves, peer_final)]
    for name in STRATEGIES:
        cells = "".join(f"{fmt([best_at(seed[name], f * budget_s) for seed in curves]):>22}" for f in FRACTIONS)
        times = [time_to(seed[name], target) for seed in curves]
        final_times = [time_to(seed[name], final) for seed, final in zip(curves, peer_final)]
        print(
            f"{name:<8}{cells}{statistics.median(times):>16.1f}{median_ratio(times, peer_t):>8}"
            f"{statistics.median(final_times):>20.1f}{median_ratio(final_times, peer_final_t):>8}",
            flush=True,
        )
    print(f"peer's final best per seed: {', '.join(f'{v:.4f}' for v in peer_final)}")
    if task == "mnist1d":
        autos = [best_at(seed["auto"], budget_s) for seed in curves]
        print(
            f"--auto best val_acc (median) {statistics.median(autos):.4f}: "
            f"{'above' if statistics.median(autos) > 0.94 else 'below'} the paper's CNN (94 %, a test accuracy)"
        )


def median_ratio(times: list[float], peer_times: list[float]) -> str:
    """The median over seeds of a strategy's time over the peer's (inf: never reached within the budget)."""
    ratios = [t / p if p > 0 and math.isfinite(p) else math.nan for t, p in zip(times, peer_times)]
    finite = [r for r in ratios if not math.isnan(r)]
    return f"{statistics.median(finite):.2f}" if finite else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="*", default=["mnist1d", "digits"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget-minutes", type=float, default=5.0, help="device-minutes per sweep")
    parser.add_argument("--topk-share", type=float, default=0.5, help="budget share of the one-epoch phase")
    parser.add_argument(
        "--target", type=float, default=0.95, help="target: this share of the best any strategy reached"
    )
    parser.add_argument("--quick", action="store_true", help="digits, 1 seed, 0.25 device-minutes")
    parser.add_argument("--keep", type=Path, default=None, help="keep the sweeps' folders here")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.seeds, args.budget_minutes = ["digits"], 1, 0.25
    budget_s = args.budget_minutes * 60.0
    print("$ python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]))
    print(f"{describe()}, 1 thread per trial")
    print(
        f"budget {args.budget_minutes:g} device-minutes per sweep, {args.seeds} seed(s), "
        f"top-k: k={TOP_K}, one-epoch phase {args.topk_share:.0%}"
    )
    root = args.keep or Path(tempfile.mkdtemp(prefix="search_quality_"))
    try:
        for task in args.tasks:
            curves = []
            for seed in range(args.seeds):
                work = root / task / f"seed{seed}"
                # the warm start's earlier sweep: another seed's --auto sweep (its cost not counted)
                source = root / task / "source"
                if not (source / "summary.json").exists():
                    sweep(task, source, 1000 + seed, budget_s, "search.sampler=auto", "search.pruner=auto", auto=True)
                curves.append(run_seed(task, seed, budget_s, args.topk_share, work, source))
                print(f"  {task} seed {seed} done", file=sys.stderr, flush=True)
            report(task, curves, budget_s, args.target)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
