"""sweeper.testing: the conformance checks pass on good plugins and name what breaks on bad ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import make_dist

from sweeper.pluginhost import registry
from sweeper.testing import (
    PluginExportWarning,
    check_dataset_plugin,
    check_model_plugin,
    check_optimizer_plugin,
    check_schedule_plugin,
)

BAD = """
import random

import torch
from torch import nn
from sweeper.plugin import DataSplits


def wrong_shape(*, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes + 1))


class Opaque(nn.Module):  # trains fine; like a custom kernel, it cannot run as TorchScript
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)

    def forward(self, x):
        if torch.jit.is_scripting() or torch.jit.is_tracing():
            raise RuntimeError("custom kernel has no TorchScript version")
        return self.fc(x.flatten(1))


def unscriptable(*, input_shape, num_classes):
    return Opaque(input_shape[0] * input_shape[1] * input_shape[2], num_classes)


def unseeded(*, n: int = 32):  # draws from the global generator: a different split every call
    x = torch.randn(2 * n, 2)
    y = torch.randint(0, 2, (2 * n,))
    return DataSplits(train_x=x[:n], train_y=y[:n], val_x=x[n:], val_y=y[n:], num_classes=2)


class Frozen(torch.optim.SGD):  # never moves a parameter
    def step(self, closure=None):
        return None


def frozen(params, *, lr: float = 0.1):
    return Frozen(params, lr=lr)


def overshoot(optimizer, *, epochs, steps_per_epoch):  # a linear decay that reaches 0 halfway, then goes negative
    total = epochs * steps_per_epoch
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - 2 * step / total)


def short_cycle(optimizer, *, epochs, steps_per_epoch):  # one epoch short: OneCycleLR raises past its last step
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, epochs=epochs - 1, steps_per_epoch=steps_per_epoch)


def settings(optimizer, *, epochs, steps_per_epoch):  # a description of a schedule, not a scheduler
    return {"type": "cosine", "epochs": epochs}


class Jittered(torch.optim.lr_scheduler.LRScheduler):  # its state holds a random.Random
    def __init__(self, optimizer):
        self.rng = random.Random(0)
        super().__init__(optimizer)

    def get_lr(self):
        return [base * (1 + 0.1 * self.rng.random()) for base in self.base_lrs]


def jittered(optimizer, *, epochs, steps_per_epoch):
    return Jittered(optimizer)
"""


@pytest.fixture
def bad(site: Path) -> None:
    make_dist(
        site,
        "bad-plugins",
        "0.0.1",
        {
            "sweeper.models": {"wrong_shape": "bad_plugins:wrong_shape", "unscriptable": "bad_plugins:unscriptable"},
            "sweeper.datasets": {"unseeded": "bad_plugins:unseeded"},
            "sweeper.optimizers": {"frozen": "bad_plugins:frozen"},
            "sweeper.schedules": {
                name: f"bad_plugins:{name}" for name in ("overshoot", "short_cycle", "settings", "jittered")
            },
        },
        {"bad_plugins.py": BAD},
    )
    registry.refresh()


def test_builtins_conform():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginExportWarning)
        report = check_model_plugin("cnn", input_shape=(1, 8, 8), num_classes=4)
    assert report.distribution == "sweeper"
    assert report.warnings == []
    assert "exports to TorchScript (reloaded, same outputs)" in report.passed
    assert "exports to ONNX (reloaded, same outputs)" in report.passed
    assert "same seed, same outputs (train mode)" in report.passed
    check_model_plugin("mlp", args={"dropout": 0.5}, export=False)  # dropout under a seed is deterministic
    assert "same seed (0), same splits" in check_dataset_plugin("synthetic", args={"num_train": 64}).passed
    assert "resumes identically from state_dict (checkpoints)" in check_optimizer_plugin("adamw").passed


def test_a_dataset_returning_dataset_splits_conforms():
    """The DataLoader path's contract: the built-in padded sequences pass the data set checks."""
    report = check_dataset_plugin("sequences", args={"num_train": 32, "num_val": 16})
    assert {
        "train holds as many samples as train_y (int64, (N,), N > 0) has rows",
        "padded val batches are (N, ..., L) with L at most sample_shape[-1]",
        "the mask of a padded train batch is bool (N, L)",
        "train's collated targets are train_y's, in order",
        "same seed (0), same splits",
    } <= set(report.passed)


def test_wrong_output_shape_fails(bad):
    with pytest.raises(
        AssertionError,
        match=r"model plugin 'wrong_shape' \(distribution bad-plugins 0\.0\.1\): "
        r"maps a batch .* to logits of shape \(4, 10\): got \(4, 11\)",
    ):
        check_model_plugin("wrong_shape")


def test_export_failure_is_a_warning_not_a_failure(bad):
    with pytest.warns(PluginExportWarning, match="'unscriptable' .*does not export to TorchScript"):
        report = check_model_plugin("unscriptable")
    assert any("TorchScript" in w for w in report.warnings)
    assert "gradients are finite" in report.passed


def test_unseeded_dataset_fails(bad):
    with pytest.raises(AssertionError, match=r"dataset plugin 'unseeded' .*same seed \(0\), same splits"):
        check_dataset_plugin("unseeded")


def test_optimizer_that_does_not_move_fails(bad):
    with pytest.raises(AssertionError, match=r"optimizer plugin 'frozen' .*20 steps lower the loss"):
        check_optimizer_plugin("frozen")


def test_args_are_bound_like_a_spec(bad):
    from sweeper.errors import UserError

    with pytest.raises(UserError, match=r"optimizer.args.lrr: optimizer plugin 'frozen' .*did you mean 'lr'"):
        check_optimizer_plugin("frozen", args={"lrr": 0.1})


@pytest.mark.parametrize(
    "name, args",
    [
        ("none", {}),
        ("onecycle", {}),
        ("onecycle", {"cycle_momentum": True}),  # cycles the SGD momentum the check builds with
        ("cosine", {}),  # ends at min_lr 0 after the last step: allowed
        ("cosine", {"warmup_epochs": 1.5}),
        ("step", {"step_epochs": 2}),
        ("plateau", {"patience": 1}),  # once per epoch, on the metric: cuts the LR twice in 6 epochs
    ],
)
def test_builtin_schedules_conform(name, args):
    report = check_schedule_plugin(name, args=args)
    assert report.distribution == "sweeper"
    if name == "none":
        assert report.passed[-1] == "returns None: a constant LR"
        return
    how = "step(metric) once per epoch" if name == "plateau" else "step() once per optimizer step"
    assert report.passed[1:] == [
        "returns a torch.optim.lr_scheduler.LRScheduler",
        f"takes {how} for 6 epochs of 8 steps",
        "every group's LR is finite and positive at every optimizer step",
        "the LRs after the last step are finite and not negative",
        "resumes the same LR curve from state_dict after epoch 3 (checkpoints)",
    ]


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "overshoot",
            r"every group's LR is finite and positive at every optimizer step: group 0 at epoch 4, step 1: lr 0;",
        ),
        (
            "short_cycle",
            r"takes step\(\) once per optimizer step for 6 epochs of 8 steps: epoch 6, step 1: ValueError: Tried",
        ),
        ("settings", r"returns a torch\.optim\.lr_scheduler\.LRScheduler or None: got dict"),
        (
            "jittered",
            r"its state_dict saves and loads as a checkpoint does \(torch\.load weights_only\): it holds a "
            r"random\.Random, which a weights_only load refuses",
        ),
    ],
)
def test_broken_schedule_fails(bad, name, message):
    with pytest.raises(
        AssertionError, match=rf"^schedule plugin '{name}' \(distribution bad-plugins 0\.0\.1\): {message}"
    ):
        check_schedule_plugin(name)
