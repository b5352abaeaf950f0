"""How a fused group computes its members' outputs and gradients: the layered layout, or vmap.
Each member's loss is its own task's (fused.py hands the engine the losses to take).

Layered (HFTA, Wang et al., MLSys 2021): the members' activations travel as one tensor of shape
(batch, members x channels, ...), member-major. A Conv2d becomes one grouped convolution (groups =
members x its own groups), a BatchNorm normalises members x channels channels (each member's
statistics its own), a Linear is one batched matmul, and the layers that act per channel or per
element (activations, pooling, dropout, flatten from dim 1) run unchanged. One large kernel per
layer instead of vmap's per-layer moves of the member dimension: faster than vmap at every group
size benchmarks/fused.py times (docs/fused-trials.md#speed).

It is used when every leaf module of the model has such a form, and only after its predictions on
the first validation batch equal vmap's (a model whose own forward mixes channels, say ``x.mean(1)``,
would mix members: it is caught there). Otherwise vmap (torch.func) over a ``functional_call`` of
the member's model, which fuses any model vmap can batch. Either way the backward is autograd's,
through the members' losses summed (the members share no parameter).

Pure PyTorch: no optuna, mlflow or ray here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

Tensors = dict[str, torch.Tensor]
# each member's loss: (outputs (members, batch, outputs), targets (members, batch, ...)) -> (members,)
Losses = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# On a CPU, the layered model's evaluation goes in pieces of at most this many samples x members:
# a whole evaluation batch of many members is slower a sample, its activations out of the caches
# (docs/fused-trials.md#speed)
CPU_EVAL_ROWS = 4096
# the layers that act per element or per channel, with no parameters: the same module serves the layout
AS_IS = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.GELU,
    nn.SiLU,
    nn.ELU,
    nn.Tanh,
    nn.Sigmoid,
    nn.Hardswish,
    nn.Mish,
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)


class NotFusable(Exception):
    """The fused model failed before anything trained (a forward that vmap cannot batch, say):
    the members can train one at a time instead."""

    @classmethod
    def because(cls, exc: Exception) -> NotFusable:
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        return cls(f"the fused step failed ({type(exc).__name__}: {first_line})")


class FusedConv2d(nn.Module):
    """A Conv2d of every member at once: weight (members, out, in/groups, kh, kw) as one grouped
    convolution over (batch, members x in, h, w)."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias  # replaced by the stacked tensors at each call
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members = self.weight.shape[0]
        bias = None if self.bias is None else self.bias.flatten()
        return F.conv2d(
            x, self.weight.flatten(0, 1), bias, self.stride, self.padding, self.dilation, self.groups * members
        )


class FusedLinear(nn.Module):
    """A Linear of every member at once: (batch, members x in) -> (batch, members x out), one bmm."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, out_features, in_features = self.weight.shape
        if x.dim() != 2:
            raise ValueError("the layered layout takes a Linear's input as (batch, members x features) only")
        h = x.view(x.shape[0], members, in_features).transpose(0, 1)  # (members, batch, in)
        out = (
            torch.bmm(h, self.weight.transpose(1, 2))
            if self.bias is None
            else torch.baddbmm(self.bias[:, None, :], h, self.weight.transpose(1, 2))
        )
        return out.transpose(0, 1).reshape(x.shape[0], members * out_features)


class FusedBatchNorm(nn.Module):
    """A BatchNorm1d/2d of every member at once: members x channels channels, as torch's module."""

    # its buffers (register_buffer), None where the BatchNorm has none
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__()
        self.weight, self.bias = norm.weight, norm.bias
        for name in ("running_mean", "running_var", "num_batches_tracked"):  # replaced at each call, as the weights
            self.register_buffer(name, getattr(norm, name))
        self.momentum, self.eps, self.track_running_stats = norm.momentum, norm.eps, norm.track_running_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)  # (members,): they step together, so one count for all
            if self.momentum is None:  # a cumulative average, as torch's module
                momentum = 1.0 / float(self.num_batches_tracked[0])
        use_batch = self.training or self.running_mean is None
        flat = [
            None if t is None else t.flatten() for t in (self.running_mean, self.running_var, self.weight, self.bias)
        ]
        running = flat[:2] if not self.training or self.track_running_stats else [None, None]
        return F.batch_norm(x, running[0], running[1], flat[2], flat[3], use_batch, momentum, self.eps)


def layered(template: nn.Module) -> nn.Module | None:
    """The template's layered twin, or None where a leaf module has no layered form."""
    model = copy.deepcopy(template)
    for name, module in list(model.named_modules()):
        if any(True for _ in module.children()) or isinstance(module, AS_IS):
            continue
        if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros":
            fused: nn.Module = FusedConv2d(module)
        elif type(module) is nn.Linear:
            fused = FusedLinear(module)
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            fused = FusedBatchNorm(module)
        elif isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1:
            continue
        else:
            return None
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, fused)
    return model


def layout(x: torch.Tensor) -> torch.Tensor:
    """(members, batch, channels, ...) -> (batch, members x channels, ...), channels-last on a CPU
    for images (oneDNN's grouped convolutions run faster in that layout on digits' shapes:
    docs/fused-trials.md#speed)."""
    out = x.transpose(0, 1).flatten(1, 2)
    if out.dim() == 4 and out.device.type == "cpu":
        return out.contiguous(memory_format=torch.channels_last)
    return out


def members_first(out: torch.Tensor, members: int) -> torch.Tensor:
    """(batch, members x outputs) -> (members, batch, outputs)."""
    if out.dim() != 2 or out.shape[1] % members:
        raise ValueError(f"the layered model's output has shape {tuple(out.shape)}, not (batch, {members} x outputs)")
    return out.view(out.shape[0], members, -1).transpose(0, 1)


class Engine:
    """One fused forward and backward: ``step`` gives each member's gradients, loss and outputs;
    ``predict`` each member's outputs on a shared batch. The losses are the members' tasks'
    (fused.py): the engine only lays the members out."""

    def __init__(
        self,
        template: nn.Module,
        layered_model: nn.Module | None,
        autocast: Callable[[], AbstractContextManager[object]],
    ) -> None:
        self.template, self.model, self.autocast = template, layered_model, autocast
        self.kind = "vmap" if layered_model is None else "layered"

    def step(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, losses: Losses, weight: float
    ) -> tuple[Tensors, torch.Tensor, torch.Tensor]:
        """x (members, batch, ...), y (members, batch, ...): (gradients, each member's loss
        (members,), outputs (members, batch, outputs)). ``losses`` gives each member's loss of
        its outputs (its task's: the mean over its batch); ``weight`` is the micro-batch's share
        of the batch (accumulation, as the solo trainer weighs it)."""
        leaves = {name: tensor.detach().requires_grad_() for name, tensor in params.items()}
        with self.autocast():  # as the solo trainer: the forward and the loss under autocast (bf16 on CUDA)
            out = self._forward(leaves, buffers, x)
            loss = losses(out, y)
        # the members share no parameter: each member's gradient is its own loss's, as solo
        grads = torch.autograd.grad(loss.sum() * weight, list(leaves.values()))
        return dict(zip(leaves, grads)), loss.detach(), out.detach()

    def _forward(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> torch.Tensor:
        """The training forward of every member: (members, batch, ...) -> (members, batch, outputs)."""
        if self.model is None:
            template = self.template.train()
            each = vmap(lambda p, b, xs: functional_call(template, (p, b), (xs,)), randomness="different")
            return each(params, buffers, x)
        self.model.train()
        return members_first(functional_call(self.model, (params, buffers), (layout(x),)), x.shape[0])

    def predict(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> torch.Tensor:
        """Every member's outputs on one batch x (batch, ...): (members, batch, outputs), eval mode."""
        members = next(iter(params.values())).shape[0]
        if self.model is None:
            template = self.template.eval()
            return vmap(lambda p, b: functional_call(template, (p, b), (x,)))(params, buffers)
        self.model.eval()
        step = max(1, CPU_EVAL_ROWS // members) if x.device.type == "cpu" else x.shape[0]
        return torch.cat(
            [
                members_first(
                    functional_call(self.model, (params, buffers), (layout(piece.expand(members, *piece.shape)),)),
                    members,
                )
                for piece in x.split(step)
            ],
            dim=1,
        )


def engine(
    template: nn.Module,
    params: Tensors,
    buffers: Tensors,
    sample: torch.Tensor,
    autocast: Callable[[], AbstractContextManager[object]],
    allow_layered: bool = True,
) -> Engine:
    """The layered engine where the model has a layered form whose predictions on ``sample`` (a
    validation batch) equal vmap's; else vmap. NotFusable where vmap cannot run the model."""
    vmapped = Engine(template, None, autocast)
    with torch.no_grad():
        try:
            reference = vmapped.predict(params, buffers, sample)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # vmap's refusal (data-dependent control flow, say), or the model's
            raise NotFusable.because(exc) from exc
        model = layered(template) if allow_layered else None
        if model is None:
            return vmapped
        candidate = Engine(template, model, autocast)
        try:
            mine = candidate.predict(params, buffers, sample)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception:  # a layer used in a way the layout does not allow (a Linear on 3-d input, say)
            return vmapped
    # a member mixed with another differs by O(1); float rounding (TF32 on a GPU) by far less
    if mine.shape != reference.shape or not torch.allclose(mine.float(), reference.float(), rtol=1e-2, atol=1e-3):
        return vmapped
    return candidate
