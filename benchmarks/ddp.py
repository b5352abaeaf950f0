"""One trial on 1 device against the same trial as 2 DDP ranks (train.devices: 2), on the CPU
with gloo: samples/s of each epoch after the first (the first pays start-up), and the ranks'
launch cost. Both use the same cores: 1 rank with 2 torch threads, 2 ranks with 1 each (and
1 rank with 1 thread: what each rank has).

    python benchmarks/ddp.py

On a CPU the ranks compete for the same memory bandwidth and gloo's all-reduce is a copy through
shared memory, so a speed-up is not the point: the numbers show what the DDP path costs
against one process. On GPUs, benchmarks/gpu_check.py's `ranks` check measures NCCL ranks.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import describe  # noqa: E402

EPOCHS = 4
SETTINGS = (  # (ranks, torch threads per rank)
    (1, 2),
    (2, 1),
    (1, 1),
)


def main() -> None:
    from sweeper.spec import load
    from sweeper.trial.build import TrialConfig
    from sweeper.trial.execute import execute

    spec = load(
        REPO / "search_spaces" / "smoke.yaml",
        [
            "dataset.args.num_train=16384",
            "dataset.args.num_val=1024",
            "dataset.args.input_shape=[1,16,16]",
            "model.args.hidden=512",
            "model.args.depth=2",
            "train.batch_size=256",
            f"train.epochs={EPOCHS}",
            "train.device=cpu",
        ],
    )
    print(f"$ python benchmarks/ddp.py\n{describe()}")
    print(f"one trial: MLP 256-512-512-3 on 16384 samples, global batch 256, {EPOCHS} epochs, fp32")
    for ranks, threads in SETTINGS:
        config = TrialConfig(0, 1, {}, spec.with_values({"train.devices": ranks}), threads=threads * ranks)
        started = time.perf_counter()
        (out,) = execute([replace(config)], lambda number, epoch, metrics: False)
        wall = time.perf_counter() - started
        assert out.state == "complete", out.reason
        rates = [h["samples_per_s"] for h in out.history[1:]]
        trained = sum(h["epoch_seconds"] for h in out.history)
        print(
            f"{ranks} rank(s) x {threads} thread(s): {statistics.median(rates):,.0f} samples/s "
            f"(median of epochs 2-{EPOCHS}); wall {wall:.1f} s, of which outside the epochs {wall - trained:.1f} s; "
            f"final val_loss {out.history[-1]['val_loss']:.4f}"
        )


if __name__ == "__main__":
    main()
