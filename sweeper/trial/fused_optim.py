"""One optimizer step for every member of a fused group at once (trial/fused.py): torch's SGD,
Adam and AdamW updates written over the stacked (members, ...) tensors, each member's
hyperparameters a (members, 1, ...) tensor. N members cost one update per parameter name instead
of N optimizer steps, which were a large share of a fused model's time
(docs/fused-trials.md#speed).

Each member keeps its own torch optimizer: its schedule sets its param group's learning rate (and
momentum or betas) as in a solo run, and this step reads them there before every update; at the
end its state (step count, moments, momentum buffer) is written back into that optimizer, so a
member's checkpoint is the one its solo run would save. The arithmetic follows torch's
single-tensor implementations (torch/optim/adam.py, sgd.py), with the per-member scalars computed
in double precision as torch computes its Python scalars: a member follows its solo run up to
float rounding (tests/test_fused.py).

Anything else (another optimizer, several param groups, amsgrad, maximize, ...) is stepped per
member by its own optimizer: ``why_not_stacked`` says why.
"""

from __future__ import annotations

import math

import torch

KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}
# settings these updates do not implement: must be off (False or None)
OFF = ("maximize", "amsgrad", "capturable", "differentiable", "fused")


def why_not_stacked(optimizers: list[torch.optim.Optimizer]) -> str | None:
    """None if one StackedOptimizer can step these members' optimizers; else why not."""
    kinds = {KINDS.get(type(o)) for o in optimizers}
    if None in kinds or len(kinds) != 1:
        return "the members' optimizers are not all the same one of torch's SGD, Adam or AdamW"
    for optimizer in optimizers:
        if len(optimizer.param_groups) != 1:
            return "an optimizer has several param groups"
        group = optimizer.param_groups[0]
        on = [name for name in OFF if group.get(name)]
        if on or isinstance(group["lr"], torch.Tensor):
            return f"an optimizer sets {', '.join(on) or 'a tensor learning rate'}"
    return None


class StackedOptimizer:
    """Steps the stacked parameters of ``names`` (the members' optimized parameters, by name)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], names: list[str]) -> None:
        self.kind = KINDS[type(optimizers[0])]
        self.optimizers, self.names = optimizers, names
        self.steps = 0
        self.state: dict[str, dict[str, torch.Tensor]] = {}  # name -> moment or momentum buffer, stacked
        for optimizer in optimizers:  # their schedules see them stepped (torch warns otherwise)
            optimizer._opt_called = True  # type: ignore[attr-defined]

    def keep(self, rows: list[int]) -> None:
        """Members left: only ``rows`` (their indices among the stacked ones) stay."""
        index = None
        for buffers in self.state.values():
            for key, value in buffers.items():
                index = torch.tensor(rows, device=value.device) if index is None else index
                buffers[key] = value.index_select(0, index)
        self.optimizers = [self.optimizers[k] for k in rows]

    def _hyper(self, device: torch.device) -> dict[str, torch.Tensor]:
        """Per-member values, (members,) float32 tensors on ``device``, read from each member's
        param group (its schedule may have changed them), derived in double as torch does."""
        groups = [o.param_groups[0] for o in self.optimizers]
        step = self.steps
        values: dict[str, list[float]] = {"lr": [g["lr"] for g in groups], "wd": [g["weight_decay"] for g in groups]}
        if self.kind == "sgd":
            values.update(
                momentum=[g["momentum"] for g in groups],
                keep=[1 - g["dampening"] for g in groups],
                nesterov=[float(g["nesterov"]) for g in groups],
            )
        else:
            betas = [g["betas"] for g in groups]
            values.update(
                decay=[1 - g["lr"] * g["weight_decay"] for g in groups],
                one_minus_beta1=[1 - b1 for b1, _ in betas],
                beta2=[b2 for _, b2 in betas],
                one_minus_beta2=[1 - b2 for _, b2 in betas],
                step_size=[g["lr"] / (1 - b1**step) for g, (b1, _) in zip(groups, betas)],
                bias2_sqrt=[math.sqrt(1 - b2**step) for _, b2 in betas],
                eps=[g["eps"] for g in groups],
            )
        table = torch.tensor(list(values.values()), dtype=torch.float32, device=device)  # one copy to the device
        return dict(zip(values, table))

    @torch.no_grad()
    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        self.steps += 1
        hyper = self._hyper(params[self.names[0]].device)
        for name in self.names:
            param, grad = params[name], grads[name]
            shape = (-1,) + (1,) * (param.ndim - 1)
            h = {key: value.view(shape) for key, value in hyper.items()}
            if self.kind == "sgd":
                self._sgd(name, param, grad, h)
            else:
                self._adam(name, param, grad, h)

    def _sgd(self, name: str, param: torch.Tensor, grad: torch.Tensor, h: dict[str, torch.Tensor]) -> None:
        grad = grad + param * h["wd"]
        if bool((h["momentum"] != 0).any()):
            if name not in self.state:  # the first step: the buffer starts as the gradient
                self.state[name] = {"momentum_buffer": grad.clone()}
            else:
                self.state[name]["momentum_buffer"].mul_(h["momentum"]).add_(grad * h["keep"])
            buf = self.state[name]["momentum_buffer"]
            moved = torch.where(h["nesterov"] != 0, grad + buf * h["momentum"], buf)
            grad = torch.where(h["momentum"] != 0, moved, grad)  # no momentum: the gradient itself
        param.add_(grad * -h["lr"])

    def _adam(self, name: str, param: torch.Tensor, grad: torch.Tensor, h: dict[str, torch.Tensor]) -> None:
        if self.kind == "adamw":
            param.mul_(h["decay"])
        else:
            grad = grad + param * h["wd"]
        if name not in self.state:
            self.state[name] = {"exp_avg": torch.zeros_like(param), "exp_avg_sq": torch.zeros_like(param)}
        exp_avg, exp_avg_sq = self.state[name]["exp_avg"], self.state[name]["exp_avg_sq"]
        exp_avg.lerp_(grad, h["one_minus_beta1"])
        exp_avg_sq.mul_(h["beta2"]).add_(grad * grad * h["one_minus_beta2"])
        denom = (exp_avg_sq.sqrt() / h["bias2_sqrt"]).add_(h["eps"])
        param.add_(exp_avg / denom * -h["step_size"])

    def write_back(self, params_of: list[dict[str, torch.nn.Parameter]]) -> None:
        """Each member's optimizer state as its own torch optimizer would hold it (copies):
        ``params_of[k]`` maps names to member k's parameters (the optimizer's state keys)."""
        for k, (optimizer, params) in enumerate(zip(self.optimizers, params_of)):
            momentum = optimizer.param_groups[0].get("momentum", 0)
            for name in self.names:
                stacked = self.state.get(name, {})
                if self.kind == "sgd":  # torch keeps no state for SGD without momentum
                    if momentum:
                        optimizer.state[params[name]] = {"momentum_buffer": stacked["momentum_buffer"][k].clone()}
                else:
                    optimizer.state[params[name]] = {
                        "step": torch.tensor(float(self.steps)),
                        **{key: value[k].clone() for key, value in stacked.items()},
                    }
