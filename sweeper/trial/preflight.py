"""Before the first trial: what every trial would hit, found once.

``dry_build(spec)`` prepares each data set the sweep can use, once, in this process (the plugin
downloads or locates its files here, so trials in worker processes only read them), checks the
splits' shapes, then builds model, optimizer and schedule on the CPU for the base configuration
and for each plugin choice of the space (``binding.plugin_points``: one configuration per choice,
not their product), and takes one training step on a few samples. Any exception becomes a
``UserError`` naming the spec path and the plugin, instead of every trial failing the same way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from sweeper.errors import UserError
from sweeper.plugin import DRY_BUILD, DataSplits
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import SECTIONS, plugin_points
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.build import build_model, build_optimizer, build_schedule, make_data

# Training samples in the dry step's batch: more than 1 (BatchNorm needs two values per channel
# in training mode), few enough that a ResNet-18 step costs a fraction of a second on a CPU.
DRY_SAMPLES = 4


@dataclass(frozen=True)
class DryBuild:
    """What the dry build did: the configurations built, and where its time went (seconds)."""

    configurations: list[str]  # "base" or the plugin choice, e.g. "optimizer.plugin=adamw"
    data_seconds: float  # preparing the data sets (download, unpack, read)
    build_seconds: float  # building the plugins and the training step
    warnings: list[str]  # optimizer settings a plugin overrides (the spec's value has no effect)

    def summary(self) -> str:
        return (
            f"{len(self.configurations)} configuration(s) ({', '.join(self.configurations)}) on cpu: "
            f"data {self.data_seconds:.2f} s, build and one step {self.build_seconds:.2f} s"
        )


def dry_build(spec: SweepSpec) -> DryBuild:
    """Prepare the data and dry-build every plugin choice of ``spec``; raises UserError."""
    labels: list[str] = []
    warnings: list[str] = []
    data_seconds = build_seconds = 0.0
    prepared: dict[str, DataSplits] = {}  # by dataset plugin and args: each prepared once
    with _dry_building():
        for values in plugin_points(spec):
            config = spec.with_values(values)
            labels.append(_label(spec, values))
            started = time.perf_counter()
            key = repr((config.dataset.plugin, sorted(config.dataset.args.items())))
            if key not in prepared:
                with _blame(config, "dataset", "preparing the data set", values):
                    prepared[key] = make_data(config)
                    _check_splits(prepared[key])
            data = prepared[key]
            _check_batch_sizes(spec, config, data)
            data_seconds += time.perf_counter() - started
            started = time.perf_counter()
            warnings += [w for w in _build_and_step(config, data, values) if w not in warnings]
            build_seconds += time.perf_counter() - started
    return DryBuild(labels, data_seconds, build_seconds, warnings)


def _build_and_step(config: SweepSpec, data: DataSplits, values: dict[str, Any]) -> list[str]:
    """Build the plugins (the schedule sized for the full data set) and take one training step,
    one scheduler step and one evaluation on a few samples. Returns warnings: the optimizer
    settings of the spec that the optimizer or the schedule plugin overrides."""
    n = min(DRY_SAMPLES, len(data.train_y))
    x, y = data.train_x[:n], data.train_y[:n]
    with _blame(config, "model", "building it", values):
        model = build_model(config, data)
    with _blame(config, "optimizer", "building it", values):
        optimizer = build_optimizer(config, model)
    warnings = _overridden(config, "optimizer", optimizer, dict(config.optimizer.args))
    given = _settings(optimizer)
    with _blame(config, "schedule", "building it", values):
        scheduler = build_schedule(config, optimizer, data)
    if data.train_transform is not None:
        with _blame(config, "dataset", "its train_transform on a batch", values):
            x = data.train_transform(x, torch.Generator().manual_seed(0))
    with _blame(config, "dataset", "its input_transform on a batch", values):
        x = data.inputs(x)
    with _blame(config, "model", f"a forward and backward pass on {n} training samples", values):
        model.train()
        out = model(x)
        if tuple(out.shape) != (n, data.num_classes):
            raise ValueError(
                f"it returns shape {tuple(out.shape)} for {n} inputs of shape {data.input_shape}; "
                f"expected ({n}, num_classes={data.num_classes})"
            )
        loss = F.cross_entropy(out, y, label_smoothing=config.train.label_smoothing)
        loss.backward()
    with _blame(config, "optimizer", "an optimizer step", values):
        optimizer.step()
    with _blame(config, "schedule", "a scheduler step", values):
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(loss.item())  # stepped once per epoch with the validation loss
        elif scheduler is not None:
            scheduler.step()
    with _blame(config, "model", f"evaluating {n} validation samples", values):
        model.eval()
        with torch.inference_mode():
            model(data.inputs(data.val_x[:n]))
    return warnings + _overridden(config, "schedule", optimizer, given)


# What a schedule is meant to change (the learning rate and its own bookkeeping)
_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum")


def _settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The first param group's settings (momentum, betas, weight decay, ...), as plain values."""
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in optimizer.param_groups[0].items()
        if k != "params" and k not in _LR_KEYS and isinstance(v, (int, float, tuple, list))
    }


def _overridden(
    config: SweepSpec, section: str, optimizer: torch.optim.Optimizer, expected: dict[str, Any]
) -> list[str]:
    """Settings in ``expected`` (the spec's optimizer args, or the settings before the schedule
    was built and stepped) that the optimizer now holds with another value."""
    now = _settings(optimizer)
    plugin = getattr(config, section).plugin
    out = []
    for key, value in expected.items():
        value = list(value) if isinstance(value, tuple) else value
        if key in now and key not in _LR_KEYS and now[key] != value:
            out.append(
                f"{section} plugin '{plugin}' changes the optimizer's {key} from {value!r} to {now[key]!r}: "
                f"the value optimizer.args.{key} gives (fixed or searched) has no effect"
            )
    return out


def _check_splits(data: Any) -> None:
    """The DataSplits contract, as far as every trial relies on it (shapes and dtypes)."""
    if not isinstance(data, DataSplits):
        raise TypeError(f"it returned a {type(data).__name__}, not a sweeper.plugin.DataSplits")
    for split in ("train", "val"):
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        given = data.inputs(x[:2])
        if not (given.is_floating_point() and y.dtype == torch.int64):
            raise TypeError(
                f"{split}_x must be floating point (as stored, or after input_transform) and {split}_y "
                f"int64; got {given.dtype} and {y.dtype}"
            )
        if not (x.ndim >= 2 and y.ndim == 1 and len(x) == len(y) > 0):
            raise ValueError(
                f"{split}_x must be (N, *input_shape) and {split}_y (N,) with N > 0; got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
        if not bool(((y >= 0) & (y < data.num_classes)).all()):
            raise ValueError(f"{split}_y must hold class indices in [0, num_classes={data.num_classes})")
    if data.train_x.shape[1:] != data.val_x.shape[1:]:
        raise ValueError(
            f"train and val inputs differ in shape: {tuple(data.train_x.shape[1:])} vs {tuple(data.val_x.shape[1:])}"
        )


def _check_batch_sizes(spec: SweepSpec, config: SweepSpec, data: DataSplits) -> None:
    """Every batch size the sweep can use fits in the training split (a trial drops the last
    incomplete batch, so a larger batch would leave it nothing to train on)."""
    param = spec.search.space.get("train.batch_size")
    sizes = [spec.train.batch_size] if param is None else sp.representatives(param)
    n = len(data.train_y)
    for size in sizes:
        if isinstance(size, (int, float)) and size > n:
            where = "train.batch_size" if param is None else "search.space.train.batch_size"
            raise UserError(
                f"{where}: a batch of {size} is larger than the training split of dataset plugin "
                f"'{config.dataset.plugin}' ({n} samples); use at most {n}"
            )


def _label(spec: SweepSpec, values: dict[str, Any]) -> str:
    chosen = [
        f"{s}.plugin={values[f'{s}.plugin']}"
        for s in SECTIONS
        if f"{s}.plugin" in values and values[f"{s}.plugin"] != getattr(spec, s).plugin
    ]
    return ", ".join(chosen) or "base"


@contextlib.contextmanager
def _dry_building() -> Iterator[None]:
    """``sweeper.plugin.in_dry_build()`` is True inside; this process's RNG is left as it was."""
    token = DRY_BUILD.set(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        DRY_BUILD.reset(token)


@contextlib.contextmanager
def _blame(config: SweepSpec, section: str, doing: str, values: dict[str, Any]) -> Iterator[None]:
    """Turn an exception into a UserError naming the spec path, the plugin and its distribution,
    and the searched values of that section in the configuration that was being built."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        kind = SECTIONS[section]
        name = getattr(config, section).plugin
        own = [f"{k}={v!r}" for k, v in values.items() if k.startswith(f"{section}.")]
        searched = f" (with {', '.join(own)})" if own else ""
        who = f"{registry.singular(kind)} plugin '{name}' ({registry.info(kind, name).where})"
        raise UserError(
            f"{section}.args / {who}: {doing} failed{searched}: {type(exc).__name__}: "
            f"{str(exc).rstrip('.')}. Found in a dry build on the CPU, before any trial started."
        ) from exc
