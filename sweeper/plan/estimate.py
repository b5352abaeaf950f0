"""A budget before the sweep (`sweeper validate --estimate`): a few optimizer steps and one
evaluation of the base configuration (the spec as written, before any search value), timed on
the device and with the threads a trial gets, extrapolated to a trial and bounded for the sweep.

The base configuration stands for every trial: a search space that changes the model's size or
the batch size makes trials faster or slower than it. The bound assumes no trial is pruned and
the workers run side by side (search.parallel, or Ray's concurrent trials); search.timeout caps it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.spec import SweepSpec
from sweeper.trial.batching import train_batches
from sweeper.trial.build import DataCache, build_model, build_optimizer, build_task, load_data
from sweeper.trial.loading import Batch, LoaderSettings, TrialLoaders, first_batch
from sweeper.trial.seeding import configure_torch, threads_per_trial
from sweeper.trial.trainer import Stepper, evaluate, resolve_device

WARMUP_STEPS = 2  # untimed: the first steps allocate (and on CUDA, pick kernels)
TIMED_STEPS = 8


@dataclass(frozen=True)
class Estimate:
    device: str
    threads: int
    step_s: float  # one optimizer step of train.batch_size samples
    eval_s: float  # one pass over the validation split
    steps_per_epoch: int
    epochs: int
    trials: int | None  # search.n_trials (None: until the timeout)
    workers: int  # trials side by side
    timeout_s: float | None
    data_path: str = "tensors (whole splits on the device)"  # how trials read the data (trial/loading.py)
    # bytes of both splits held whole on the device (samples as stored, and targets): what the
    # tensor path holds, or would hold for a DatasetSplits (from its first sample's size)
    tensor_bytes: int | None = None

    @property
    def trial_s(self) -> float:
        return self.epochs * (self.steps_per_epoch * self.step_s + self.eval_s)

    @property
    def sweep_bound_s(self) -> float | None:
        """The sweep's time if no trial were pruned (None: no budget but a missing timeout)."""
        bound = None if self.trials is None else math.ceil(self.trials / self.workers) * self.trial_s
        if self.timeout_s is not None:
            bound = self.timeout_s if bound is None else min(bound, self.timeout_s)
        return bound

    def describe(self) -> str:
        """What `sweeper validate --estimate` prints (comment lines, like the rest of its output)."""
        bound = self.sweep_bound_s
        trials = "until the timeout" if self.trials is None else f"{self.trials} trials"
        lines = [
            f"# estimate on {self.device} ({self.threads} thread(s) a trial): {self.step_s * 1000:.1f} ms a step, "
            f"{self.eval_s * 1000:.1f} ms an evaluation, {self.steps_per_epoch} steps an epoch",
            f"# data path: {self.data_path}" + ("" if self.tensor_bytes is None else f"; {self._held()}"),
            f"# a trial: {_duration(self.trial_s)} ({self.epochs} epochs)",
            f"# the sweep ({trials}, {self.workers} side by side): at most "
            + (_duration(bound) if bound is not None else "unbounded")
            + (" (search.timeout)" if self.timeout_s is not None and bound == self.timeout_s else "")
            + "; pruned trials make it shorter",
        ]
        return "\n".join(lines)

    def _held(self) -> str:
        size = _bytes(self.tensor_bytes or 0)
        if self.data_path.startswith("tensors"):
            return f"the splits hold {size} on {self.device}"
        return f"the tensor path would hold {size} on {self.device}"


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def tensor_bytes(data: DataSplits | DatasetSplits) -> int:
    """Bytes of both splits as whole tensors: the samples as stored and the targets. For a
    DatasetSplits, every sample the size of its first one as collated (variable lengths: the
    longest, ``sample_shape``)."""
    targets = data.train_y.nbytes + data.val_y.nbytes
    if isinstance(data, DataSplits):
        return data.train_x.nbytes + data.val_x.nbytes + targets
    first = first_batch(data, "train", 1).x
    per_sample = math.prod(data.sample_shape) * first.element_size()
    return (len(data.train_y) + len(data.val_y)) * per_sample + targets


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def estimate(spec: SweepSpec, cache: DataCache | None = None) -> Estimate:
    """Time the base configuration of ``spec`` (its data set from ``cache`` when it holds it)."""
    threads = threads_per_trial(spec)
    device = resolve_device(spec.train.device)
    if device.type == "cpu":
        configure_torch(threads=threads, deterministic=spec.train.deterministic)
    data, _ = load_data(spec, device, cache)
    torch.manual_seed(spec.seed)
    task = build_task(spec, data)
    model = build_model(spec, data, task).to(device)
    optimizer = build_optimizer(spec, model)
    stepper = Stepper(model, optimizer, data, spec.train, spec.seed, task)
    loaders = None
    if isinstance(data, DataSplits):
        path = "tensors (whole splits on the device)"
    else:
        settings = LoaderSettings.resolve(spec.data, device, threads)
        path = settings.describe()
        loaders = TrialLoaders(
            data,
            settings,
            batch_size=spec.train.batch_size,
            eval_batch_size=spec.train.eval_batch_size,
            order=torch.Generator().manual_seed(spec.seed),
            seed=spec.seed,
            device=device,
        )
    try:
        step_s, eval_s = _time(spec, model, data, stepper, loaders, device)
    finally:
        if loaders is not None:
            loaders.close()
    steps_per_epoch = math.ceil(data.train_y.shape[0] / spec.train.batch_size)
    search = spec.search
    workers = search.parallel if search.backend == "optuna" else (search.ray.max_concurrent_trials or 1)
    return Estimate(
        str(device),
        threads,
        step_s,
        eval_s,
        steps_per_epoch,
        spec.train.epochs,
        search.n_trials,
        workers,
        search.timeout,
        path,
        tensor_bytes(data),
    )


def _time(
    spec: SweepSpec,
    model: torch.nn.Module,
    data: DataSplits | DatasetSplits,
    stepper: Stepper,
    loaders: TrialLoaders | None,
    device: torch.device,
) -> tuple[float, float]:
    """(seconds of one optimizer step, seconds of one evaluation), timed after warm-up steps."""

    def epoch(seed: int) -> Iterator[torch.Tensor | Batch]:
        if loaders is not None:
            return loaders.train_epoch()
        assert isinstance(data, DataSplits)
        return train_batches(data, spec.train.batch_size, torch.Generator().manual_seed(seed))

    batches = epoch(spec.seed)
    model.train()
    timed, started = 0, 0.0
    for i in range(WARMUP_STEPS + TIMED_STEPS):
        if i == WARMUP_STEPS:
            _sync(device)
            started = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:  # a small data set: the next epoch's order
            batches = epoch(spec.seed + i)
            batch = next(batches)
        stepper.step(batch)
        timed += i >= WARMUP_STEPS
    _sync(device)
    step_s = (time.perf_counter() - started) / timed
    started = time.perf_counter()
    evaluate(model, data, spec.train.eval_batch_size, stepper.dtype, stepper.task, loaders)
    _sync(device)
    return step_s, time.perf_counter() - started


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
