"""How far a fused member's per-epoch metrics are from its solo run's, for every built-in task:
3 members of search_spaces/diabetes.yaml (mse, huber and l1 losses), of multilabel.yaml and of
smoke.yaml's classification with balanced, listed and no class weights; each engine (layered,
vmap) and each optimizer step ("stacked": one update where the members' optimizers allow, else
each its own; "per member": each its own). Prints the largest relative difference of any metric
but the timings (tests/test_fused.py asserts it stays under 1e-5).

    python benchmarks/fused_parity.py
    python benchmarks/fused_parity.py --epochs 5
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sweeper.spec import load
from sweeper.trial.build import TrialConfig, run_trial
from sweeper.trial.fused import fit_fused

SPACES = Path(__file__).resolve().parents[1] / "search_spaces"
TIMING = {"epoch_seconds", "samples_per_s", "gpu_mem_peak_mb"}
MEMBERS = {
    "regression": (
        "diabetes",
        [
            ["task.args.loss=mse"],
            ["task.args.loss=huber", "optimizer.args.lr=0.01"],
            ["task.args.loss=l1", "train.grad_clip=1.0"],
        ],
    ),
    "multilabel": ("multilabel", [[], ["optimizer.args.lr=0.01", "task.args.threshold=0.3"], ["train.grad_clip=0.5"]]),
    "classification": (
        "smoke",
        [
            ["task={plugin: classification, args: {class_weights: balanced}}"],
            ["task={plugin: classification, args: {class_weights: [1.0, 2.0, 1.0]}}"],
            ["task={plugin: classification, args: {label_smoothing: 0.1}}"],
        ],
    ),
}


def configs(task: str, epochs: int) -> list[TrialConfig]:
    base, overrides = MEMBERS[task]
    common = [f"train.epochs={epochs}", *(["model.args.hidden=16"] if base != "smoke" else [])]
    return [
        TrialConfig(k, 10 + k, {}, load(SPACES / f"{base}.yaml", [*common, *extra]))
        for k, extra in enumerate(overrides)
    ]


def largest_difference(members: list, solos: list) -> tuple[float, bool]:
    """The largest relative difference of any metric but the timings, and whether all are equal."""
    worst, equal = 0.0, True
    for fused, solo in zip(members, solos):
        for a, b in zip(fused.history, solo.history, strict=True):
            for key, value in b.items():
                if key in TIMING:
                    continue
                equal &= a[key] == value
                worst = max(worst, abs(a[key] - value) / max(abs(value), 1e-12))
    return worst, equal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    print(f"fp32 on the CPU, {args.epochs} epochs, {torch.get_num_threads()} threads")
    print(f"{'task':<16}{'engine':<9}{'optimizer step':<16}largest relative difference")
    for task in MEMBERS:
        trials = configs(task, args.epochs)
        solos = [run_trial(c, lambda epoch, metrics: None, cpu) for c in trials]
        for layered in (True, False):
            for stacked in (True, False):
                members = fit_fused(trials, cpu, lambda k, e, m: None, stacked=stacked, layered=layered)
                worst, equal = largest_difference(members, solos)
                step = "stacked" if stacked else "per member"
                print(f"{task:<16}{members[0].engine:<9}{step:<16}{'bitwise' if equal else f'{worst:.1e}'}")


if __name__ == "__main__":
    main()
