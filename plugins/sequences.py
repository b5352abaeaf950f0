"""Small sequence classifiers: conv1d, gru, transformer. Each takes a batch shaped (N, L) (one
value per position, as MNIST-1D gives it) or (N, C, L) (C channels per position), and an optional
``mask`` (N, L), True at the positions that hold data: padded positions then change neither the
features pooled nor the logits. Without a mask every position counts. The forward has one tensor
argument besides the optional mask, so TorchScript, torch.export and ONNX export it as they do
any model (the mask, left at None, is not an input of the exported graph)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from sweeper.plugin import DATA_KINDS_ATTR, Choice, IntRange, Uniform
from sweeper_plugins.models import Depth, Probability, Width

Kernel = Annotated[int, Field(ge=1, le=1_025)]  # positions a convolution sees
Heads = Annotated[int, Field(ge=1, le=1_024)]


def _channels_and_length(input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(channels, length) of a sample shaped (L,) or (C, L)."""
    if len(input_shape) == 1:
        return 1, input_shape[0]
    if len(input_shape) == 2:
        return input_shape[0], input_shape[1]
    raise ValueError(f"a sequence model takes samples shaped (L,) or (C, L), got {tuple(input_shape)}")


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    """(N, L) -> (N, 1, L); (N, C, L) as it is."""
    return x.unsqueeze(1) if x.dim() == 2 else x


def _masked_mean(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``h`` (N, L, D) over the positions (dim 1) the mask (N, L) keeps."""
    if mask is None:
        return h.mean(1)
    keep = mask.to(h.dtype).unsqueeze(-1)
    return (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)


class Conv1dNet(nn.Module):
    """``depth`` x (Conv1d(kernel, same padding) -> BatchNorm -> ReLU), widths doubling every
    other layer, then mean pooling over positions -> Dropout -> Linear. Stride 1, so the mask
    keeps its meaning at every layer: padded positions are zeroed before each convolution."""

    def __init__(self, channels: int, num_classes: int, width: int, depth: int, kernel_size: int, dropout: float):
        super().__init__()
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        c_in = channels
        for i in range(depth):
            c_out = width * 2 ** (i // 2)
            self.convs.append(nn.Conv1d(c_in, c_out, kernel_size, padding=kernel_size // 2, bias=False))
            self.norms.append(nn.BatchNorm1d(c_out))
            c_in = c_out
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = _channels_first(x)
        for conv, norm in zip(self.convs, self.norms):
            if mask is not None:
                h = h * mask.unsqueeze(1).to(h.dtype)
            h = F.relu(norm(conv(h)))
        return self.head(self.dropout(_masked_mean(h.transpose(1, 2), mask)))


def conv1d(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    width: Annotated[Width, IntRange(16, 128, log=True)] = 32,
    # widths double every other layer: 2**32 times the first at most
    depth: Annotated[int, Field(ge=1, le=64), IntRange(1, 4)] = 3,
    kernel_size: Annotated[Kernel, Choice(3, 5, 7)] = 5,
    dropout: Annotated[Probability, Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """A 1-D CNN: ``depth`` convolutions of ``kernel_size`` (odd sizes keep the length), global
    mean pooling, a linear head."""
    channels, _ = _channels_and_length(input_shape)
    return Conv1dNet(channels, num_classes, width, depth, kernel_size, dropout)


class GRUNet(nn.Module):
    """A unidirectional GRU over the positions; the last position's output (with a mask: the
    last position the mask keeps) -> Dropout -> Linear."""

    def __init__(self, channels: int, num_classes: int, hidden: int, depth: int, dropout: float):
        super().__init__()
        self.gru = nn.GRU(channels, hidden, num_layers=depth, batch_first=True, dropout=dropout if depth > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out, _ = self.gru(_channels_first(x).transpose(1, 2))  # (N, L, hidden)
        if mask is None:
            last = out[:, -1]
        else:  # padding follows the data, so a position's output never saw the padding
            index = (mask.long().sum(1) - 1).clamp(min=0)
            last = out[torch.arange(out.shape[0], device=out.device), index]
        return self.head(self.dropout(last))


def gru(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Annotated[Width, IntRange(16, 256, log=True)] = 64,
    depth: Annotated[int, Field(ge=1, le=64), IntRange(1, 3)] = 1,  # stacked GRU layers
    dropout: Annotated[Probability, Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """A GRU classifier (Cho et al. 2014): ``depth`` stacked layers of ``hidden`` units, the
    final state read by a linear head."""
    channels, _ = _channels_and_length(input_shape)
    return GRUNet(channels, num_classes, hidden, depth, dropout)


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block: x + Attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        n, length, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(n, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (N, heads, L, width / heads)
        # (N, 1, 1, L): a query never attends to padding
        attn_mask = None if mask is None else mask[:, None, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.dropout(self.proj(a.transpose(1, 2).reshape(n, length, width)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class TransformerNet(nn.Module):
    """Linear embedding of each position + sinusoidal positions -> ``depth`` encoder blocks ->
    LayerNorm -> mean pooling over positions -> Linear."""

    if TYPE_CHECKING:  # not at run time: TorchScript cannot read the annotation (a string here)
        positions: torch.Tensor  # (max_length, width), a buffer

    def __init__(
        self,
        channels: int,
        length: int,
        num_classes: int,
        width: int,
        depth: int,
        heads: int,
        mlp_ratio: int,
        dropout: float,
    ):
        super().__init__()
        self.embed = nn.Linear(channels, width)
        self.register_buffer("positions", _sinusoids(length, width), persistent=False)
        self.blocks = nn.ModuleList([EncoderBlock(width, heads, mlp_ratio, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(_channels_first(x).transpose(1, 2))  # (N, L, width)
        if h.shape[1] > self.positions.shape[0]:
            raise ValueError(
                f"a sequence of {h.shape[1]} positions is longer than max_length ({self.positions.shape[0]})"
            )
        h = h + self.positions[: h.shape[1]]
        for block in self.blocks:
            h = block(h, mask)
        return self.head(_masked_mean(self.norm(h), mask))


def _sinusoids(length: int, width: int) -> torch.Tensor:
    """The fixed sine/cosine position codes of Vaswani et al. 2017, (length, width)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10_000.0) / width))
    codes = torch.zeros(length, width)
    codes[:, 0::2] = torch.sin(position * frequency)
    codes[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return codes


def transformer(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    width: Annotated[Width, Choice(32, 64, 128)] = 32,
    depth: Annotated[Depth, IntRange(1, 4)] = 2,
    heads: Annotated[Heads, Choice(1, 2, 4)] = 4,  # must divide width (each prior's choice does)
    mlp_ratio: Annotated[int, Field(ge=1, le=16), Choice(2, 4)] = 2,  # the MLP's hidden units, times width
    dropout: Annotated[Probability, Uniform(0.0, 0.3)] = 0.0,
    max_length: Annotated[int, Field(ge=1, le=1_000_000)] | None = None,  # positions coded; None: the data's length
) -> nn.Module:
    """A small Transformer encoder classifier (pre-norm blocks, sinusoidal positions, mean
    pooling). ``max_length`` bounds the sequences it accepts (default: the data's length)."""
    channels, length = _channels_and_length(input_shape)
    if width % heads:
        raise ValueError(f"heads ({heads}) must divide width ({width})")
    return TransformerNet(channels, max_length or length, num_classes, width, depth, heads, mlp_ratio, dropout)


for _model in (conv1d, gru, transformer):
    setattr(_model, DATA_KINDS_ATTR, ("sequence",))
