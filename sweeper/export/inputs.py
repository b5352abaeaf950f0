"""What an exported model takes, and the inputs its parity check runs.

Whole-tensor data (and datasets collated without a mask): one input ``x`` shaped
``(N, *sample_shape)``, the batch axis dynamic. Padded variable-length sequences (a collate_fn
that returns a mask, as ``pad_collate``): two inputs, ``x`` (N, L) or (N, C, L) and ``mask``
(N, L) bool, True where a position holds data, with the batch axis and the length axis L dynamic
(L from 1 to the data's longest, ``sample_shape[-1]``); the parity check then runs two different
lengths, so a file that fixed the length of its example would fail it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.trial.loading import first_batch

MAX_BATCH = 1 << 16  # upper bound of the dynamic batch axis (torch.export needs one > 1)
ODD_BATCH = 33  # the larger batch of the parity check: odd, so no power-of-two kernel path hides a bug
MASK_MEANING = "True where a position holds data; padding (False) only after a sequence's data, as pad_collate pads"


@dataclass(frozen=True)
class Signature:
    """The exported forward's inputs: ``x`` alone, or ``(x, mask)`` when ``length_axis`` is set
    (the axis of x, batch axis counted, that holds the positions; dynamic up to ``max_length``)."""

    sample_shape: tuple[int, ...]
    length_axis: int | None = None
    max_length: int = 0

    @classmethod
    def of(cls, data: DataSplits | DatasetSplits) -> Signature:
        """Padded data (its collated batches carry a mask) takes (x, mask); any other data x alone."""
        shape = tuple(data.input_shape)
        if isinstance(data, DatasetSplits) and first_batch(data, "val", 2).mask is not None:
            return cls(shape, length_axis=len(shape), max_length=shape[-1])
        return cls(shape)

    @property
    def masked(self) -> bool:
        return self.length_axis is not None

    @property
    def names(self) -> tuple[str, ...]:
        return ("x", "mask") if self.masked else ("x",)

    def dynamic_shapes(self) -> tuple[dict[int, Any], ...]:
        """torch.export's / the dynamo ONNX exporter's ``dynamic_shapes``, one dict per input; x
        and mask share one batch Dim and one length Dim (their sizes are equal by contract)."""
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        if self.length_axis is None:
            return ({0: batch},)
        length = torch.export.Dim("length", min=1, max=self.max_length)
        return ({0: batch, self.length_axis: length}, {0: batch, 1: length})

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """The same axes for the TorchScript-based ONNX exporter (input and output names)."""
        axes: dict[str, dict[int, str]] = {"x": {0: "batch"}, "output": {0: "batch"}}
        if self.length_axis is not None:
            axes["x"][self.length_axis] = "length"
            axes["mask"] = {0: "batch", 1: "length"}
        return axes

    def describe(self) -> dict[str, Any]:
        """export.json's ``input``: shapes with None on the dynamic axes, and the mask."""
        shape: list[int | None] = [None, *self.sample_shape]
        if self.length_axis is None:
            return {"shape": shape, "dtype": "float32", "batch_dim": 0}
        shape[self.length_axis] = None
        return {
            "name": "x",
            "shape": shape,
            "dtype": "float32",
            "batch_dim": 0,
            "length_dim": self.length_axis,
            "max_length": self.max_length,
            "mask": {"name": "mask", "shape": [None, None], "dtype": "bool", "meaning": MASK_MEANING},
        }


class Masked(nn.Module):
    """A sequence model (and its task's head) as exported for padded data: ``forward(x, mask)``,
    the mask a required input of the graph (the model's own forward takes it as an option)."""

    def __init__(self, model: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self.head = head if head is not None else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.model(x, mask=mask))


Inputs = tuple[torch.Tensor, ...]  # (x,) or (x, mask): the exported forward's arguments


@dataclass
class Cases:
    """The model inputs of an export: the example the exporters trace, the parity check's named
    batches (batch sizes 1 and 33, or for padded data two lengths), and the whole validation split."""

    example: Inputs
    parity: dict[str, Inputs]
    val: Inputs

    @classmethod
    def of(cls, data: DataSplits | DatasetSplits, signature: Signature, example_rows: int) -> Cases:
        if not signature.masked:
            val_x = data.val_inputs().detach().cpu().float()  # model inputs (input_transform applied)
            example = val_x[:example_rows]
            if len(example) < 2:  # torch.export fixes an axis of size 1
                example = example.expand(2, *example.shape[1:]).clone()
            parity: dict[str, Inputs] = {str(b): (val_x[:b],) for b in sorted({1, min(ODD_BATCH, len(val_x))})}
            return cls((example,), parity, (val_x,))
        assert isinstance(data, DatasetSplits)
        return cls(_padded(data, example_rows), _two_lengths(data), _padded(data, len(data.val_y)))


def _padded(data: DatasetSplits, rows: int) -> Inputs:
    """The first ``rows`` validation samples collated (padded to their longest), at least 2 rows."""
    batch = first_batch(data, "val", rows)
    x, mask = data.inputs(batch.x).detach().cpu().float(), batch.mask
    assert mask is not None
    if len(x) < 2:
        x, mask = x.expand(2, *x.shape[1:]).clone(), mask.expand(2, -1).clone()
    return x, mask.bool()


def _two_lengths(data: DatasetSplits) -> dict[str, Inputs]:
    """Two padded batches of different lengths, named 'ROWSxLENGTH': the first 33 validation
    samples at their longest length, and those of them no longer than the median length, cut to
    it (the shortest when the median is the longest). Samples all of one length give one batch."""
    x, mask = _padded(data, ODD_BATCH)
    lengths = mask.sum(1)
    longest = x.shape[-1]
    shorter = int(lengths.median())
    if shorter >= longest:
        shorter = int(lengths.min())
    cases: dict[str, Inputs] = {f"{len(x)}x{longest}": (x, mask)}
    if shorter < longest:
        rows = lengths <= shorter
        cut = (x[rows][..., :shorter].contiguous(), mask[rows][:, :shorter].contiguous())
        cases[f"{int(rows.sum())}x{shorter}"] = cut
    return cases
