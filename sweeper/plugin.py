"""The plugin contracts: plain factories found through entry points, no base class; the
entry-point name is what a spec writes. One group per kind, each typed by a protocol below:
``sweeper.datasets`` (``DatasetFactory``), ``sweeper.models`` (``ModelFactory``),
``sweeper.optimizers`` (``OptimizerFactory``), ``sweeper.schedules`` (``ScheduleFactory``) and
``sweeper.tasks`` (``TaskFactory``). A protocol lists only what sweeper passes, so a factory
satisfies it when every argument a spec may set has a default.

Before any training, the spec's arguments are bound to each factory's signature (a misspelt one
fails the sweep up front) and every factory is called once in a dry build (``in_dry_build()``).
An argument's annotation may declare its search prior (``Uniform``, ``LogUniform``, ``IntRange``,
``Choice``) for ``search.space: auto``. The attributes sweeper reads on a plugin (``API_ATTR``,
``CHANNELS_LAST_ATTR``, ``FUSABLE_ATTR``, ``DATA_KIND_ATTR``, ``DATA_KINDS_ATTR``) are named here
and nowhere else; a module declaring
``SWEEPER_PLUGIN_API`` that excludes ``sweeper.PLUGIN_API_VERSION`` is refused. The full
contract, with examples: docs/plugins.md.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler
    from torch.optim.optimizer import ParamsT
    from torch.utils.data import Dataset

__all__ = [
    "API_ATTR",
    "CHANNELS_LAST_ATTR",
    "Choice",
    "IntRange",
    "LogUniform",
    "Prior",
    "Uniform",
    "FUSABLE_ATTR",
    "DATA_KIND_ATTR",
    "DATA_KINDS",
    "DATA_KINDS_ATTR",
    "DataSplits",
    "DatasetFactory",
    "DatasetSplits",
    "FittedTask",
    "Meter",
    "ModelFactory",
    "Normalize",
    "OptimizerFactory",
    "ScheduleFactory",
    "SeededDatasetFactory",
    "TabularFeatures",
    "Task",
    "TaskFactory",
    "UnseededDatasetFactory",
    "in_dry_build",
    "pad_collate",
]

KINDS = ("datasets", "models", "optimizers", "schedules", "tasks")
# Groups `sweeper plugins` lists: the five factory kinds plus search-space templates (templates.py).
LISTED = (*KINDS, "search_spaces")

# The attributes a plugin may set for sweeper to read (docs/plugins.md, "Attributes a plugin may set").
# On the module an entry point names: the plugin-API version(s) it targets, an int or a list of ints.
API_ATTR = "SWEEPER_PLUGIN_API"
# On the torch.nn.Module a model factory returns: False keeps the default (NCHW) layout on CUDA, where
# a model with a 2-D convolution otherwise trains in channels_last (NHWC), e.g. for a custom view().
CHANNELS_LAST_ATTR = "sweeper_channels_last"
# On a model or optimizer factory: False keeps its trials out of fused training (search.fuse), e.g. a
# model whose forward branches on its data (vmap cannot batch it), an optimizer whose step needs a closure.
FUSABLE_ATTR = "sweeper_fusable"
# The kinds of data a data set gives and a model takes: "table" (a row of columns, (F,)), "sequence"
# (positions in order, (L,) or (C, L)) and "image" ((C, H, W)). Under `--auto` every installed model
# that takes the data set's kind is a candidate family (sweeper/pluginhost/families.py).
DATA_KINDS = ("table", "sequence", "image")
# On a data set factory: the kind of data it gives, one of DATA_KINDS (checked against its samples'
# shape in the dry build). A shape alone cannot tell a sequence of 40 positions from a row of 40 columns.
DATA_KIND_ATTR = "sweeper_data_kind"
# On a model factory: the kinds of data it takes, a tuple of DATA_KINDS (an MLP flattens any of them).
# Unset: the model is searched only where a spec names it (a wrapper such as torchvision_model, whose
# architecture is an argument, is no one family).
DATA_KINDS_ATTR = "sweeper_data_kinds"
# Arguments sweeper passes itself, per kind; a spec may not set them.
INJECTED = {
    "datasets": ("seed",),
    "models": ("input_shape", "num_classes", "features"),
    "optimizers": ("params",),
    "schedules": ("optimizer", "epochs", "steps_per_epoch"),
    "tasks": (),
}


@dataclass(frozen=True)
class TabularFeatures:
    """The columns of a tabular sample ``x`` (float32, shape (F,)): the numeric columns first,
    standardised with the training split's ``mean`` and ``std``, then the categorical columns as
    integer codes (stored as floats): 0 for a value the training split never held (or a missing
    one), ``k`` for ``vocabularies[column][k - 1]``. A model factory that declares ``features``
    gets it (embeddings sized by ``cardinalities``); export.json records it (``as_dict``) for
    consumers that turn raw rows into model inputs."""

    numeric: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    categorical: tuple[str, ...] = ()
    vocabularies: tuple[tuple[str, ...], ...] = ()  # per categorical column, the training split's values

    @property
    def cardinalities(self) -> tuple[int, ...]:
        """Codes per categorical column: its vocabulary plus code 0 (unseen or missing)."""
        return tuple(len(v) + 1 for v in self.vocabularies)

    def as_dict(self) -> dict[str, Any]:
        return {
            "numeric": [{"name": n, "mean": m, "std": s} for n, m, s in zip(self.numeric, self.mean, self.std)],
            "categorical": [
                {"name": n, "codes_from": 1, "unseen_code": 0, "categories": list(v)}
                for n, v in zip(self.categorical, self.vocabularies)
            ],
            "order": "numeric columns (x - mean) / std, then categorical codes, as float32",
        }


@dataclass(frozen=True, eq=False)
class DataSplits:
    """What a dataset plugin returns: whole splits as tensors (held on the training device,
    batched by index: no per-sample Python work). The ``x`` tensors hold samples as stored
    (float32, or a compact dtype such as uint8 pixels with an ``input_transform``); ``inputs(x)``
    makes a batch of them model inputs."""

    train_x: torch.Tensor  # shape (N, *input_shape); float32, or any dtype input_transform reads
    # The targets, as the task reads them (its fit checks them): classification, int64 class
    # indices (N,); multilabel, 0/1 (N, labels); regression, float (N,) or (N, targets).
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: int = 0  # classification: the number of classes; 0 for other targets
    class_names: tuple[str, ...] | None = None
    # The held-out test split (optional; both or neither), as stored like train_x/val_x. No trial,
    # sampler, pruner or warm start reads it: sweeper scores the chosen trial on it once, after the
    # sweep (sweeper/trial/holdout.py), and nothing else may touch these tensors.
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    # Batch augmentation, applied on the training device to each training batch:
    # (batch, generator) -> batch. The generator lives on the batch's device.
    train_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # Stored samples -> model inputs (float), applied on the training device to every batch, after
    # train_transform (so augmentation works on raw pixels: crop padding is black, as in torchvision).
    # None: the x tensors are model inputs already.
    input_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    # The scaling and per-channel normalisation between raw samples and model inputs (applied to
    # the tensors or by input_transform); exported with the model for its consumers.
    normalization: dict[str, list[float]] | None = None
    # A tabular data set's columns (numeric statistics, category vocabularies): injected into model
    # factories that declare ``features``, recorded in export.json.
    features: TabularFeatures | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs from a batch of stored samples (``val_x[:8]``, an augmented training batch)."""
        return x if self.input_transform is None else self.input_transform(x)

    def to(self, device: torch.device) -> DataSplits:
        from dataclasses import replace

        return replace(
            self,
            train_x=self.train_x.to(device),
            train_y=self.train_y.to(device),
            val_x=self.val_x.to(device),
            val_y=self.val_y.to(device),
        )

    def val_inputs(self, limit: int | None = None) -> torch.Tensor:
        """Model inputs of the first ``limit`` validation samples (all when None): an export's
        example and reference inputs."""
        return self.inputs(self.val_x[:limit])

    def held_out(self) -> DataSplits | None:
        """These splits with the test split in the validation split's place, for scoring the
        chosen trial after the sweep with the code that evaluates a trial; None without one.
        ``to`` leaves the test tensors where the plugin made them (and untouched)."""
        if self.test_x is None or self.test_y is None:
            return None
        from dataclasses import replace

        return replace(self, val_x=self.test_x, val_y=self.test_y, test_x=None, test_y=None)


@dataclass(frozen=True, eq=False)
class DatasetSplits:
    """What a dataset plugin returns for the DataLoader path: map-style datasets whose item ``i``
    is ``(x, y)``, read by ``torch.utils.data.DataLoader`` (seeded workers, pinned memory) one
    batch at a time: data larger than memory, per-sample preprocessing on CPU workers,
    variable-length sequences. The fields that mean what they mean in ``DataSplits`` have its names."""

    train: Dataset[Any]  # train[i] -> (x, y); len(train) samples
    val: Dataset[Any]
    # All targets at once, in the datasets' order (train_y[i] is train[i]'s y): the task fits on
    # them (class counts, standardisation) without reading any sample. Dtypes as in DataSplits.
    train_y: torch.Tensor
    val_y: torch.Tensor
    # One model input's shape (what a model factory gets as input_shape, and an export's example
    # input): for variable lengths, the longest sample's, e.g. (max_len,) or (channels, max_len).
    sample_shape: tuple[int, ...]
    num_classes: int = 0  # classification: the number of classes; 0 for other targets
    class_names: tuple[str, ...] | None = None
    # The held-out test split (optional; both or neither): read once, after the sweep, to score the
    # chosen trial (as DataSplits.test_x/test_y); never by a trial or the search.
    test: Dataset[Any] | None = None
    test_y: torch.Tensor | None = None
    # list of items -> (x, y) or (x, y, mask): a batch. None: torch's default_collate (stacks
    # same-shaped samples). pad_collate pads variable-length sequences and adds their mask, which
    # the model receives as forward(x, mask=mask).
    collate_fn: Callable[[list[Any]], Any] | None = None
    # Collated batch -> model inputs (float), on the training device, as in DataSplits.
    input_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    normalization: dict[str, list[float]] | None = None
    # A tabular data set's columns (numeric statistics, category vocabularies): injected into model
    # factories that declare ``features``, recorded in export.json.
    features: TabularFeatures | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.sample_shape)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs from a collated batch of samples."""
        return x if self.input_transform is None else self.input_transform(x)

    def collate(self, split: str, indices: range) -> tuple[torch.Tensor, ...]:
        """Samples ``indices`` of ``split`` ("train" or "val") as one batch: (x, y) or (x, y, mask)."""
        from torch.utils.data import default_collate

        dataset = {"train": self.train, "val": self.val}[split]
        items = [dataset[i] for i in indices]
        return tuple((self.collate_fn or default_collate)(items))

    def val_inputs(self, limit: int | None = None) -> torch.Tensor:
        """Model inputs of the first ``limit`` validation samples (all when None), collated."""
        n = len(self.val_y) if limit is None else min(limit, len(self.val_y))
        return self.inputs(self.collate("val", range(n))[0])

    def to(self, device: torch.device) -> DatasetSplits:
        """The targets on ``device`` (the task fits there); the samples stay where the datasets
        read them: the loader moves each batch."""
        from dataclasses import replace

        return replace(self, train_y=self.train_y.to(device), val_y=self.val_y.to(device))

    def held_out(self) -> DatasetSplits | None:
        """These splits with the test split in the validation split's place (as
        ``DataSplits.held_out``); None without one."""
        if self.test is None or self.test_y is None:
            return None
        from dataclasses import replace

        return replace(self, val=self.test, val_y=self.test_y, test=None, test_y=None)


def pad_collate(items: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``DatasetSplits.collate_fn`` for variable-length sequences: items ``(x, y)`` with ``x``
    shaped (L,) or (C, L) (L varies) -> ``(x, y, mask)``: ``x`` zero-padded at the end to the
    batch's longest L, (N, L_max) or (N, C, L_max); ``y`` stacked; ``mask`` (N, L_max) bool, True
    where a position holds data (the sequence models of sweeper_plugins.sequences take it)."""
    import torch

    xs = [torch.as_tensor(x) for x, _ in items]
    longest = max(x.shape[-1] for x in xs)
    x = xs[0].new_zeros((len(xs), *xs[0].shape[:-1], longest))
    mask = torch.zeros((len(xs), longest), dtype=torch.bool)
    for i, sample in enumerate(xs):
        x[i, ..., : sample.shape[-1]] = sample
        mask[i, : sample.shape[-1]] = True
    y = torch.stack([torch.as_tensor(target) for _, target in items])
    return x, y, mask


@dataclass(frozen=True)
class Normalize:
    """An ``input_transform`` for image-like samples stored compactly (uint8 pixels: a quarter of
    float32's memory): ``(x * scale - mean[c]) / std[c]`` per channel (dim 1), in float32, on the
    batch's device. ``as_dict()`` is the matching ``DataSplits.normalization``."""

    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # per device: (factor, shift) with x * factor + shift == (x * scale - mean) / std
    _constants: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self._constants:  # made once per device: no host-to-device copy per batch
            import torch

            mean, std = torch.tensor(self.mean), torch.tensor(self.std)
            shape = (len(self.mean),) + (1,) * (x.ndim - 2)
            self._constants[key] = ((self.scale / std).view(shape).to(x.device), (-mean / std).view(shape).to(x.device))
        factor, shift = self._constants[key]
        return x.float() * factor + shift

    def as_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "mean": list(self.mean), "std": list(self.std)}


# --- the factories, as a type checker sees them ------------------------------------------------
# Each protocol has only the arguments sweeper passes itself (INJECTED): a factory satisfies it when
# every other argument (what a spec sets) has a default, so `plugin: NAME` alone works. Check one with
# an annotated assignment, e.g. ``_: ModelFactory = my_model``.


class ModelFactory(Protocol):
    """``sweeper.models``: a model mapping ``(batch, *input_shape)`` inputs to ``(batch, num_classes)``
    outputs; ``input_shape`` is one sample's shape, from the data set; ``num_classes`` the output
    width, which the task sets (classes, labels or regression targets). A factory that declares
    ``features`` also gets the data set's ``TabularFeatures`` (None for data without columns)."""

    def __call__(self, *, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module: ...


class SeededDatasetFactory(Protocol):
    """``sweeper.datasets``, taking ``seed``: the sweep seed's "data" stream, the same for every
    trial of a sweep (so every trial sees the same split)."""

    def __call__(self, *, seed: int) -> DataSplits | DatasetSplits: ...


class UnseededDatasetFactory(Protocol):
    """``sweeper.datasets``, without ``seed`` (a split fixed on disk, say): called with the spec's
    arguments alone."""

    def __call__(self) -> DataSplits | DatasetSplits: ...


# A data-set factory gets ``seed`` only when its signature accepts it.
DatasetFactory = SeededDatasetFactory | UnseededDatasetFactory


class OptimizerFactory(Protocol):
    """``sweeper.optimizers``: what ``torch.optim`` optimizers take (``torch.optim.SGD`` itself
    qualifies): parameters, or parameter-group dicts, each group keeping an ``"lr"``."""

    def __call__(self, params: ParamsT, /) -> torch.optim.Optimizer: ...


class ScheduleFactory(Protocol):
    """``sweeper.schedules``: an LR scheduler over ``optimizer`` for a run of ``epochs`` epochs of
    ``steps_per_epoch`` optimizer steps, stepped once per optimizer step, or, a ``ReduceLROnPlateau``,
    once per epoch with the validation loss; ``None`` keeps the optimizer's LR constant."""

    def __call__(
        self, optimizer: torch.optim.Optimizer, /, *, epochs: int, steps_per_epoch: int
    ) -> LRScheduler | None: ...


# --- tasks ---------------------------------------------------------------------------------------


class Meter(Protocol):
    """One epoch's metrics of one split, accumulated batch by batch on the training device."""

    def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
        """Add a batch: the model's outputs (detached) and the batch's targets."""

    def compute(self) -> dict[str, float]:
        """The split's metrics, named with its prefix (``val_rmse``); the validation meter also
        gives ``val_loss``, the training meter never ``train_loss`` (the trainer measures it)."""


class FittedTask(Protocol):
    """A task fitted to a data set's training split (``Task.fit``): ready to train and evaluate."""

    outputs: int  # the model's output width: the model factory's num_classes

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch: its mean over the batch (scalar, differentiable)."""

    def meter(self, split: str) -> Meter:
        """A fresh meter for ``split`` ("train" or "val")."""

    def head(self) -> torch.nn.Module | None:
        """A module appended to the exported model (e.g. back to the data's units), or None."""

    def output_info(self) -> dict[str, Any]:
        """export.json's ``output``: shape, dtype and what the exported model's output means."""


class Task(Protocol):
    """What a ``sweeper.tasks`` factory returns. ``metrics`` names what the task reports each
    epoch beside ``train_loss`` and ``val_loss`` (which every task reports; minimised), with the
    direction that is better; ``objective`` is the default objective, one of them. Trials of any
    task may train fused: each member's loss and metrics are its own task's."""

    metrics: dict[str, str]  # metric -> "maximize" | "minimize"
    objective: str

    def fit(self, data: DataSplits | DatasetSplits) -> FittedTask:
        """Check the targets (ValueError naming what is wrong) and learn what the task needs from
        the training split only; the result lives on the data's device."""


class TaskFactory(Protocol):
    """``sweeper.tasks``: a task from the spec's ``task.args`` alone."""

    def __call__(self) -> Task: ...


# --- search priors ------------------------------------------------------------------------------
# Declared in a factory's annotations (``Annotated[float, LogUniform(1e-4, 1e-1)]``): the range
# ``search.space: auto`` searches an argument over. Plain data, no spec import: the host turns
# each into a search-space parameter (``as_param``) and checks it there.

# A prior's condition: another argument of the same factory -> the value (or list of values, any
# of which) it must take for this argument to be searched, e.g. ``when={"momentum_on": True}``.
When = dict[str, Any]


@dataclass(frozen=True)
class Prior:
    """Base of the priors; ``when`` (keyword only) conditions it on other arguments of the factory."""

    when: When | None = field(default=None, kw_only=True)

    def as_param(self) -> dict[str, Any]:
        """The search-space parameter as the spec writes it (``{type: float, low: ..., ...}``),
        without the condition."""
        raise NotImplementedError


@dataclass(frozen=True)
class Uniform(Prior):
    """A float drawn uniformly from [low, high]."""

    low: float
    high: float

    def as_param(self) -> dict[str, Any]:
        return {"type": "float", "low": self.low, "high": self.high}


@dataclass(frozen=True)
class LogUniform(Prior):
    """A float whose logarithm is uniform on [log low, log high] (low > 0): learning rates, decays."""

    low: float
    high: float

    def as_param(self) -> dict[str, Any]:
        return {"type": "float", "low": self.low, "high": self.high, "log": True}


@dataclass(frozen=True)
class IntRange(Prior):
    """An int from [low, high], both included: in steps of ``step``, or log-uniform (widths)."""

    low: int
    high: int
    log: bool = False
    step: int = 1

    def as_param(self) -> dict[str, Any]:
        return {"type": "int", "low": self.low, "high": self.high, "log": self.log, "step": self.step}


@dataclass(frozen=True, init=False)
class Choice(Prior):
    """One of ``values`` (plain values: bool, int, float, str, None): ``Choice("relu", "gelu")``."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any, when: When | None = None) -> None:
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "when", when)

    def as_param(self) -> dict[str, Any]:
        return {"type": "categorical", "choices": list(self.values)}


# True while sweeper dry-builds the plugins before the first trial (sweeper/plan/preflight.py).
DRY_BUILD: ContextVar[bool] = ContextVar("sweeper_dry_build", default=False)


def in_dry_build() -> bool:
    """Whether the factories are being called for the dry build before the first trial (like
    Lightning's sanity check), not for a trial."""
    return DRY_BUILD.get()
