"""Where the time of a sweep goes: training vs everything else, against a hand-written baseline.

    python benchmarks/overhead.py        # four runs, each in a fresh process and folder (~2.5 min)

1. demo: ``sweeper run search_spaces/digits.yaml`` as shipped (20 trials x 10 epochs, TPE +
   median pruning, 2 worker processes x 1 thread, Optuna and MLflow on sqlite, checkpoint of the
   best, TorchScript export + parity check).
2. sequential: the same spec with ``search.parallel=1 train.cpu_threads=2 export.formats=[]``:
   one process, two threads, no export or registry (the baseline has neither), like a script.
3. baseline: the same work written by hand (plain Optuna in memory + a PyTorch loop + MLflow's
   fluent API): the trials of run 2 (same params, same number of epochs each), same model,
   optimizer, schedule and data split, one process, two threads.

4. one trial: run 2 with ``search.n_trials=1``: its wall time less its trial's is the fixed cost.

Prints per-trial training time (sum of epoch times) against the rest of each trial for run 2;
run 2's wall time split into training, work in the worker, orchestration per trial and the
fixed cost; orchestration per trial also within run 2 alone (its search's wall, the phase
"trials" of sweeper/phases.py, less its trials' own seconds: no second run's wall subtracted,
whose noise is seconds); and wall-time ratios against the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "digits.yaml"


def baseline(plan_path: str) -> None:
    """Train the planned trials by hand (runs in its own process: `overhead.py --baseline PLAN`)."""
    import mlflow
    import optuna
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    from sweeper.trial.seeding import derive
    from sweeper_plugins.models import cnn

    plan = json.loads(Path(plan_path).read_text())
    torch.set_num_threads(2)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    mlflow.set_tracking_uri("sqlite:///mlflow.db")
    mlflow.set_experiment("baseline")
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y)
    split_seed = derive(0, "data")  # the split sweeper's digits plugin makes for sweep seed 0
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    val, train = order[:359], order[359:]
    x = (x - x[train].mean()) / x[train].std()

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("optimizer.args.lr", 1e-4, 3e-2, log=True)
        wd = trial.suggest_float("optimizer.args.weight_decay", 1e-6, 1e-2, log=True)
        channels = trial.suggest_categorical("model.args.channels", [8, 16, 32])
        epochs = plan[trial.number]["epochs"]
        torch.manual_seed(trial.number)
        model = cnn(input_shape=(1, 8, 8), num_classes=10, channels=channels, blocks=2)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
        steps = len(train) // 64
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, epochs=10, steps_per_epoch=steps)
        loss_fn = nn.CrossEntropyLoss()
        with mlflow.start_run(nested=True, run_name=f"trial-{trial.number}"):
            mlflow.log_params(trial.params)
            for epoch in range(1, epochs + 1):
                model.train()
                perm = train[torch.randperm(len(train))]
                for i in range(steps):
                    idx = perm[i * 64 : (i + 1) * 64]
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
        if plan[trial.number]["state"] == "pruned":
            raise optuna.TrialPruned()
        return acc

    study = optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=3),
    )
    for t in plan:
        study.enqueue_trial(t["params"])
    with mlflow.start_run(run_name="baseline"):
        study.optimize(objective, n_trials=len(plan))
    print(json.dumps({"best": study.best_value, "trials": len(study.trials)}))


def timed(cmd: list[str], cwd: Path, phases: Path | None = None) -> float:
    """Wall seconds of ``cmd`` in ``cwd``; with ``phases``, its phases written there (sweeper/phases.py)."""
    env = {**os.environ, "SWEEPER_PHASES": str(phases)} if phases is not None else None
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, env=env)
    return time.perf_counter() - start


def search_seconds(phases: Path) -> float:
    """The wall seconds of the sweep's search on its main thread: its "trials" phase."""
    lines = [json.loads(line) for line in phases.read_text().splitlines()]
    (search,) = [p for p in lines if p["phase"] == "trials" and p["thread"] == "MainThread"]
    return float(search["end"] - search["start"])


def main() -> None:
    run = [sys.executable, "-m", "sweeper", "run", str(SPEC), "--out", "out", "-q"]
    with (
        tempfile.TemporaryDirectory() as demo,
        tempfile.TemporaryDirectory() as seq,
        tempfile.TemporaryDirectory() as base,
    ):
        demo_wall = timed(run, Path(demo))
        demo_best = json.loads((Path(demo) / "out" / "summary.json").read_text())["best"]["value"]
        seq_phases = Path(seq) / "phases.jsonl"
        seq_wall = timed([*run, "search.parallel=1", "train.cpu_threads=2", "export.formats=[]"], Path(seq), seq_phases)
        summary = json.loads((Path(seq) / "out" / "summary.json").read_text())
        seq_search = search_seconds(seq_phases)
        # the fixed cost: a one-trial sweep's wall time less that trial's own seconds
        one = Path(seq) / "one"
        one.mkdir()
        one_wall = timed(
            [*run, "search.parallel=1", "train.cpu_threads=2", "export.formats=[]", "search.n_trials=1"], one
        )
        fixed = one_wall - json.loads((one / "out" / "summary.json").read_text())["trials"][0]["seconds"]
        plan = Path(base) / "plan.json"
        plan.write_text(
            json.dumps([{"params": t["params"], "epochs": t["epochs"], "state": t["state"]} for t in summary["trials"]])
        )
        base_wall = timed([sys.executable, __file__, "--baseline", str(plan)], Path(base))

    print(f"{'trial':>5} {'state':>9} {'epochs':>6} {'train s':>8} {'other s':>8} {'other/train':>11}")
    train_total = trial_total = 0.0
    for t in summary["trials"]:
        train = sum(h["epoch_seconds"] for h in t["history"])
        other = t["seconds"] - train
        train_total, trial_total = train_total + train, trial_total + t["seconds"]
        print(f"{t['number']:>5} {t['state']:>9} {t['epochs']:>6} {train:8.3f} {other:8.3f} {other / train:11.2f}")
    n = len(summary["trials"])
    orchestration = seq_wall - fixed - trial_total
    # the same, within the one run: its search's wall less its trials' seconds (no second run subtracted)
    direct = seq_search - trial_total
    print(
        f"\nsequential sweeper: wall {seq_wall:.1f} s = training {train_total:.1f} s + in the worker "
        f"{trial_total - train_total:.1f} s (building, checkpoints) + orchestration {orchestration:.1f} s "
        f"(sampling, Optuna storage, MLflow runs: {1000 * orchestration / n:.0f} ms a trial; goal <= 20) "
        f"+ fixed {fixed:.1f} s (imports, storage and MLflow set-up, dry build, summary: a one-trial sweep's "
        f"wall less its trial; goal <= 4)"
    )
    print(
        f"sequential sweeper, within the run: search {seq_search:.1f} s = its trials {trial_total:.1f} s + "
        f"orchestration {direct:.2f} s ({1000 * direct / n:.0f} ms a trial; goal <= 20), and "
        f"{seq_wall - seq_search:.1f} s before and after the search"
    )
    print(f"sequential sweeper: everything-else / training = {(seq_wall - train_total) / train_total:.2f}")
    print(f"baseline (hand-written Optuna + PyTorch + MLflow, same trials and epochs): wall {base_wall:.1f} s")
    print(f"ratio sequential sweeper / baseline: {seq_wall / base_wall:.2f}")
    print(
        f"demo as shipped (parallel 2, TorchScript export verified in a fresh process, model "
        f"registered in MLflow): wall {demo_wall:.1f} s, best val_acc {demo_best:.4f}; "
        f"ratio demo / baseline: {demo_wall / base_wall:.2f}"
    )


if __name__ == "__main__":
    baseline(sys.argv[2]) if "--baseline" in sys.argv else main()
