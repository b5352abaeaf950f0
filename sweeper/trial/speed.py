"""What makes a trial fast on CUDA without changing what it computes (beyond float rounding):
the channels_last memory format for convolutional models, fused optimizer kernels, and the
opt-in ``train.compile``. On the CPU nothing here changes anything, so CPU runs stay bitwise
comparable with earlier ones (the reproducibility tests compare CPU runs)."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import torch
from torch import nn

from sweeper.plugin import CHANNELS_LAST_ATTR
from sweeper.pluginhost.binding import accepted_args

# Compiled forwards kept per process (each holds its generated kernels): the oldest goes first.
COMPILED_KEEP = 8
# torch.compile's backend (the tests use a cheaper one: inductor's first compilation of even a small
# CNN costs far more than a test may take; the figures: docs/gpu.md)
COMPILE_BACKEND = "inductor"
# Graphs torch.compile keeps for the one forward function of this module (torch's default is 8):
# per architecture kept, a training and an evaluation graph per batch size (and the last eval batch).
RECOMPILE_LIMIT = 64
log = logging.getLogger(__name__)


def channels_last(model: nn.Module, device: torch.device) -> bool:
    """True when ``model`` trains in channels_last (NHWC) on ``device``: on CUDA, a model with a
    2-D convolution that did not opt out. Tensor cores read NHWC without transposes: 1.2-1.5x
    for conv nets in AMP (benchmarks/gpu_check.py measures it)."""
    model = plain(model)
    return (
        device.type == "cuda"
        and getattr(model, CHANNELS_LAST_ATTR, True) is not False
        and any(isinstance(m, nn.Conv2d) for m in model.modules())
    )


def to_memory_format(model: nn.Module, device: torch.device) -> nn.Module:
    """The model (moved in place) in the layout it trains in on ``device``."""
    return model.to(memory_format=torch.channels_last) if channels_last(model, device) else model


def as_input(x: torch.Tensor, model_channels_last: bool) -> torch.Tensor:
    """A batch of model inputs in the model's layout (4-D batches only)."""
    return x.contiguous(memory_format=torch.channels_last) if model_channels_last and x.ndim == 4 else x


def optimizer_args(factory: Any, args: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``args`` plus ``fused=True`` on CUDA when the optimizer accepts it (torch's SGD, Adam,
    AdamW, ...) and the spec chose no implementation itself: one kernel per step for all
    parameters instead of several per tensor (foreach)."""
    chosen = {"fused", "foreach", "differentiable", "capturable"} & {k for k, v in args.items() if v}
    if device.type != "cuda" or chosen or "fused" in args:
        return dict(args)
    accepted = accepted_args(factory)
    return {**args, "fused": True} if accepted is not None and "fused" in accepted else dict(args)


class _Compiled:
    """One compiled forward per architecture: ``torch.compile`` of a functional call on a
    template module, with each trial's parameters and buffers passed in as inputs. A new trial
    of the same architecture (its own weights) and batch size reuses the compiled code; a
    compiled ``nn.Module`` would be specialised on its own instance."""

    def __init__(self, template: nn.Module) -> None:
        self.template = template

        def forward(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.template, params, (x,))

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        self.forward = torch.compile(forward, dynamic=False, backend=COMPILE_BACKEND)


class CompiledModel(nn.Module):
    """``model`` run through its architecture's compiled forward. Parameters, buffers, the
    state_dict and train()/eval() are the wrapped model's: the optimizer, checkpoints and
    export see the plain model (``CompiledModel.model``)."""

    def __init__(self, model: nn.Module, compiled: _Compiled) -> None:
        super().__init__()
        self.model = model
        self._compiled = compiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        template = self._compiled.template
        if template.training != self.training:
            template.train(self.training)
        tensors = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
        return self._compiled.forward(tensors, x)


def architecture(model: nn.Module) -> str:
    """What a compiled forward depends on: module structure, parameter and buffer shapes, layouts."""
    layout = [
        (name, tuple(t.shape), t.dtype, t.is_contiguous(memory_format=torch.channels_last) and t.ndim == 4)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    ]
    return f"{model!r}|{layout}"


class CompiledForwards:
    """The compiled forwards of one process (``train.compile``), by architecture: compiled on
    first use per architecture, batch size and train/eval mode, then reused by every later trial
    the process trains (held with its data set, see build.ProcessCache). At most COMPILED_KEEP
    architectures: the oldest goes first."""

    def __init__(self) -> None:
        self.forwards: dict[str, _Compiled] = {}

    def __len__(self) -> int:
        return len(self.forwards)

    def model(self, model: nn.Module) -> nn.Module:
        """``model`` with its architecture's compiled forward."""
        key = architecture(model)
        if key not in self.forwards:
            if len(self.forwards) >= COMPILED_KEEP:
                self.forwards.pop(next(iter(self.forwards)))
            started = time.perf_counter()
            self.forwards[key] = _Compiled(copy.deepcopy(model))
            log.debug("new compiled forward (%.2f s to set up)", time.perf_counter() - started)
        return CompiledModel(model, self.forwards[key])


def plain(model: nn.Module) -> nn.Module:
    """The model a CompiledModel wraps (itself otherwise): what is saved and exported."""
    return model.model if isinstance(model, CompiledModel) else model
