"""Fused trials (sweeper/trial/fused.py): members trained as one model match their solo runs,
leave alone when pruned, fail alone when their loss is not finite; what cannot be fused says why."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from conftest import SPACES, config, learned
from torch import nn
from torch.nn import functional as F

from sweeper.errors import TrialPruned
from sweeper.spec import load
from sweeper.trial import fused_forward
from sweeper.trial.build import TrialConfig, run_trial
from sweeper.trial.fused import fit_fused, why_not_fused
from sweeper.trial.fused_optim import why_not_stacked

CPU = torch.device("cpu")
# fp32 on the CPU: the largest relative difference between a fused member's per-epoch metrics and
# its solo run's (measured: 2.2e-7 for the MLP, 1.7e-7 for the CNN with BatchNorm, 3 epochs)
TOLERANCE = 1e-5
CNN = "model={plugin: cnn, args: {channels: 4, blocks: 1}}"


def member(number: int, *overrides: str) -> TrialConfig:
    base = config("train.epochs=3", *overrides, seed=10 + number)
    return TrialConfig(number, base.seed, {}, base.spec)


def mixed(*common: str) -> list[TrialConfig]:
    """Three members that differ in every per-member setting: optimizer, its settings, schedule,
    label smoothing, gradient clipping, seed."""
    return [
        member(
            0,
            *common,
            "optimizer={plugin: sgd, args: {lr: 0.05, momentum: 0.9, nesterov: true}}",
            "train.label_smoothing=0.1",
            "train.grad_clip=1.0",
        ),
        member(1, *common, "optimizer={plugin: adamw, args: {lr: 0.003, weight_decay: 0.01}}"),
        member(
            2, *common, "optimizer={plugin: adam, args: {lr: 0.01, betas: [0.8, 0.99]}}", "schedule.plugin=onecycle"
        ),
    ]


def assert_matches_solo(config: TrialConfig, history: list[dict[str, float]]) -> None:
    solo = run_trial(config, lambda epoch, metrics: None, CPU)
    assert len(history) == len(solo.history)
    assert [list(h) for h in history] == [list(h) for h in solo.history]  # one builder: the same metrics
    for fused_epoch, solo_epoch in zip(learned(history), learned(solo.history)):
        for key, value in solo_epoch.items():
            assert fused_epoch[key] == pytest.approx(value, rel=TOLERANCE, abs=1e-12), (config.number, key)


@pytest.mark.parametrize("engine", ["layered", "vmap"])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_each_fused_member_trains_as_its_solo_run(model: str, engine: str):
    configs = mixed(*([CNN] if model == "cnn" else []))
    seen: list[tuple[int, int]] = []
    members = fit_fused(configs, CPU, lambda k, epoch, metrics: seen.append((k, epoch)), layered=engine == "layered")
    assert [m.state for m in members] == ["complete"] * 3
    assert {m.engine for m in members} == {engine}
    assert seen == [(k, e) for e in (1, 2, 3) for k in range(3)]  # every member reports every epoch
    for member_config, fused in zip(configs, members):
        assert_matches_solo(member_config, fused.history)
    # each member's model holds its own weights afterwards (not views of the fused tensors)
    weights = [next(m.parts.model.parameters()) for m in members]
    assert weights[0].untyped_storage().data_ptr() != weights[1].untyped_storage().data_ptr()


def task_member(number: int, base: str, *overrides: str) -> TrialConfig:
    """A member of search_spaces/<base>.yaml (its task, data set and MLP), cut to 3 short epochs."""
    spec = load(SPACES / f"{base}.yaml", ["train.epochs=3", "model.args.hidden=16", *overrides])
    return TrialConfig(number, 10 + number, {}, spec)


# members of every built-in task, each with its own task arguments (its loss is its task's)
TASKS = {
    "regression": [
        task_member(0, "diabetes", "task.args.loss=mse"),
        task_member(1, "diabetes", "task.args.loss=huber", "optimizer.args.lr=0.01"),
        task_member(2, "diabetes", "task.args.loss=l1", "train.grad_clip=1.0"),
    ],
    "multilabel": [
        task_member(0, "multilabel"),
        task_member(1, "multilabel", "optimizer.args.lr=0.01", "task.args.threshold=0.3"),
        task_member(2, "multilabel", "train.grad_clip=0.5"),
    ],
    "weighted classification": [
        member(0, "task={plugin: classification, args: {class_weights: balanced}}"),
        member(1, "task={plugin: classification, args: {class_weights: [1.0, 2.0, 1.0]}}"),
        member(2, "task={plugin: classification, args: {label_smoothing: 0.1}}"),
    ],
}


@pytest.mark.parametrize("engine", ["layered", "vmap"])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_fused_members_of_every_task_train_as_their_solo_runs(task: str, engine: str):
    configs = TASKS[task]
    members = fit_fused(configs, CPU, lambda k, epoch, metrics: None, layered=engine == "layered")
    assert [m.state for m in members] == ["complete"] * 3 and {m.engine for m in members} == {engine}
    for member_config, fused in zip(configs, members):
        assert_matches_solo(member_config, fused.history)  # the task's own metrics: val_rmse, val_map, ...
    assert why_not_fused(configs) is None


# members sharing one of torch's optimizers: stepped as one (sweeper/trial/fused_optim.py), each
# with its own settings, clipping and schedule
SHARED_OPTIMIZER = {
    "adamw": [
        member(0, CNN, "optimizer={plugin: adamw, args: {lr: 0.003, weight_decay: 0.01}}", "train.grad_clip=0.5"),
        member(
            1,
            CNN,
            "optimizer={plugin: adamw, args: {lr: 0.01, weight_decay: 0.0, betas: [0.8, 0.99]}}",
            "schedule.plugin=onecycle",
        ),
        member(2, CNN, "optimizer={plugin: adamw, args: {lr: 0.001, eps: 1.0e-6}}", "train.label_smoothing=0.1"),
    ],
    "sgd": [
        member(0, CNN, "optimizer={plugin: sgd, args: {lr: 0.05}}"),
        member(
            1,
            CNN,
            "optimizer={plugin: sgd, args: {lr: 0.02, momentum: 0.9, weight_decay: 0.001}}",
            "train.grad_clip=1.0",
        ),
        member(
            2,
            CNN,
            "optimizer={plugin: sgd, args: {lr: 0.05, momentum: 0.8, nesterov: true}}",
            "schedule.plugin=onecycle",
        ),
    ],
    "adam": [
        member(0, "optimizer={plugin: adam, args: {lr: 0.01, weight_decay: 0.001}}"),
        member(1, "optimizer={plugin: adam, args: {lr: 0.003}}"),
    ],
}


@pytest.mark.parametrize("optimizer", sorted(SHARED_OPTIMIZER))
def test_members_of_one_optimizer_step_as_one_and_match_their_solo_runs(optimizer: str):
    configs = SHARED_OPTIMIZER[optimizer]
    members = fit_fused(configs, CPU, lambda k, epoch, metrics: None)
    assert why_not_stacked([m.parts.optimizer for m in members]) is None  # the stacked update ran
    for trial, fused in zip(configs, members):
        assert_matches_solo(trial, fused.history)
        # its optimizer holds the state its solo run's holds (a member's checkpoint resumes solo)
        solo = run_trial(trial, lambda epoch, metrics: None, CPU).optimizer.state_dict()["state"]
        state = fused.parts.optimizer.state_dict()["state"]
        assert state.keys() == solo.keys()
        for index, buffers in solo.items():
            for key, value in buffers.items():
                if value is None:
                    assert state[index][key] is None
                else:
                    torch.testing.assert_close(state[index][key], value, rtol=1e-4, atol=1e-6)


def test_a_pruned_member_leaves_and_the_others_go_on_unchanged():
    configs = mixed(CNN)

    def report(k: int, epoch: int, metrics: dict[str, float]) -> None:
        if k == 1 and epoch == 1:
            raise TrialPruned("pruned at epoch 1")

    members = fit_fused(configs, CPU, report)
    assert [m.state for m in members] == ["complete", "pruned", "complete"]
    assert len(members[1].history) == 1 and members[1].reason == "pruned at epoch 1"
    assert_matches_solo(configs[0], members[0].history)
    assert_matches_solo(configs[2], members[2].history)


@pytest.mark.parametrize("optimizers", ["mixed", "one"])
def test_a_member_whose_loss_is_not_finite_fails_alone(optimizers: str):
    configs = (
        mixed()
        if optimizers == "mixed"
        else [member(k, f"optimizer.args.lr={lr}") for k, lr in enumerate((0.01, 0.02, 0.003))]
    )
    configs[1] = member(
        1, f"optimizer={{plugin: {configs[1].spec.optimizer.plugin}, args: {{lr: 1.0e+30}}}}"
    )  # diverges
    members = fit_fused(configs, CPU, lambda k, epoch, metrics: None)
    assert [m.state for m in members] == ["complete", "failed", "complete"]
    assert members[1].reason.startswith("non-finite loss at epoch 1") and members[1].history == []
    assert_matches_solo(configs[0], members[0].history)
    assert_matches_solo(configs[2], members[2].history)


def test_what_cannot_be_fused_says_why():
    assert why_not_fused(mixed()) is None
    assert "train.batch_size differs" in why_not_fused([member(0), member(1, "train.batch_size=16")])
    assert "the model differs" in why_not_fused([member(0), member(1, "model.args.hidden=64")])
    assert "train.compile" in why_not_fused([member(0, "train.compile=true"), member(1, "train.compile=true")])
    assert "fp16 needs a loss scaler" in why_not_fused([member(0, "train.precision=fp16")])
    with pytest.raises(ValueError, match="cannot be fused: train.epochs differs"):
        fit_fused([member(0), member(1, "train.epochs=2")], CPU, lambda *a: None)


class Residual(nn.Module):
    """A forward of its own (a skip connection) over layers that all have a layered form."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.BatchNorm2d(4))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(torch.relu(self.body(h) + h))


class MixesChannels(Residual):
    """Its forward looks across channels: in the layered layout it would mix the members."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.stem(x))
        return self.head(h - h.mean(1, keepdim=True))


@pytest.mark.parametrize("model, kind", [(Residual, "layered"), (MixesChannels, "vmap")])
def test_the_layered_layout_is_used_where_it_equals_vmap_and_gives_each_member_its_own_numbers(model, kind):
    torch.manual_seed(0)
    models = [model() for _ in range(3)]
    params = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
        for n, _ in models[0].named_parameters()
    }
    buffers = {n: torch.stack([dict(m.named_buffers())[n] for m in models]) for n, _ in models[0].named_buffers()}
    x = torch.randn(8, 1, 6, 6)
    chosen = fused_forward.engine(copy.deepcopy(models[0]).to("meta"), params, buffers, x, contextlib.nullcontext)
    assert chosen.kind == kind
    predicted = chosen.predict(params, buffers, x)
    xs, ys = torch.randn(3, 8, 1, 6, 6), torch.randint(0, 3, (3, 8))

    def losses(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # each member's own loss
        return torch.stack([F.cross_entropy(out[k], y[k]) for k in range(len(out))])

    grads, loss, outputs = chosen.step(params, buffers, xs, ys, losses, 1.0)
    for k, solo in enumerate(models):  # each member's numbers are its own model's
        torch.testing.assert_close(predicted[k], solo.eval()(x), rtol=1e-4, atol=1e-6)
        solo.train()
        out = solo(xs[k])
        solo_loss = F.cross_entropy(out, ys[k])
        solo_loss.backward()
        assert loss[k].item() == pytest.approx(solo_loss.item(), rel=1e-5)
        torch.testing.assert_close(outputs[k], out.detach(), rtol=1e-4, atol=1e-6)
        for name, param in solo.named_parameters():
            torch.testing.assert_close(grads[name][k], param.grad, rtol=1e-4, atol=1e-6)
        for name, buffer in solo.named_buffers():  # BatchNorm's running statistics, updated per member
            torch.testing.assert_close(buffers[name][k], buffer, rtol=1e-4, atol=1e-6)
