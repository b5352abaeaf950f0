"""train.compile's cost on this machine's CPU: a digits.yaml trial of 3 epochs (the median
pruner's min_epochs: the length of a pruned trial) eager, then compiled (inductor), then a second
compiled trial of the same architecture in the same process (nothing should recompile).

    python benchmarks/compile_cost.py

On a GPU, benchmarks/gpu_check.py's `compile` check measures the same against cifar.yaml.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from sweeper.spec import load
from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
from sweeper.trial.seeding import configure_torch

DIGITS = Path(__file__).resolve().parents[1] / "search_spaces" / "digits.yaml"


def main() -> None:
    configure_torch(threads=torch.get_num_threads(), deterministic=False)
    cpu = torch.device("cpu")
    cache = ProcessCache()  # as a worker process keeps it: compiled forwards and data, trial after trial
    cache.data.load(load(DIGITS), cpu)  # the data set is loaded once per process: not part of a trial
    for label, extra in (
        ("eager", []),
        ("compiled, first", ["train.compile=true"]),
        ("compiled, second", ["train.compile=true"]),
    ):
        spec = load(DIGITS, ["train.epochs=3", "search.space={}", *extra])
        started = time.perf_counter()
        history = run_trial(TrialConfig(0, 1, {}, spec), lambda epoch, metrics: None, cpu, cache=cache).history
        epochs = [round(h["epoch_seconds"], 2) for h in history]
        print(
            f"{label}: {time.perf_counter() - started:.1f} s for 3 epochs (epoch seconds {epochs}), "
            f"val_acc {history[-1]['val_acc']:.4f}"
        )


if __name__ == "__main__":
    main()
