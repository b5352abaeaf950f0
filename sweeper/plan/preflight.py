"""Before the first trial: what every trial would hit, found once.

``dry_build(spec)`` prepares each data set the sweep can use, once, in this process (the plugin
downloads or locates its files here, so trials in worker processes only read them), checks the
splits' shapes, then builds model, optimizer and schedule on the CPU for the base configuration
and for each plugin choice and each choice of a categorical plugin argument of the space
(``binding.plugin_points``: one configuration per choice, not their product), and takes one
training step on a few samples. Any exception becomes a ``UserError`` naming the spec path and
the plugin, instead of every trial failing the same way; when the model, optimizer or schedule
failed, the argument it refused is found by building again without each argument in turn.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from sweeper.errors import UserError
from sweeper.plugin import DATA_KIND_ATTR, DRY_BUILD, DatasetSplits, DataSplits
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import SECTIONS, plugin_points
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.trial.build import build_model, build_optimizer, build_schedule, build_task, make_data
from sweeper.trial.loading import first_batch, for_path, forward, loader_refusal

# Training samples in the dry step's batch: more than 1 (BatchNorm needs two values per channel
# in training mode), few enough that a ResNet-18 step costs a fraction of a second on a CPU.
DRY_SAMPLES = 4


@dataclass(frozen=True)
class DryBuild:
    """What the dry build did: the configurations built, and where its time went (seconds)."""

    configurations: list[str]  # "base" or the plugin choice, e.g. "optimizer.plugin=adamw"
    choices: list[str]  # the other choices of categorical plugin arguments, e.g. "model.args.arch=wide"
    data_seconds: float  # preparing the data sets (download, unpack, read)
    build_seconds: float  # building the plugins and the training step
    warnings: list[str]  # optimizer settings a plugin overrides (the spec's value has no effect)

    def summary(self) -> str:
        return (
            f"{len(self.configurations)} configuration(s) ({', '.join(self.configurations)}) on cpu"
            + (
                f" and {len(self.choices)} choice(s) of plugin arguments ({', '.join(self.choices)})"
                if self.choices
                else ""
            )
            + ": "
            f"data {self.data_seconds:.2f} s, build and one step {self.build_seconds:.2f} s"
        )


class _Failed(Exception):
    """A plugin failed while ``doing`` something for spec section ``section``."""

    def __init__(self, section: str, doing: str, error: Exception) -> None:
        super().__init__(section, doing, error)
        self.section, self.doing, self.error = section, doing, error


Prepared = dict[str, DataSplits | DatasetSplits]  # by dataset plugin and args, as the trials read it


def dry_build(spec: SweepSpec, prepared: Prepared | None = None) -> DryBuild:
    """Prepare the data and dry-build every plugin choice of ``spec``; raises UserError.
    ``prepared``: the data sets prepared already (``probe_families``), reused."""
    labels: list[str] = []  # of the plugin configurations, then of the argument choices
    warnings: list[str] = []
    data_seconds = build_seconds = 0.0
    prepared = {} if prepared is None else prepared  # each data set prepared once
    with _dry_building():
        for label, values in plugin_points(spec):
            config = spec.with_values(values)
            labels.append(label)
            started = time.perf_counter()
            data = _prepare(config, values, prepared)
            _check_batch_sizes(spec, config, data)
            data_seconds += time.perf_counter() - started
            started = time.perf_counter()
            try:
                found = _build_and_step(config, data)
            except _Failed as failed:
                raise _refusal(config, failed, values, _refused_arg(config, data, failed)) from failed.error
            warnings += [w for w in found if w not in warnings]
            build_seconds += time.perf_counter() - started
    plugins = [label for label in labels if label == "base" or label.split("=")[0].endswith(".plugin")]
    choices = [label for label in labels if label not in plugins]
    return DryBuild(plugins, choices, data_seconds, build_seconds, warnings)


def _prepare(config: SweepSpec, values: dict[str, Any], prepared: Prepared) -> DataSplits | DatasetSplits:
    """``config``'s data set, prepared once (and checked) into ``prepared``."""
    key = repr((config.dataset.plugin, sorted(config.dataset.args.items())))
    if key not in prepared:
        try:
            with _blame("dataset", "preparing the data set"):
                raw = make_data(config)
                _check_splits(raw)
                _check_kind(config, raw)
                _check_path(config, raw)
                prepared[key] = for_path(raw, config.data.path)
        except _Failed as failed:
            raise _refusal(config, failed, values, None) from failed.error
    return prepared[key]


def probe_families(spec: SweepSpec, names: list[str], prepared: Prepared) -> dict[str, str]:
    """The model families of ``names`` (brought by the data, not named by the spec) that fail a
    build and one training step on the data set's samples, each with why: refused, not an error
    (the spec did not ask for them). The data set is prepared into ``prepared`` for the dry build."""
    refused: dict[str, str] = {}
    with _dry_building():
        data = _prepare(spec, {}, prepared)
        for name in names:
            try:
                _build_and_step(spec.with_values({"model.plugin": name}), data)
            except _Failed as failed:
                error = failed.error
                refused[name] = (
                    f"{failed.doing} failed on the data set's samples {data.input_shape} in a dry build: "
                    f"{type(error).__name__}: {str(error).rstrip('.')}"
                )
            except Exception as exc:  # a required argument the spec does not give, say
                refused[name] = f"cannot be built for this spec: {type(exc).__name__}: {str(exc).rstrip('.')}"
    return refused


# The sample dimensions each kind of data (sweeper.plugin.DATA_KINDS) has: a row (F,), a
# sequence (L,) or (C, L), an image (C, H, W).
KIND_DIMS = {"table": (1,), "sequence": (1, 2), "image": (3,)}


def _check_kind(config: SweepSpec, data: DataSplits | DatasetSplits) -> None:
    """The kind of data the data set plugin declares (DATA_KIND_ATTR) fits its samples' shape."""
    kind = getattr(registry.get("datasets", config.dataset.plugin), DATA_KIND_ATTR, None)
    if kind in KIND_DIMS and len(data.input_shape) not in KIND_DIMS[kind]:
        dims = " or ".join(str(d) for d in KIND_DIMS[kind])
        raise ValueError(
            f"it declares {DATA_KIND_ATTR} = {kind!r} (samples of {dims} dimensions) but gives samples "
            f"of shape {data.input_shape}"
        )


def _refused_arg(config: SweepSpec, data: DataSplits | DatasetSplits, failed: _Failed) -> str | None:
    """The argument of the failed section whose removal (the plugin's default instead) lets the
    whole build and step pass: the one the plugin refused. None when no single one does, or for
    the data set (preparing it again could download or read files)."""
    if failed.section == "dataset":
        return None
    tree = config.model_dump()
    for arg in getattr(config, failed.section).args:
        without = {**tree, failed.section: {**tree[failed.section], "args": dict(tree[failed.section]["args"])}}
        del without[failed.section]["args"][arg]
        try:
            _build_and_step(SweepSpec.model_validate(without), data)
        except Exception:  # _Failed, or a required argument missing: not this one alone
            continue
        return arg
    return None


def _refusal(config: SweepSpec, failed: _Failed, values: dict[str, Any], arg: str | None) -> UserError:
    """The UserError of a failed dry build: the argument refused (when known), the spec path,
    the plugin and its distribution, and the searched values of that section."""
    section, exc = failed.section, failed.error
    kind = SECTIONS[section]
    name = getattr(config, section).plugin
    own = [f"{k}={v!r}" for k, v in values.items() if k.startswith(f"{section}.")]
    searched = f" (with {', '.join(own)})" if own else ""
    who = f"{registry.singular(kind)} plugin '{name}' ({registry.info(kind, name).where})"
    refused = ""
    if arg is not None:
        path = f"{section}.args.{arg}"
        origin = f"from search.space.{path}" if path in values else "fixed in the spec"
        value = getattr(config, section).args[arg]
        refused = f"{path}: {value!r} ({origin}) is refused (without it, the build passes) by "
    return UserError(
        f"{refused}{section}.args / {who}: {failed.doing} failed{searched}: {type(exc).__name__}: "
        f"{str(exc).rstrip('.')}. Found in a dry build on the CPU, before any trial started."
    )


def _build_and_step(config: SweepSpec, data: DataSplits | DatasetSplits) -> list[str]:
    """Fit the task to the data (its targets checked), build the plugins (the schedule sized for
    the full data set) and take one training step, one scheduler step and one evaluation on a
    few samples; raises _Failed. Returns warnings: the optimizer settings of the spec that the
    optimizer or the schedule plugin overrides."""
    n = min(DRY_SAMPLES, len(data.train_y))
    batch = first_batch(data, "train", n)
    x, y = batch.x, batch.y
    with _blame("task", f"fitting it to dataset plugin '{config.dataset.plugin}' (its targets checked)"):
        task = build_task(config, data)
    with _blame("model", "building it"):
        model = build_model(config, data, task)
    _check_padded_export(config, model, batch.mask is not None)
    with _blame("optimizer", "building it"):
        optimizer = build_optimizer(config, model)
    warnings = _overridden(config, "optimizer", optimizer, dict(config.optimizer.args))
    given = _settings(optimizer)
    with _blame("schedule", "building it"):
        scheduler = build_schedule(config, optimizer, data)
    if isinstance(data, DataSplits) and data.train_transform is not None:
        with _blame("dataset", "its train_transform on a batch"):
            x = data.train_transform(x, torch.Generator().manual_seed(0))
    with _blame("dataset", "its input_transform on a batch"):
        x = data.inputs(x)
    with _blame("model", f"a forward and backward pass on {n} training samples"):
        model.train()
        out = forward(model, x, batch.mask)
        if tuple(out.shape) != (n, task.outputs):
            raise ValueError(
                f"it returns shape {tuple(out.shape)} for {n} inputs of shape {data.input_shape}; "
                f"expected ({n}, num_classes={task.outputs}) for task '{config.task.plugin}'"
            )
    with _blame("task", f"its loss on the model's outputs for {n} training samples"):
        # (a loss or outputs that are not finite are the trial's own failure, as in training: a
        # searched learning rate may diverge without the sweep being wrong)
        loss = task.loss(out, y)
    with _blame("model", f"a forward and backward pass on {n} training samples"):
        loss.backward()
    with _blame("optimizer", "an optimizer step"):
        optimizer.step()
    with _blame("schedule", "a scheduler step"):
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(loss.item())  # stepped once per epoch with the validation loss
        elif scheduler is not None:
            scheduler.step()
    with _blame("dataset", f"collating {n} validation samples"):
        val = first_batch(data, "val", n)
    with _blame("model", f"evaluating {n} validation samples"):
        model.eval()
        with torch.inference_mode():
            out = forward(model, data.inputs(val.x), val.mask)
    with _blame("task", f"its metrics on {n} validation samples"):
        meter = task.meter("val")
        meter.update(out.float(), val.y)
        meter.compute()
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
    """The DataSplits or DatasetSplits contract, as far as every trial relies on it (shapes and
    dtypes; the task checks the targets' values)."""
    if isinstance(data, DatasetSplits):
        _check_datasets(data)
        return
    if not isinstance(data, DataSplits):
        raise TypeError(
            f"it returned a {type(data).__name__}, not a sweeper.plugin.DataSplits or sweeper.plugin.DatasetSplits"
        )
    for split in ("train", "val"):
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        given = data.inputs(x[:2])
        if not given.is_floating_point():
            raise TypeError(
                f"{split}_x must be floating point (as stored, or after input_transform); got {given.dtype}"
            )
        if not (x.ndim >= 2 and y.ndim >= 1 and len(x) == len(y) > 0):
            raise ValueError(
                f"{split}_x must be (N, *input_shape) and {split}_y (N, ...) with N > 0; got "
                f"{tuple(x.shape)} and {tuple(y.shape)}"
            )
    if data.train_x.shape[1:] != data.val_x.shape[1:]:
        raise ValueError(
            f"train and val inputs differ in shape: {tuple(data.train_x.shape[1:])} vs {tuple(data.val_x.shape[1:])}"
        )


def _check_datasets(data: DatasetSplits) -> None:
    """DatasetSplits: each dataset as long as its targets, and its first samples collate into
    (x, y) or (x, y, mask) with floating-point model inputs."""
    for split in ("train", "val"):
        dataset, y = getattr(data, split), getattr(data, f"{split}_y")
        if not (y.ndim >= 1 and len(dataset) == len(y) > 0):
            raise ValueError(
                f"{split} must hold as many samples as {split}_y has rows, more than 0; got "
                f"{len(dataset)} samples and {split}_y of shape {tuple(y.shape)}"
            )
        batch = first_batch(data, split, 2)
        given = data.inputs(batch.x)
        if not given.is_floating_point():
            raise TypeError(
                f"{split} samples must collate into floating-point inputs (as stored, or after "
                f"input_transform); got {given.dtype}"
            )


def _check_path(config: SweepSpec, data: DataSplits | DatasetSplits) -> None:
    """The data path the spec asks for can read ``data`` (data.path: loader and a train_transform)."""
    refusal = loader_refusal(data, config.data.path)
    if refusal is not None:
        raise UserError(f"{refusal} (dataset plugin '{config.dataset.plugin}')")


def _check_padded_export(config: SweepSpec, model: torch.nn.Module, padded: bool) -> None:
    """Padded batches (a collate_fn that returns a mask) export as (x, mask) with a dynamic length
    axis (sweeper/export/inputs.py). torch.export (pt2) cannot keep that axis dynamic through a
    recurrent layer: it unrolls nn.GRU/LSTM/RNN into one step per position of its example."""
    if not padded or "pt2" not in config.export.formats:
        return
    rnn = next((type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)), None)
    if rnn is not None:
        raise UserError(
            f"export.formats: {list(config.export.formats)}: model plugin '{config.model.plugin}' has an "
            f"nn.{rnn} and dataset plugin '{config.dataset.plugin}' pads variable-length sequences; "
            f"torch.export (pt2) unrolls a recurrent layer into one step per position, which fixes the "
            f"exported model's sequence length; drop pt2 (torchscript and onnx export it with a dynamic length)"
        )


def _check_batch_sizes(spec: SweepSpec, config: SweepSpec, data: DataSplits | DatasetSplits) -> None:
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
def _blame(section: str, doing: str) -> Iterator[None]:
    """Turn an exception of a plugin into _Failed: which section, doing what."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        raise _Failed(section, doing, exc) from exc
