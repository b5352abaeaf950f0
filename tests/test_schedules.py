"""Schedules own the learning rate and nothing else: the optimizer keeps the momentum and betas
a trial was given (fixed or searched) with every built-in schedule, and the dry build warns
when a schedule (or an optimizer plugin) overrides one of them."""

from __future__ import annotations

import pytest
import torch
from conftest import SPACES, sweeper

from sweeper.plan.preflight import dry_build
from sweeper.pluginhost import registry
from sweeper.spec import load

BUILT_IN = sorted(p.name for p in registry.list_plugins("schedules") if p.distribution == "sweeper")
STEPS = 8  # optimizer steps: the whole schedule (2 epochs x 4 steps): one-cycle's warm-up and decay


@pytest.mark.parametrize("schedule", BUILT_IN)
@pytest.mark.parametrize(
    "optimizer, args, key, value",
    [
        ("sgd", {"lr": 0.1, "momentum": 0.8}, "momentum", 0.8),
        ("adamw", {"lr": 0.01, "betas": [0.7, 0.98]}, "betas", (0.7, 0.98)),
    ],
)
def test_every_built_in_schedule_leaves_momentum_and_betas_alone(
    schedule: str, optimizer: str, args: dict, key: str, value: object
):
    model = torch.nn.Linear(4, 2)
    opt = registry.get("optimizers", optimizer)(model.parameters(), **args)
    sched = registry.get("schedules", schedule)(opt, epochs=2, steps_per_epoch=4)
    for _ in range(STEPS):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            sched.step(1.0)
        elif sched is not None:
            sched.step()
        assert tuple(opt.param_groups[0][key]) == value if key == "betas" else opt.param_groups[0][key] == value


def test_a_schedule_that_overrides_a_searched_momentum_is_warned_about(workdir):
    overrides = [
        "optimizer={plugin: sgd, args: {lr: 0.1}}",
        "schedule={plugin: onecycle, args: {cycle_momentum: true}}",
        "search.space={optimizer.args.momentum: {type: float, low: 0.8, high: 0.99}}",
    ]
    (warning,) = dry_build(load(SPACES / "smoke.yaml", overrides)).warnings
    assert warning.startswith("schedule plugin 'onecycle' changes the optimizer's momentum from 0.8 to ")
    assert "optimizer.args.momentum gives (fixed or searched) has no effect" in warning
    assert dry_build(load(SPACES / "smoke.yaml", overrides[:1] + ["schedule={plugin: onecycle}"])).warnings == []
    shown = sweeper("validate", str(SPACES / "smoke.yaml"), *overrides, check=True)
    assert "warning: schedule plugin 'onecycle' changes the optimizer's momentum" in " ".join(shown.stderr.split())
