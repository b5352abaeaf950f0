"""Resumable training: a trial stopped after epoch k, saved, rebuilt from nothing and resumed
ends bitwise where the uninterrupted trial ends; a state adopted with other hyperparameters
(PBT's exploit) keeps the weights and optimizer buffers and takes the new settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import config as smoke_config
from conftest import learned, write_tiny_cifar

from sweeper.trial import checkpoint
from sweeper.trial.build import TrialConfig, run_trial
from sweeper.trial.checkpoint import Resume

CPU = torch.device("cpu")
EPOCHS, STOP = 4, 2  # train 4 epochs straight; or 2, save, rebuild, resume to 4


def config(*overrides: str) -> TrialConfig:
    return smoke_config(*overrides, seed=7, epochs=EPOCHS)


def stopped_at(cfg: TrialConfig, path: Path, epoch: int = STOP) -> None:
    """Train until ``epoch``, save the state at its end (as a worker would), then stop."""

    class Stop(Exception):
        pass

    def on_epoch_end(state: checkpoint.State) -> None:
        if state["epoch"] == epoch:
            checkpoint.save(path, state)
            raise Stop

    with pytest.raises(Stop):
        run_trial(cfg, lambda e, m: None, CPU, on_epoch_end=on_epoch_end)


CASES = {
    "adam+cosine+dropout": ["model.args={hidden: 32, depth: 2, dropout: 0.3}"],
    "sgd+onecycle+accumulation": [
        "optimizer={plugin: sgd, args: {lr: 0.05, momentum: 0.9, nesterov: true}}",
        "schedule.plugin=onecycle",
        "train.accumulate=4",
    ],
    "adamw+plateau": ["optimizer.plugin=adamw", "schedule={plugin: plateau, args: {patience: 0, factor: 0.5}}"],
    "cifar augmentation+cnn+warm-up": [
        "dataset={plugin: cifar10, args: {root: tiny, val_fraction: 0.2}}",
        "train.batch_size=16",
        "model={plugin: cnn, args: {channels: 4, blocks: 1, dropout: 0.2}}",
        "schedule={plugin: cosine, args: {warmup_epochs: 1}}",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_resumed_training_is_bitwise_the_uninterrupted_one(case: str, tmp_path: Path):
    if "cifar" in case:
        write_tiny_cifar(tmp_path / "tiny")  # the working directory is tmp_path
    cfg = config(*CASES[case])
    seen: list[int] = []
    straight = run_trial(cfg, lambda e, m: seen.append(e), CPU)
    assert seen == [1, 2, 3, 4]

    path = tmp_path / "state.pt"
    stopped_at(cfg, path)
    state = checkpoint.load(path)  # weights_only=True: every part of the state is plain data
    assert state["epoch"] == STOP and len(state["history"]) == STOP
    seen.clear()
    resumed = run_trial(cfg, lambda e, m: seen.append(e), CPU, resume=Resume(state))  # everything fresh
    assert seen == [3, 4]  # epochs 1-2 are not trained (nor reported) again

    assert learned(resumed.history) == learned(straight.history)  # every epoch, bitwise
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(
        straight.optimizer.state_dict()["state"].values(), resumed.optimizer.state_dict()["state"].values()
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_straight_run_is_unchanged_by_handing_out_its_state():
    cfg = config()
    plain = run_trial(cfg, lambda e, m: None, CPU)
    states: list[int] = []
    watched = run_trial(cfg, lambda e, m: None, CPU, on_epoch_end=lambda s: states.append(s["epoch"]))
    assert states == [1, 2, 3, 4] and learned(plain.history) == learned(watched.history)


@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_new_hyperparameters_keep_weights_and_buffers_and_move_the_schedule(schedule: str, tmp_path: Path):
    donor_cfg = config(f"schedule.plugin={schedule}", "optimizer.args={lr: 0.01, weight_decay: 0.0}")
    path = tmp_path / "donor.pt"
    stopped_at(donor_cfg, path)
    donor = checkpoint.load(path)
    new_cfg = config(f"schedule.plugin={schedule}", "optimizer.args={lr: 0.012, weight_decay: 0.001}")
    straight_new = run_trial(new_cfg, lambda e, m: None, CPU)  # its schedule, from epoch 1

    captured: list[checkpoint.State] = []
    adopted = run_trial(
        new_cfg,
        lambda e, m: None,
        CPU,
        resume=Resume(donor, new_hyperparameters=True),
        on_epoch_end=lambda s: captured.append(s),
    )
    assert learned(adopted.history[:STOP]) == learned(donor["history"])  # the donor's epochs as the start
    # the new schedule from the donor's step on: the LRs the new config has at epochs 3 and 4
    assert [h["lr"] for h in adopted.history[STOP:]] == [h["lr"] for h in straight_new.history[STOP:]]
    groups = adopted.optimizer.param_groups
    assert groups[0]["weight_decay"] == 0.001
    assert groups[0]["max_lr" if schedule == "onecycle" else "initial_lr"] == 0.012  # the new peak/base


def test_new_hyperparameters_carry_the_optimizer_buffers_not_its_settings(tmp_path: Path):
    donor_cfg = config("schedule.plugin=none", "optimizer.args={lr: 0.01}")
    path = tmp_path / "donor.pt"
    stopped_at(donor_cfg, path)
    donor = checkpoint.load(path)
    new_cfg = config("schedule.plugin=none", "optimizer.args={lr: 0.002, weight_decay: 0.01}")
    from sweeper.trial.build import build

    parts = build(new_cfg, CPU)
    checkpoint.restore(
        Resume(donor, new_hyperparameters=True),
        model=parts.model,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        generators={},
    )
    state = parts.optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.002 and state["param_groups"][0]["weight_decay"] == 0.01
    for mine, theirs in zip(state["state"].values(), donor["optimizer"]["state"].values()):
        assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and torch.equal(mine["step"], theirs["step"])
    for a, b in zip(parts.model.state_dict().values(), donor["model"].values()):
        assert torch.equal(a, b)


def test_new_hyperparameters_with_plateau_keep_the_cuts_so_far(tmp_path: Path):
    plateau = "schedule={plugin: plateau, args: {patience: 0, factor: 0.5}}"
    path = tmp_path / "donor.pt"
    # too high an LR: the validation loss rises at epoch 2 and the plateau schedule halves the LR
    stopped_at(config(plateau, "optimizer.args={lr: 0.3}"), path)
    donor = checkpoint.load(path)
    cut = donor["optimizer"]["param_groups"][0]["lr"] / 0.3
    assert cut < 1  # the donor's plateau schedule has cut its LR at least once
    adopted = run_trial(
        config(plateau, "optimizer.args={lr: 0.1}"),
        lambda e, m: None,
        CPU,
        resume=Resume(donor, new_hyperparameters=True),
    )
    # the epoch-3 LR: 0.1 with the donor's cut, and maybe one more (patience 0)
    assert adopted.history[STOP]["lr"] in (pytest.approx(0.1 * cut), pytest.approx(0.1 * cut * 0.5))
