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

Arguments from the spec are bound to the factory's signature before any training, so a
misspelt argument fails the sweep up front.

Before the first trial sweeper calls every factory once in its own process (the data set is
prepared there: downloaded or located) and takes one training step on a few samples on the CPU:
the dry build. ``in_dry_build()`` is True meanwhile, for a plugin with side effects meant only
for real trials (counting builds, logging to a service) to skip them.

Versioning: the module an entry point names may declare ``SWEEPER_PLUGIN_API = 1`` (or a list
of versions); ``registry.get`` refuses a plugin whose declaration excludes
``sweeper.PLUGIN_API_VERSION``. Undeclared means compatible. Full contract: docs/plugins.md.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

KINDS = ("datasets", "models", "optimizers", "schedules")
# Groups `sweeper plugins` lists: the four factory kinds plus search-space templates (templates.py).
LISTED = (*KINDS, "search_spaces")
# Module attribute through which a plugin declares the plugin-API version(s) it targets.
API_ATTR = "SWEEPER_PLUGIN_API"
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
    batched by index: no per-sample Python work)."""

    train_x: torch.Tensor  # float32, shape (N, *input_shape)
    train_y: torch.Tensor  # int64 class indices, shape (N,)
    val_x: torch.Tensor
    val_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...] | None = None
    # Batch augmentation, applied on the training device to each training batch:
    # (batch, generator) -> batch. The generator lives on the batch's device.
    train_transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # Per-channel normalisation already applied to the tensors; exported with the model.
    normalization: dict[str, list[float]] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def to(self, device: torch.device) -> DataSplits:
        from dataclasses import replace

        return replace(self, train_x=self.train_x.to(device), train_y=self.train_y.to(device),
                       val_x=self.val_x.to(device), val_y=self.val_y.to(device))


# True while sweeper dry-builds the plugins before the first trial (sweeper/trial/preflight.py).
DRY_BUILD: ContextVar[bool] = ContextVar("sweeper_dry_build", default=False)


def in_dry_build() -> bool:
    """Whether the factories are being called for the dry build before the first trial (like
    Lightning's sanity check), not for a trial."""
    return DRY_BUILD.get()
