"""Speed on CUDA without a GPU to hand: what each CUDA choice is made of is checked on the CPU
(channels_last for conv models only, fused optimizers where torch has them, optimizer state in
its parameter's layout after a resume, compiled forwards shared by the trials of an
architecture). tests/test_gpu.py runs the same paths on a GPU where one exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import config, learned

from sweeper.pluginhost import registry
from sweeper.trial import checkpoint, speed
from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
from sweeper.trial.execute import execute

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU


def _model(name: str, **args):
    return registry.get("models", name)(input_shape=(3, 32, 32), num_classes=10, **args)


def test_channels_last_for_convolutional_models_on_cuda_only():
    cnn, mlp = _model("cnn"), _model("mlp")
    assert speed.channels_last(cnn, CUDA) and speed.channels_last(_model("resnet18", width=8), CUDA)
    assert not speed.channels_last(mlp, CUDA)  # nothing to gain without a 2-D convolution
    assert not speed.channels_last(cnn, CPU)  # CPU runs stay as they were (bitwise tests compare them)
    cnn.sweeper_channels_last = False  # a plugin's opt-out
    assert not speed.channels_last(cnn, CUDA)

    laid_out = speed.to_memory_format(_model("cnn"), CUDA)  # the layout change itself works anywhere
    conv = laid_out[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    x = speed.as_input(torch.randn(2, 3, 32, 32), True)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert speed.as_input(torch.randn(2, 12), True).is_contiguous()  # not an image batch: unchanged


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_fused_optimizer_kernels_on_cuda_unless_the_spec_chose(name):
    factory = registry.get("optimizers", name)
    assert speed.optimizer_args(factory, {"lr": 0.1}, CUDA) == {"lr": 0.1, "fused": True}
    assert speed.optimizer_args(factory, {"lr": 0.1}, CPU) == {"lr": 0.1}
    for chosen in ({"foreach": True}, {"fused": False}, {"differentiable": True}):
        assert speed.optimizer_args(factory, {"lr": 0.1, **chosen}, CUDA) == {"lr": 0.1, **chosen}

    def plain_sgd(params, *, lr: float = 0.1):  # a plugin optimizer without a fused variant
        return torch.optim.SGD(params, lr=lr)

    assert speed.optimizer_args(plain_sgd, {"lr": 0.1}, CUDA) == {"lr": 0.1}


def test_a_resumed_optimizer_keeps_its_buffers_in_the_parameters_layout():
    """A state saved from an NCHW model (on a CPU) resumed into a channels_last one (on CUDA):
    momentum buffers take the parameter's layout (fused kernels want them alike)."""

    def parts(layout: torch.memory_format):
        torch.manual_seed(0)
        model = _model("cnn", channels=4, blocks=1).to(memory_format=layout)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, opt = parts(torch.contiguous_format)
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    opt.step()
    state = checkpoint.capture(
        model=model,
        optimizer=opt,
        scheduler=None,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        generators={},
        epoch=1,
        history=[],
        base_lrs=[0.1],
    )
    resumed, resumed_opt = parts(torch.channels_last)
    checkpoint.restore(
        checkpoint.Resume(state),
        model=resumed,
        optimizer=resumed_opt,
        scheduler=None,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        generators={},
    )
    conv = resumed[0].weight
    buffer = resumed_opt.state[conv]["momentum_buffer"]
    assert conv.is_contiguous(memory_format=torch.channels_last) and buffer.stride() == conv.stride()
    assert torch.equal(buffer, opt.state[model[0].weight]["momentum_buffer"])  # same values


@pytest.fixture
def cheap_compile(monkeypatch: pytest.MonkeyPatch):
    """torch.compile with the aot_eager backend (the same graph capture, no code generation:
    inductor's C++ build takes about a minute on 2 cores)."""
    monkeypatch.setattr(speed, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_trials_of_one_architecture_share_one_compiled_forward(cheap_compile: None, tmp_path: Path):
    from torch._dynamo.utils import counters

    cache = ProcessCache()  # what a worker process keeps between its trials
    base = config("train.compile=true", "train.epochs=2", "schedule.plugin=none")
    first = run_trial(base, lambda e, m: None, CPU, cache=cache)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # training and evaluation (the last, shorter batches each add one)
    again = TrialConfig(1, 7, {}, base.spec, checkpoint=str(tmp_path / "1.pt"))
    (outcome,) = execute([again], lambda *a: False, cache=cache)  # another trial, its own weights: nothing compiled
    assert outcome.state == "complete" and counters["stats"]["unique_graphs"] == graphs
    assert len(cache.compiled) == 1

    eager = run_trial(config("train.epochs=2", "schedule.plugin=none"), lambda e, m: None, CPU)
    for c, e in zip(learned(first.history), learned(eager.history)):
        assert c == pytest.approx(e, rel=1e-4, abs=1e-6)  # the same training, compiled
    # the checkpoint holds the plain model's state: export and replay rebuild it without compile
    saved = checkpoint.load(tmp_path / "1.pt")["model"]
    assert set(saved) == set(first.model.state_dict())

    wider = config("train.compile=true", "train.epochs=1", "model.args.hidden=64")
    run_trial(wider, lambda e, m: None, CPU, cache=cache)
    assert len(cache.compiled) == 2  # another architecture, another compiled forward
