"""Where the time of a sweep goes: training vs everything else, against a hand-written baseline.

    python benchmarks/overhead.py            # both runs, each in a fresh process and folder

1. ``sweeper run search_spaces/digits.yaml`` (20 trials x 10 epochs, TPE + median pruning, Optuna
   on sqlite, MLflow on sqlite, checkpoint of the best, TorchScript export + parity check).
2. The same work written by hand: plain Optuna (in-memory) + PyTorch loop + MLflow fluent API,
   the same model, optimizer, schedule, data split and budget.

Prints per-trial training time (sum of epoch times) against the rest of each trial, the
sweep's fixed costs (imports, storage and MLflow set-up, export), and wall-time ratios.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "digits.yaml"


def baseline() -> None:
    """The hand-written sweep (runs in its own process: `overhead.py --baseline`)."""
    import mlflow
    import optuna
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    from sweeper_plugins.models import cnn

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    mlflow.set_tracking_uri("sqlite:///mlflow.db")
    mlflow.set_experiment("baseline")
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    val, train = order[:359], order[359:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    best = {"acc": 0.0}

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-4, 3e-2, log=True)
        wd = trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)
        channels = trial.suggest_categorical("channels", [8, 16, 32])
        torch.manual_seed(trial.number)
        model = cnn(input_shape=(1, 8, 8), num_classes=10, channels=channels, blocks=2)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
        steps = len(train) // 64
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, epochs=10, steps_per_epoch=steps)
        loss_fn = nn.CrossEntropyLoss()
        with mlflow.start_run(nested=True, run_name=f"trial-{trial.number}"):
            mlflow.log_params(trial.params)
            for epoch in range(1, 11):
                model.train()
                perm = train[torch.randperm(len(train))]
                for i in range(steps):
                    idx = perm[i * 64:(i + 1) * 64]
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(model(x[idx]), y[idx])
                    loss.backward()
                    opt.step()
                    sched.step()
                model.eval()
                with torch.inference_mode():
                    out = model(x[val])
                    acc = (out.argmax(1) == y[val]).float().mean().item()
                    val_loss = loss_fn(out, y[val]).item()
                mlflow.log_metrics({"val_acc": acc, "val_loss": val_loss}, step=epoch)
                trial.report(acc, epoch)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        best["acc"] = max(best["acc"], acc)
        return acc

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=3))
    with mlflow.start_run(run_name="baseline"):
        study.optimize(objective, n_trials=20)
    print(json.dumps({"best": study.best_value, "trials": len(study.trials)}))


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - start, out


def main() -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        base_wall, base_out = timed([sys.executable, __file__, "--baseline"], Path(b))
        sweep_wall, _ = timed([sys.executable, "-m", "sweeper", "run", str(SPEC), "--out", "out", "-q"], Path(a))
        summary = json.loads((Path(a) / "out" / "summary.json").read_text())
    base = json.loads(base_out.strip().splitlines()[-1])

    print(f"{'trial':>5} {'state':>9} {'train s':>8} {'other s':>8} {'other/train':>11}")
    train_total = trial_total = 0.0
    for t in summary["trials"]:
        train = sum(h["epoch_seconds"] for h in t["history"])
        other = (t["seconds"] or 0.0) - train
        train_total, trial_total = train_total + train, trial_total + (t["seconds"] or 0.0)
        print(f"{t['number']:>5} {t['state']:>9} {train:8.3f} {other:8.3f} {other / max(train, 1e-9):11.2f}")
    per_trial_other = trial_total - train_total
    fixed = sweep_wall - trial_total
    print(f"\nsweeper: wall {sweep_wall:.1f} s = training {train_total:.1f} s + per-trial overhead "
          f"{per_trial_other:.1f} s (sampling, storage, MLflow, checkpoints) + fixed {fixed:.1f} s "
          f"(imports, set-up, summary, export)")
    print(f"sweeper: everything-else / training = {(sweep_wall - train_total) / train_total:.2f}; "
          f"best val_acc {summary['best']['value']:.4f}")
    print(f"baseline (hand-written Optuna + PyTorch + MLflow): wall {base_wall:.1f} s, best val_acc {base['best']:.4f}")
    print(f"ratio sweeper / baseline wall time: {sweep_wall / base_wall:.2f}")


if __name__ == "__main__":
    baseline() if "--baseline" in sys.argv else main()
