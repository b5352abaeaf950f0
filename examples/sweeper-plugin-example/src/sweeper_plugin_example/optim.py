"""Optimizer plugin `lion`: Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
Algorithms"). The update is the sign of a momentum/gradient mix, so every weight moves by
exactly ``lr`` per step: use a learning rate 3-10x smaller than AdamW's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any

import torch

from sweeper.plugin import LogUniform, Uniform

SWEEPER_PLUGIN_API = 1


class Lion(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(
                f"Lion: need lr > 0, 0 <= betas < 1, weight_decay >= 0 (got {lr}, {betas}, {weight_decay})"
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                momentum = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled weight decay
                update = momentum.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


def lion(
    params: Iterable[Any],
    *,
    # the search priors `search.space: auto` uses (Lion: LRs 3-10x smaller than AdamW's, decay larger)
    lr: Annotated[float, LogUniform(1e-5, 1e-3)] = 1e-4,
    beta1: Annotated[float, Uniform(0.8, 0.95)] = 0.9,
    beta2: Annotated[float, Uniform(0.95, 0.999)] = 0.99,
    weight_decay: Annotated[float, LogUniform(1e-3, 1.0)] = 0.0,
) -> Lion:
    """Lion over ``params`` (parameters, or parameter-group dicts as torch.optim takes them).

    The betas are separate scalar arguments so a spec can search each one."""
    return Lion(params, lr=lr, betas=(beta1, beta2), weight_decay=weight_decay)
