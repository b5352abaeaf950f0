"""Conformance checks a plugin author runs in their own test suite::

    from sweeper.testing import check_model_plugin

    def test_my_model_conforms():
        check_model_plugin("my_model")

Each check finds the plugin through its entry point (so the registration is tested too),
binds ``args`` to its signature as a spec would, builds it with its defaults plus ``args``,
and raises ``AssertionError`` naming what broke. Exportability of a model (TorchScript,
ONNX) is reported as a ``PluginExportWarning``: a model that does not export can still be
swept. Each check returns a ``CheckReport``; docs/plugins.md describes the contract.
"""

from __future__ import annotations

import io
import math
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import bind_args

__all__ = [
    "CheckReport",
    "PluginExportWarning",
    "check_dataset_plugin",
    "check_model_plugin",
    "check_optimizer_plugin",
    "check_schedule_plugin",
]


class PluginExportWarning(UserWarning):
    """The model trains but does not export to one format (TorchScript or ONNX)."""


@dataclass
class CheckReport:
    """What a ``check_*_plugin`` call found: the plugin checked (its kind, name, distribution and
    version), each check it passed, in order, and the export problems it warned of."""

    kind: str
    name: str
    distribution: str
    version: str
    passed: list[str] = field(default_factory=list)  # what was checked, in order
    warnings: list[str] = field(default_factory=list)  # export problems (also warned)


def _start(kind: str, name: str, args: dict[str, Any] | None) -> tuple[Callable[..., Any], dict[str, Any], CheckReport]:
    args = dict(args or {})
    factory = registry.get(kind, name)  # import + API-version check
    bind_args(kind, name, args, f"{registry.singular(kind)}.args")
    i = registry.info(kind, name)
    report = CheckReport(kind, name, i.distribution, i.version, passed=["entry point, API version, arguments"])
    return factory, args, report


def _expect(ok: bool, report: CheckReport, what: str, detail: str = "") -> None:
    if not ok:
        _fail(report, what, detail)
    report.passed.append(what)


def _fail(report: CheckReport, what: str, detail: str = "") -> NoReturn:
    raise AssertionError(
        f"{registry.singular(report.kind)} plugin '{report.name}' (distribution "
        f"{report.distribution} {report.version}): {what}{': ' + detail if detail else ''}"
    )


def _same_params(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` saved and loaded the way sweeper.trial.checkpoint does it: torch.save, then a
    weights_only load (tensors and plain containers only)."""
    saved = io.BytesIO()
    torch.save(state, saved)
    saved.seek(0)
    loaded: dict[str, Any] = torch.load(saved, weights_only=True)
    return loaded


# The small problem the optimizer and schedule checks train on: 64 samples of 4 features, 3 classes.


def _toy_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)


def _toy_model(seed: int) -> tuple[nn.Module, list[dict[str, Any]]]:
    """A small classifier initialised under ``seed``, and its parameters as two groups: weights, biases."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return model, [{"params": weights}, {"params": biases}]


def _toy_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step on the whole batch; the loss before it."""
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


# --- models -----------------------------------------------------------------------------------


def check_model_plugin(
    name: str,
    *,
    args: dict[str, Any] | None = None,
    input_shape: tuple[int, ...] = (3, 32, 32),
    num_classes: int = 10,
    batch: int = 4,
    seed: int = 0,
    export: bool = True,
) -> CheckReport:
    """Build the model twice under ``seed``; check a forward/backward step, the output shape
    (batch, num_classes), finite values and gradients, and determinism; then try TorchScript
    and ONNX export (warnings only)."""
    factory, args, report = _start("models", name, args)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return factory(input_shape=tuple(input_shape), num_classes=num_classes, **args)

    model = build()
    _expect(isinstance(model, nn.Module), report, "returns a torch.nn.Module", f"got {type(model).__name__}")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    _expect(bool(trainable), report, "has trainable parameters")

    twin = build()
    _expect(_same_params(model, twin), report, f"same seed ({seed}), same initial parameters and buffers")

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *input_shape, generator=g)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    outputs = []
    for m in (model, twin):
        torch.manual_seed(seed)  # dropout and friends draw from the global generator
        outputs.append(m.train()(x))
    out = outputs[0]
    _expect(
        isinstance(out, torch.Tensor) and tuple(out.shape) == (batch, num_classes),
        report,
        f"maps a batch of shape {(batch, *input_shape)} to logits of shape {(batch, num_classes)}",
        f"got {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}",
    )
    _expect(bool(torch.isfinite(out).all()), report, "outputs finite logits")
    _expect(torch.equal(out, outputs[1]), report, "same seed, same outputs (train mode)")
    nn.functional.cross_entropy(out, y).backward()
    missing = [n for n, p in trainable if p.grad is None]
    _expect(not missing, report, "every trainable parameter gets a gradient", f"none for {', '.join(missing[:5])}")
    bad = [n for n, p in trainable if p.grad is not None and not torch.isfinite(p.grad).all()]
    _expect(not bad, report, "gradients are finite", f"non-finite in {', '.join(bad[:5])}")
    model.zero_grad(set_to_none=True)
    if export:
        _check_exports(model, x, report)
    return report


def _warn(report: CheckReport, message: str) -> None:
    text = f"model plugin '{report.name}' ({report.distribution} {report.version}): {message}"
    report.warnings.append(text)
    warnings.warn(text, PluginExportWarning, stacklevel=4)  # at the caller of check_model_plugin


def _check_exports(model: nn.Module, x: torch.Tensor, report: CheckReport) -> None:
    """Write TorchScript and ONNX with sweeper's own exporters, reload each, compare outputs."""
    from sweeper.export import formats

    model = model.eval().cpu()
    with torch.no_grad():
        expected = model(x).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, write, load in (
            ("TorchScript", formats.torchscript, _run_torchscript),
            ("ONNX", formats.onnx, _run_onnx),
        ):
            path = Path(tmp) / formats.FORMATS[fmt.lower()].file
            try:
                write(model, x, path)
                diff = float(np.abs(load(path, x) - expected).max())
                if diff > 1e-4:
                    raise ValueError(f"reloaded outputs differ by {diff:.3g} (> 1e-4)")
                report.passed.append(f"exports to {fmt} (reloaded, same outputs)")
            except Exception as exc:  # any failure is the plugin's to look at, not a test failure
                _warn(report, f"does not export to {fmt}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def _run_torchscript(path: Path, x: torch.Tensor) -> np.ndarray:
    from sweeper.export.formats import quiet_jit

    with quiet_jit(), torch.no_grad():
        return torch.jit.load(str(path)).eval()(x).numpy()


def _run_onnx(path: Path, x: torch.Tensor) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


# --- datasets ---------------------------------------------------------------------------------


def check_dataset_plugin(name: str, *, args: dict[str, Any] | None = None, seed: int = 0) -> CheckReport:
    """Build the data set twice with ``seed``; check the DataSplits contract (dtypes, shapes,
    label range, finite inputs), determinism, and the batch augmentation if it has one; or the
    DatasetSplits contract (the DataLoader path: _check_dataset_splits)."""
    from sweeper.trial.build import dataset_args

    factory, args, report = _start("datasets", name, args)
    data = factory(**dataset_args(factory, args, seed))
    if isinstance(data, DatasetSplits):
        _check_dataset_splits(data, factory(**dataset_args(factory, args, seed)), seed, report)
        return report
    _expect(
        isinstance(data, DataSplits),
        report,
        "returns sweeper.plugin.DataSplits or DatasetSplits",
        f"got {type(data).__name__}",
    )
    for split in ("train", "val"):
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        x = data.inputs(x)  # the model inputs (input_transform applied)
        _expect(
            x.is_floating_point() and y.dtype == torch.int64,
            report,
            f"{split}_x gives floating-point inputs and {split}_y is int64",
            f"got {x.dtype} and {y.dtype}",
        )
        _expect(
            x.ndim >= 2 and y.ndim == 1 and len(x) == len(y) > 0,
            report,
            f"{split}_x is (N, *input_shape) and {split}_y is (N,) with N > 0",
            f"got {tuple(x.shape)} and {tuple(y.shape)}",
        )
        _expect(
            bool(((y >= 0) & (y < data.num_classes)).all()),
            report,
            f"{split}_y holds class indices in [0, num_classes={data.num_classes})",
        )
        _expect(bool(torch.isfinite(x).all()), report, f"{split}_x is finite")
    _expect(
        data.train_x.shape[1:] == data.val_x.shape[1:],
        report,
        "train and val inputs have the same shape",
        f"{tuple(data.train_x.shape[1:])} vs {tuple(data.val_x.shape[1:])}",
    )
    _expect(data.num_classes >= 2, report, "num_classes >= 2", f"got {data.num_classes}")
    if data.class_names is not None:
        _expect(len(data.class_names) == data.num_classes, report, "one class name per class")

    again = factory(**dataset_args(factory, args, seed))
    same = all(torch.equal(getattr(data, f), getattr(again, f)) for f in ("train_x", "train_y", "val_x", "val_y"))
    _expect(same, report, f"same seed ({seed}), same splits")
    _check_test_split(data, again, seed, report)
    if data.train_transform is not None:
        batch = data.train_x[:8]
        a = data.train_transform(batch, torch.Generator().manual_seed(seed))
        b = data.train_transform(batch, torch.Generator().manual_seed(seed))
        _expect(a.shape == batch.shape and a.dtype == batch.dtype, report, "train_transform keeps shape and dtype")
        _expect(torch.equal(a, b), report, "train_transform is determined by its generator")
    return report


CHECKED_SAMPLES = 8  # samples of each split a DatasetSplits check collates


def _check_dataset_splits(data: DatasetSplits, again: DatasetSplits, seed: int, report: CheckReport) -> None:
    """DatasetSplits: each split as long as its targets (int64 class indices), its first samples
    collated into (x, y) or (x, y, mask) with finite floating-point model inputs shaped like
    ``sample_shape`` (a mask: (N, L) bool, L at most the longest length, sample_shape[-1]), the
    collated targets those of train_y/val_y, and the same seed giving the same targets and batches."""
    from sweeper.trial.loading import first_batch

    _expect(data.num_classes >= 2, report, "num_classes >= 2", f"got {data.num_classes}")
    if data.class_names is not None:
        _expect(len(data.class_names) == data.num_classes, report, "one class name per class")
    for split in ("train", "val"):
        dataset, y = getattr(data, split), getattr(data, f"{split}_y")
        _expect(
            y.dtype == torch.int64 and y.ndim == 1 and len(dataset) == len(y) > 0,
            report,
            f"{split} holds as many samples as {split}_y (int64, (N,), N > 0) has rows",
            f"got {len(dataset)} samples and {split}_y {y.dtype} {tuple(y.shape)}",
        )
        _expect(
            bool(((y >= 0) & (y < data.num_classes)).all()),
            report,
            f"{split}_y holds class indices in [0, num_classes={data.num_classes})",
        )
        batch = first_batch(data, split, CHECKED_SAMPLES)
        x, n = data.inputs(batch.x), len(batch.y)
        _expect(torch.equal(batch.y, y[:n]), report, f"{split}'s collated targets are {split}_y's, in order")
        _expect(
            x.is_floating_point() and bool(torch.isfinite(x).all()),
            report,
            f"{split} samples collate into finite floating-point inputs",
            f"got {x.dtype}",
        )
        shape, sample = tuple(x.shape[1:]), tuple(data.sample_shape)
        if batch.mask is None:
            _expect(shape == sample, report, f"{split} batches are (N, *sample_shape)", f"got {shape} vs {sample}")
            continue
        _expect(
            shape[:-1] == sample[:-1] and shape[-1] <= sample[-1],
            report,
            f"padded {split} batches are (N, ..., L) with L at most sample_shape[-1]",
            f"got {shape} vs {sample}",
        )
        _expect(
            batch.mask.dtype == torch.bool and tuple(batch.mask.shape) == (n, shape[-1]),
            report,
            f"the mask of a padded {split} batch is bool (N, L)",
            f"got {batch.mask.dtype} {tuple(batch.mask.shape)}",
        )
        _expect(bool(batch.mask[:, 0].all()), report, f"every {split} sample holds data at its first position")
    same = all(torch.equal(getattr(data, f), getattr(again, f)) for f in ("train_y", "val_y"))
    first, second = (first_batch(d, "train", CHECKED_SAMPLES) for d in (data, again))
    same = same and torch.equal(first.x, second.x)
    _expect(same, report, f"same seed ({seed}), same splits")
    _check_test_split(data, again, seed, report)


def _check_test_split(
    data: DataSplits | DatasetSplits, again: DataSplits | DatasetSplits, seed: int, report: CheckReport
) -> None:
    """The optional test split (read once after a sweep, as the validation split is read): both
    its fields or neither, its samples the model inputs the validation samples are (shape, dtype),
    its targets the validation targets' kind, and the same seed giving the same test targets."""
    from sweeper.trial.loading import first_batch

    fields = ("test_x", "test_y") if isinstance(data, DataSplits) else ("test", "test_y")
    given = [getattr(data, f) is not None for f in fields]
    _expect(all(given) or not any(given), report, f"{' and '.join(fields)} are both set or both None")
    held, held_again = data.held_out(), again.held_out()
    if held is None or held_again is None:
        return
    test, val = first_batch(held, "val", CHECKED_SAMPLES), first_batch(data, "val", CHECKED_SAMPLES)
    x, reference = held.inputs(test.x), data.inputs(val.x)
    _expect(
        x.shape[1:] == reference.shape[1:] and x.dtype == reference.dtype and len(test.y) > 0,
        report,
        "test samples are model inputs shaped as the validation samples",
        f"got {x.dtype} {tuple(x.shape[1:])} vs {reference.dtype} {tuple(reference.shape[1:])}",
    )
    _expect(
        held.val_y.dtype == data.val_y.dtype and held.val_y.shape[1:] == data.val_y.shape[1:],
        report,
        "test_y holds targets of val_y's dtype and shape",
        f"got {held.val_y.dtype} {tuple(held.val_y.shape)}",
    )
    _expect(torch.equal(held.val_y, held_again.val_y), report, f"same seed ({seed}), same test split")


# --- optimizers -------------------------------------------------------------------------------


def check_optimizer_plugin(
    name: str, *, args: dict[str, Any] | None = None, seed: int = 0, steps: int = 20
) -> CheckReport:
    """Build the optimizer over two parameter groups (the second with its own lr); check that
    ``steps`` steps on a small fixed problem lower the loss, that runs are deterministic, and
    that a state_dict round trip (what a checkpoint does) resumes identically."""
    factory, args, report = _start("optimizers", name, args)
    x, y = _toy_data(seed)

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        model, groups = _toy_model(seed)
        return model, factory(groups, **args)

    def step(model: nn.Module, opt: torch.optim.Optimizer) -> float:
        return _toy_step(model, opt, x, y)

    model, opt = build()
    _expect(
        isinstance(opt, torch.optim.Optimizer), report, "returns a torch.optim.Optimizer", f"got {type(opt).__name__}"
    )
    _expect(
        len(opt.param_groups) == 2 and all("lr" in grp for grp in opt.param_groups),
        report,
        "keeps the parameter groups it is given, each with an 'lr' (schedules rescale it)",
    )
    losses = [step(model, opt) for _ in range(steps)]
    _expect(all(map(torch.isfinite, map(torch.tensor, losses))), report, "losses stay finite")
    _expect(
        losses[-1] < losses[0],
        report,
        f"{steps} steps lower the loss",
        f"{losses[0]:.4g} -> {losses[-1]:.4g} (are the default arguments usable?)",
    )

    twin, twin_opt = build()
    for _ in range(steps):
        step(twin, twin_opt)
    _expect(_same_params(model, twin), report, "same seed, same parameters after the same steps")

    resumed, resumed_opt = build()
    state = _round_trip({"model": model.state_dict(), "optimizer": opt.state_dict()})
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optimizer"])
    step(model, opt), step(resumed, resumed_opt)
    _expect(_same_params(model, resumed), report, "resumes identically from state_dict (checkpoints)")
    return report


# --- schedules --------------------------------------------------------------------------------

# What a plateau-style schedule gets once per epoch in the check: a validation loss that never
# improves, so that its LR cuts happen within the check's few epochs.
STALLED_LOSS = 1.0


def check_schedule_plugin(
    name: str, *, args: dict[str, Any] | None = None, epochs: int = 6, steps_per_epoch: int = 8, seed: int = 0
) -> CheckReport:
    """Build the schedule over a real optimizer (SGD, momentum 0.9, over two parameter groups with
    LRs 0.1 and 0.02) for a run of ``epochs`` epochs of ``steps_per_epoch`` steps, and drive it as
    the trainer does: ``step()`` after every optimizer step, or, a ``ReduceLROnPlateau``,
    ``step(metric)`` once per epoch (with a validation loss that stalls). Check that it returns an
    LRScheduler or None, takes every step of the run, keeps each group's LR finite and positive
    for every optimizer step (finite and not negative after the last), and that a state_dict round
    trip (what a checkpoint does) resumes the same LR curve."""
    factory, args, report = _start("schedules", name, args)
    x, y = _toy_data(seed)
    rig = _ScheduleRig(factory, args, report, epochs, steps_per_epoch, seed, x, y)
    model, optimizer, schedule = rig.build()
    if schedule is None:
        report.passed.append("returns None: a constant LR")
        return report
    if not isinstance(schedule, LRScheduler):
        _fail(report, "returns a torch.optim.lr_scheduler.LRScheduler or None", f"got {type(schedule).__name__}")
    report.passed.append("returns a torch.optim.lr_scheduler.LRScheduler")
    # the trainer's rule (sweeper/trial/trainer.py): a ReduceLROnPlateau steps once per epoch, on a metric
    how = "step(metric) once per epoch" if isinstance(schedule, ReduceLROnPlateau) else "step() once per optimizer step"
    took = f"takes {how} for {epochs} epochs of {steps_per_epoch} steps"
    curve = rig.run(model, optimizer, schedule, range(1, epochs + 1), took)
    report.passed.append(took)
    _check_lr_curve(curve, steps_per_epoch, report)
    _check_schedule_resumes(rig, curve, took)
    return report


@dataclass
class _ScheduleRig:
    """What check_schedule_plugin builds a schedule with and drives it on: the plugin's factory and
    arguments, the run's length, the seed of the toy model and its data (``x``, ``y``)."""

    factory: Callable[..., Any]
    args: dict[str, Any]
    report: CheckReport
    epochs: int
    steps_per_epoch: int
    seed: int
    x: torch.Tensor
    y: torch.Tensor

    def build(self) -> tuple[nn.Module, torch.optim.Optimizer, object]:
        """A fresh toy model, its SGD optimizer (two groups, LRs 0.1 and 0.02) and the plugin's schedule over it."""
        model, groups = _toy_model(self.seed)
        groups[1]["lr"] = 0.02  # a group with its own LR: a schedule scales each group's
        optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
        try:
            schedule = self.factory(optimizer, epochs=self.epochs, steps_per_epoch=self.steps_per_epoch, **self.args)
        except Exception as exc:  # the plugin's to fix: said as a failed check, not a traceback from torch
            _fail(self.report, "builds over an SGD optimizer with two parameter groups", _said(exc))
        return model, optimizer, schedule

    def rebuild(self) -> tuple[nn.Module, torch.optim.Optimizer, LRScheduler]:
        """``build`` again (a resumed run's fresh parts), failing the check unless it gives an LRScheduler again."""
        model, optimizer, schedule = self.build()
        if not isinstance(schedule, LRScheduler):
            _fail(self.report, "returns an LRScheduler every time it is built", f"got {type(schedule).__name__}")
        return model, optimizer, schedule

    def run(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: LRScheduler, epochs_run: range, took: str
    ) -> list[list[float]]:
        """Train ``epochs_run``; each group's LR at every optimizer step, then the LRs after the last
        (a schedule step that raises fails the check ``took``: it names how the schedule is stepped)."""
        lrs = []
        for epoch in epochs_run:
            for step in range(1, self.steps_per_epoch + 1):
                lrs.append([float(group["lr"]) for group in optimizer.param_groups])
                _toy_step(model, optimizer, self.x, self.y)
                if isinstance(schedule, ReduceLROnPlateau):
                    continue
                try:
                    schedule.step()
                except Exception as exc:  # e.g. a OneCycleLR built for fewer steps than the run takes
                    _fail(self.report, took, f"epoch {epoch}, step {step}: {_said(exc)}")
            if isinstance(schedule, ReduceLROnPlateau):
                schedule.step(STALLED_LOSS)
        return [*lrs, [float(group["lr"]) for group in optimizer.param_groups]]


def _check_lr_curve(curve: list[list[float]], steps_per_epoch: int, report: CheckReport) -> None:
    """Each group's LR in ``curve`` finite and positive at every optimizer step, and finite and not
    negative after the last."""
    bad = [
        f"group {g} at epoch {i // steps_per_epoch + 1}, step {i % steps_per_epoch + 1}: lr {lr:.4g}"
        for i, lrs in enumerate(curve[:-1])
        for g, lr in enumerate(lrs)
        if not (math.isfinite(lr) and lr > 0)
    ]
    _expect(not bad, report, "every group's LR is finite and positive at every optimizer step", "; ".join(bad[:3]))
    _expect(
        all(math.isfinite(lr) and lr >= 0 for lr in curve[-1]),
        report,
        "the LRs after the last step are finite and not negative",
        f"got {curve[-1]}",
    )


def _check_schedule_resumes(rig: _ScheduleRig, curve: list[list[float]], took: str) -> None:
    """Checkpoint a run after half its epochs, resume it in freshly built parts, and check that the
    two halves' LRs are the whole run's ``curve``."""
    half = rig.epochs // 2  # a checkpoint after epoch `half`, resumed by freshly built parts
    model, optimizer, schedule = rig.rebuild()
    before = rig.run(model, optimizer, schedule, range(1, half + 1), took)
    state = _schedule_checkpoint(model, optimizer, schedule, rig.report)
    model, optimizer, schedule = rig.rebuild()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["scheduler"])
    after = rig.run(model, optimizer, schedule, range(half + 1, rig.epochs + 1), took)
    _expect(
        before[:-1] + after == curve,
        rig.report,
        f"resumes the same LR curve from state_dict after epoch {half} (checkpoints)",
    )


def _schedule_checkpoint(
    model: nn.Module, optimizer: torch.optim.Optimizer, schedule: LRScheduler, report: CheckReport
) -> dict[str, Any]:
    """The parts' state_dicts saved and loaded as a checkpoint is (_round_trip), failing the check
    where the schedule's state is one a weights_only load refuses."""
    try:
        return _round_trip(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict()}
        )
    except Exception as exc:  # e.g. a state holding an object a weights_only load refuses
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        _fail(
            report,
            "its state_dict saves and loads as a checkpoint does (torch.load weights_only)",
            f"it holds a {refused[1]}, which a weights_only load refuses: keep state_dict() to tensors, numbers "
            "and plain containers"
            if refused
            else _said(exc),
        )


def _said(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
