"""What the DataLoader path costs against the whole-tensor path, on the same CIFAR-shaped trial.

    python benchmarks/data_path.py            # three one-trial sweeps, each in a fresh process (~1 min)
    python benchmarks/data_path.py --epochs 3 --train 4096 --json

One trial of the `cnn` model on `synthetic` data shaped like CIFAR-10 (3x32x32, 10 classes),
run three times from the same spec and seed: on the tensor path (data.path: auto: whole splits
batched by index), and on the DataLoader path (data.path: loader: the same tensors wrapped into
datasets) with 0 and with 2 workers. Each run's training throughput is the mean samples/s of its
epochs after the first (the first pays for warm-up, and with workers for starting them); the
ratio is against the tensor path measured in the same invocation. The three trial tables are
the same (same batches, same order), which the script checks before it prints.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PATHS = (("tensors", ["data.path=auto"]), ("loader, 0 workers", ["data.path=loader", "data.num_workers=0"]))
PATHS += (("loader, 2 workers", ["data.path=loader", "data.num_workers=2"]),)


def spec(args: argparse.Namespace) -> dict:
    shape = [3, 32, 32]
    return {
        "name": "data-path",
        "seed": 0,
        "dataset": {
            "plugin": "synthetic",
            "args": {"num_train": args.train, "num_val": args.val, "input_shape": shape, "num_classes": 10},
        },
        "model": {"plugin": "cnn", "args": {"channels": args.channels}},
        "optimizer": {"plugin": "sgd", "args": {"lr": 0.05, "momentum": 0.9}},
        "train": {"epochs": args.epochs, "batch_size": args.batch, "device": "cpu", "cpu_threads": args.threads},
        "search": {"n_trials": 1},
        "tracking": {"enabled": False},
        "export": {"formats": []},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=2048, help="training samples")
    parser.add_argument("--val", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--channels", type=int, default=16, help="the cnn's first channels")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the trial")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    rows, tables = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(json.dumps(spec(args)))
        for label, overrides in PATHS:
            out = Path(tmp) / label.replace(" ", "").replace(",", "-")
            started = time.perf_counter()
            command = [sys.executable, "-m", "sweeper", "run", str(path), *overrides, "--out", str(out), "-q"]
            proc = subprocess.run(command, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{label}: sweeper run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
            wall = time.perf_counter() - started
            trial = json.loads((out / "summary.json").read_text())["trials"][0]
            history = trial["history"]
            steady = history[1:] or history  # epochs after the first
            rate = sum(e["samples_per_s"] for e in steady) / len(steady)
            rows.append({"path": label, "samples_per_s": rate, "wall_s": wall, "val_acc": history[-1]["val_acc"]})
            tables.append([(e["train_loss"], e["val_loss"]) for e in history])
    if any(t != tables[0] for t in tables):
        raise SystemExit(f"the three paths trained differently: {tables}")
    base = rows[0]["samples_per_s"]
    for row in rows:
        row["ratio"] = row["samples_per_s"] / base
    setting = (
        f"cnn channels {args.channels} on synthetic 3x32x32, {args.train} train / {args.val} val samples, batch "
        f"{args.batch}, {args.epochs} epochs, {args.threads} torch thread(s), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads in this process"
    )
    if args.json:
        print(json.dumps({"setting": setting, "runs": rows}, indent=2))
        return
    print(setting)
    print(f"{'path':<20} {'samples/s':>10} {'ratio':>7} {'wall s':>8} {'val_acc':>8}")
    for row in rows:
        print(
            f"{row['path']:<20} {row['samples_per_s']:>10.0f} {row['ratio']:>7.2f} "
            f"{row['wall_s']:>8.1f} {row['val_acc']:>8.4f}"
        )
    print("the three trials trained identically (same losses, epoch by epoch)")


if __name__ == "__main__":
    main()
