"""The training loop: seeded determinism, accumulation equivalence, non-finite guard, pruning."""

from __future__ import annotations

import pytest
import torch
from conftest import config, learned

from sweeper.errors import TrialFailed, TrialPruned
from sweeper.trial.build import run_trial

CPU = torch.device("cpu")


def test_same_seed_same_metrics_bitwise():
    a = run_trial(config(), lambda e, m: None, CPU)
    b = run_trial(config(), lambda e, m: None, CPU)
    assert learned(a.history) == learned(b.history)  # exact equality, not approx
    c = run_trial(config(seed=2), lambda e, m: None, CPU)
    assert learned(c.history) != learned(a.history)


def test_reports_every_epoch_with_the_documented_metrics():
    seen = []
    trained = run_trial(config("train.epochs=3"), lambda e, m: seen.append((e, m)), CPU)
    assert [e for e, _ in seen] == [1, 2, 3]
    assert set(seen[0][1]) == {
        "train_loss",
        "train_acc",
        "val_loss",
        "val_acc",
        "lr",
        "grad_norm",
        "epoch_seconds",
        "samples_per_s",
    }
    assert trained.history == [m for _, m in seen]
    assert trained.history[-1]["val_acc"] > 0.5  # it learns the synthetic teacher


def test_accumulation_gives_the_same_updates():
    # batch 32 in one pass vs. 4 micro-batches of 8: same samples per step, same mean loss
    base = ["optimizer.plugin=sgd", "optimizer.args={lr: 0.1}", "schedule.plugin=none", "train.epochs=2"]
    one = run_trial(config(*base, "train.accumulate=1"), lambda e, m: None, CPU)
    four = run_trial(config(*base, "train.accumulate=4"), lambda e, m: None, CPU)
    for p1, p4 in zip(one.model.parameters(), four.model.parameters()):
        torch.testing.assert_close(p1, p4, rtol=1e-5, atol=1e-6)
    assert one.history[-1]["train_loss"] == pytest.approx(four.history[-1]["train_loss"], rel=1e-5)


def test_non_finite_loss_fails_the_trial_with_its_reason():
    with pytest.raises(TrialFailed, match="^non-finite loss at epoch 1"):
        run_trial(
            config("optimizer.plugin=sgd", "optimizer.args={lr: 1.0e+12}", "schedule.plugin=none"),
            lambda e, m: None,
            CPU,
        )


def test_pruning_raised_by_report_stops_training():
    epochs = []

    def report(epoch, metrics):
        epochs.append(epoch)
        if epoch == 2:
            raise TrialPruned("pruned at epoch 2")

    with pytest.raises(TrialPruned):
        run_trial(config("train.epochs=5"), report, CPU)
    assert epochs == [1, 2]


def test_grad_clip_bounds_each_update():
    base = ["optimizer.plugin=sgd", "optimizer.args={lr: 1.0}", "schedule.plugin=none", "train.epochs=1"]
    free = run_trial(config(*base), lambda e, m: None, CPU)
    clipped = run_trial(config(*base, "train.grad_clip=1.0e-6"), lambda e, m: None, CPU)
    start = run_trial(config(*base, "train.grad_clip=1.0e-6", "optimizer.args={lr: 0.0}"), lambda e, m: None, CPU)

    def moved(t):
        return sum((a - b).abs().sum().item() for a, b in zip(t.model.parameters(), start.model.parameters()))

    # 8 steps of lr 1.0 with gradient norm <= 1e-6 move every weight by at most ~8e-6 in total norm
    assert moved(clipped) < 1e-4 < moved(free)


def test_plateau_schedule_steps_per_epoch_on_val_loss():
    """The one test of this rule, for both trainers that apply it: the solo trainer and each
    member of a fused group (trial/fused.py steps each member's plateau schedule on its own
    validation loss)."""
    from sweeper.trial.build import TrialConfig
    from sweeper.trial.fused import fit_fused

    plateau = config(
        "schedule={plugin: plateau, args: {patience: 0, factor: 0.5}}", "optimizer.args={lr: 0.1}", "train.epochs=4"
    )
    solo = run_trial(plateau, lambda e, m: None, CPU).history
    members = [TrialConfig(k, 1 + k, {}, plateau.spec) for k in range(2)]
    fused = [m.history for m in fit_fused(members, CPU, lambda k, e, m: None)]
    for history in (solo, *fused):
        lrs = [h["lr"] for h in history]
        # patience 0: the LR halves after each epoch whose validation loss is not below the best so
        # far (ReduceLROnPlateau's relative threshold 1e-4), and only then: it steps per epoch
        expected, best = [0.1], history[0]["val_loss"]
        for h in history[1:]:
            expected.append(expected[-1] if h["val_loss"] < best * (1 - 1e-4) else expected[-1] * 0.5)
            best = min(best, h["val_loss"])
        assert lrs == pytest.approx(expected)
    assert solo[-1]["lr"] < solo[0]["lr"]  # this config's LR does drop


def test_bf16_autocast_runs_on_cpu():
    cfg = config("train.device=cpu", "train.precision=bf16")
    seen: dict[bool, set[torch.dtype]] = {True: set(), False: set()}  # training mode -> output dtypes

    def watch(parts):
        parts.model.register_forward_hook(lambda m, args, out: seen[m.training].add(out.dtype))

    trained = run_trial(cfg, lambda e, m: None, CPU, before_fit=watch)
    assert seen == {True: {torch.bfloat16}, False: {torch.bfloat16}}  # training and evaluation ran in bf16
    assert trained.history[-1]["val_acc"] > 0.5
    assert all(p.dtype == torch.float32 for p in trained.model.parameters())  # weights stay fp32


def test_deterministic_mode_switches_torch_to_deterministic_kernels():
    import os

    from sweeper.trial.seeding import configure_torch

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # set on import, before CUDA starts
    try:
        configure_torch(threads=1, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert not torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
        assert torch.get_num_threads() == 1
        deterministic = run_trial(config("train.deterministic=true"), lambda e, m: None, CPU)
    finally:
        configure_torch(threads=2, deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    assert deterministic.history[-1]["val_acc"] > 0.5
