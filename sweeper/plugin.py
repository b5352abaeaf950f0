"""The plugin contracts. Plugins are plain factories found through entry points; no base class.

Each kind has one entry-point group; the entry-point name is what a spec writes:

- ``sweeper.datasets``: ``factory(*, seed=..., **args) -> DataSplits``. ``seed`` (the sweep
  seed's "data" stream, so every trial sees the same split) is passed only when the factory accepts it.
- ``sweeper.models``: ``factory(*, input_shape, num_classes, **args) -> torch.nn.Module``.
- ``sweeper.optimizers``: ``factory(params, **args) -> torch.optim.Optimizer``
  (``torch.optim.SGD`` itself qualifies).
- ``sweeper.schedules``: ``factory(optimizer, *, epochs, steps_per_epoch, **args)`` returning an
  LR scheduler stepped once per optimizer step, a ``ReduceLROnPlateau`` stepped once per epoch
  with the validation loss, or ``None`` for a constant LR.

``ModelFactory``, ``DatasetFactory``, ``OptimizerFactory`` and ``ScheduleFactory`` type these
calls for a type checker: each protocol lists only what sweeper passes, so a factory satisfies it
when every argument a spec may set has a default.

Arguments from the spec are bound to the factory's signature before any training, so a
misspelt argument fails the sweep up front.

Before the first trial sweeper calls every factory once in its own process (the data set is
prepared there: downloaded or located) and takes one training step on a few samples on the CPU:
the dry build. ``in_dry_build()`` is True meanwhile, for a plugin with side effects meant only
for real trials (counting builds, logging to a service) to skip them.

The attributes a plugin may set for sweeper to read (``API_ATTR``, ``CHANNELS_LAST_ATTR``,
``FUSABLE_ATTR``) are named here and nowhere else. Versioning: the module an entry point names
may declare ``SWEEPER_PLUGIN_API = 1`` (or a list of versions); ``registry.get`` refuses a plugin
whose declaration excludes ``sweeper.PLUGIN_API_VERSION``. Undeclared means compatible. Full
contract: docs/plugins.md.
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

__all__ = [
    "API_ATTR",
    "CHANNELS_LAST_ATTR",
    "FUSABLE_ATTR",
    "DataSplits",
    "DatasetFactory",
    "ModelFactory",
    "Normalize",
    "OptimizerFactory",
    "ScheduleFactory",
    "SeededDatasetFactory",
    "UnseededDatasetFactory",
    "in_dry_build",
]

KINDS = ("datasets", "models", "optimizers", "schedules")
# Groups `sweeper plugins` lists: the four factory kinds plus search-space templates (templates.py).
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
# Arguments sweeper passes itself, per kind; a spec may not set them.
INJECTED = {
    "datasets": ("seed",),
    "models": ("input_shape", "num_classes"),
    "optimizers": ("params",),
    "schedules": ("optimizer", "epochs", "steps_per_epoch"),
}


@dataclass(frozen=True, eq=False)
class DataSplits:
    """What a dataset plugin returns: whole splits as tensors (held on the training device,
    batched by index: no per-sample Python work). The ``x`` tensors hold samples as stored
    (float32, or a compact dtype such as uint8 pixels with an ``input_transform``); ``inputs(x)``
    makes a batch of them model inputs."""

    train_x: torch.Tensor  # shape (N, *input_shape); float32, or any dtype input_transform reads
    train_y: torch.Tensor  # int64 class indices, shape (N,)
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...] | None = None
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
    logits; ``input_shape`` is one sample's shape, from the data set."""

    def __call__(self, *, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module: ...


class SeededDatasetFactory(Protocol):
    """``sweeper.datasets``, taking ``seed``: the sweep seed's "data" stream, the same for every
    trial of a sweep (so every trial sees the same split)."""

    def __call__(self, *, seed: int) -> DataSplits: ...


class UnseededDatasetFactory(Protocol):
    """``sweeper.datasets``, without ``seed`` (a split fixed on disk, say): called with the spec's
    arguments alone."""

    def __call__(self) -> DataSplits: ...


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


# True while sweeper dry-builds the plugins before the first trial (sweeper/trial/preflight.py).
DRY_BUILD: ContextVar[bool] = ContextVar("sweeper_dry_build", default=False)


def in_dry_build() -> bool:
    """Whether the factories are being called for the dry build before the first trial (like
    Lightning's sanity check), not for a trial."""
    return DRY_BUILD.get()
