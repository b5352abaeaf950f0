"""GPU-only: the CUDA paths of a trial, on a real GPU. Marked ``gpu`` and skipped where CUDA is
absent (conftest.py); docs/gpu.md lists them. benchmarks/gpu_check.py measures what these check."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import SPACES, learned, write_tiny_cifar

from sweeper.spec import load
from sweeper.trial import checkpoint
from sweeper.trial.build import TrialConfig, run_trial
from sweeper.trial.execute import execute

pytestmark = pytest.mark.gpu
GPU = torch.device("cuda", 0)


def _cifar(tmp_path: Path, *overrides: str) -> TrialConfig:
    write_tiny_cifar(tmp_path / "cifar", per_batch=200)  # 1,000 images
    spec = load(
        SPACES / "cifar.yaml",
        [
            f"dataset.args.root={tmp_path / 'cifar'}",
            "dataset.args.download=false",
            "model.args.width=16",
            "train.epochs=2",
            "train.batch_size=128",
            "train.device=cuda",
            *overrides,
        ],
    )
    return TrialConfig(0, 1, {}, spec, checkpoint=str(tmp_path / "0.pt"))


def test_a_cifar_trial_on_cuda_takes_the_fast_paths(tmp_path: Path):
    seen: dict[str, object] = {}

    def look(parts) -> None:
        seen.update(data=parts.data, model=parts.model, optimizer=parts.optimizer)

    trained = run_trial(_cifar(tmp_path), lambda e, m: None, GPU, before_fit=look)
    data, conv = seen["data"], seen["model"][0]
    assert data.train_x.device.type == "cuda" and data.train_x.dtype == torch.uint8  # pixels on the GPU
    assert conv.weight.is_cuda and conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert seen["optimizer"].defaults["fused"] is True  # one kernel per step
    last = trained.history[-1]
    assert all(math.isfinite(last[k]) for k in ("train_loss", "val_loss")) and last["gpu_mem_peak_mb"] > 0


@pytest.mark.parametrize("implementation, step_device", [("foreach", "cpu"), ("fused", "cuda")])
def test_a_resumed_adamw_keeps_its_step_counters_where_it_wants_them(
    tmp_path: Path, implementation: str, step_device: str
):
    """A checkpoint is loaded on the CPU, then into the optimizer: non-fused AdamW keeps its step
    counters on the CPU (on the GPU each step would sync to read them), fused AdamW on the GPU."""
    args = f"optimizer={{plugin: adamw, args: {{lr: 0.001, {implementation}: true}}}}"
    first = _cifar(tmp_path, args, "train.epochs=1")
    execute([first], lambda *a: False)
    resumed = TrialConfig(0, 1, {}, first.spec.with_values({"train.epochs": 2}), resume=first.checkpoint)
    seen = {}

    def report(epoch: int, metrics: dict[str, float]) -> None:
        seen["steps"] = {s["step"].device.type for s in seen["optimizer"].state.values()}

    run_trial(
        resumed,
        report,
        GPU,
        before_fit=lambda parts: seen.update(optimizer=parts.optimizer),
        resume=checkpoint.Resume(checkpoint.load(Path(first.checkpoint))),
    )
    assert seen["steps"] == {step_device}


def test_deterministic_mode_is_bitwise_on_cuda(tmp_path: Path):
    from sweeper.trial.seeding import configure_torch

    threads = torch.get_num_threads()
    configure_torch(threads=threads, deterministic=True)
    try:
        a = run_trial(_cifar(tmp_path, "train.deterministic=true"), lambda e, m: None, GPU)
        b = run_trial(_cifar(tmp_path, "train.deterministic=true"), lambda e, m: None, GPU)
    finally:
        configure_torch(threads=threads, deterministic=False)
    assert learned(a.history) == learned(b.history)


def test_a_fused_member_reports_what_a_solo_trial_reports_on_cuda():
    """One end of an epoch (trial/epoch.py close_epoch): a fused member's epochs carry
    the solo trial's metrics, the device's peak memory (the group's) included."""
    from conftest import config

    from sweeper.trial.fused import fit_fused

    configs = [
        TrialConfig(k, 10 + k, {}, config("train.epochs=2", "train.device=cuda", "train.precision=fp32").spec)
        for k in range(2)
    ]
    members = fit_fused(configs, GPU, lambda k, epoch, metrics: None)
    solo = run_trial(configs[0], lambda epoch, metrics: None, GPU)
    assert [m.state for m in members] == ["complete"] * 2
    assert all(list(h) == list(solo.history[0]) for m in members for h in m.history)
    assert all(h["gpu_mem_peak_mb"] > 0 for m in members for h in m.history)
