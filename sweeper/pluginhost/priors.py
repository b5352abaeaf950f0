"""The search priors a plugin declares for its arguments: ``Annotated[float, LogUniform(...)]`` in
its factory's signature (types of sweeper.plugin), read here and turned into search-space
parameters; plus sweeper's own table for torch's optimizers, registered as they are (torch's
classes carry no priors). What ``search.space: auto`` derives a space from (auto_space.py)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sweeper.errors import UserError
from sweeper.plugin import LogUniform, Prior, Uniform
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import factory_annotations, own_args
from sweeper.pluginhost.registry import singular
from sweeper.spec import space as sp

# torch.optim's optimizers are their own plugins (pyproject: sgd = "torch.optim:SGD"): their priors,
# keyed by class. Ranges: the usual ones of tuned recipes (SGD trains at LRs of 1e-3..1, Adam and
# AdamW at 1e-5..1e-1; AdamW's decoupled decay at 1e-4..1e-1, while the L2 decay of SGD and Adam
# is added to the gradient itself, so its useful values are a hundred times smaller).
TORCH_OPTIMIZERS: dict[str, dict[str, Prior]] = {
    "torch.optim.sgd.SGD": {
        "lr": LogUniform(1e-3, 1.0),
        "momentum": Uniform(0.0, 0.99),
        "weight_decay": LogUniform(1e-6, 1e-3),
    },
    "torch.optim.adam.Adam": {"lr": LogUniform(1e-5, 1e-1), "weight_decay": LogUniform(1e-6, 1e-3)},
    "torch.optim.adamw.AdamW": {"lr": LogUniform(1e-5, 1e-1), "weight_decay": LogUniform(1e-4, 1e-1)},
}
_PARAM: TypeAdapter[Any] = TypeAdapter(sp.Param)


@dataclass(frozen=True)
class Declared:
    """One argument's prior: the search-space parameter (without condition), the other arguments
    of the factory it is conditioned on, and where it is declared (for `sweeper validate`)."""

    param: sp.Param
    when: dict[str, Any]
    origin: str


def _table_key(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', '')}"


def annotated_priors(factory: Callable[..., Any], kind: str) -> dict[str, Prior]:
    """The priors in ``factory``'s annotations, by argument (the last one when several), for the
    arguments a spec may set; sweeper's table for a torch optimizer class."""
    if _table_key(factory) in TORCH_OPTIMIZERS:
        return dict(TORCH_OPTIMIZERS[_table_key(factory)])
    hints = factory_annotations(factory)
    found: dict[str, Prior] = {}
    for p in own_args(kind, factory):
        hint = hints.get(p.name)
        if hint is not None and typing.get_origin(hint) is typing.Annotated:
            priors = [m for m in hint.__metadata__ if isinstance(m, Prior)]
            if priors:
                found[p.name] = priors[-1]
    return found


def describe(param: sp.Param) -> str:
    """A search-space entry in one line: ``int 32..512 log``, ``one of [mlp, cnn]``, with its condition."""
    if isinstance(param, sp.CategoricalParam):
        text = f"one of {param.choices}"
    else:
        text = f"{param.type} {param.low:g}..{param.high:g}" + (" log" if param.log else "")
        step = param.step if isinstance(param, sp.FloatParam) else (param.step if param.step != 1 else None)
        text += f" step {step:g}" if step else ""
    conditions = ", ".join(f"{dep}={value}" for dep, value in (param.when or {}).items())
    return f"{text} when {conditions}" if conditions else text


def prior_text(prior: Prior) -> str:
    """A prior as `sweeper plugins show` lists it: ``int 32..512 log``, ``one of [3, 5]``, with
    its condition on other arguments; a malformed one as written."""
    try:
        param = _PARAM.validate_python(prior.as_param())
    except (ValidationError, NotImplementedError):
        return f"{prior!r} (malformed)"
    conditions = ", ".join(f"{arg}={value}" for arg, value in (prior.when or {}).items())
    return describe(param) + (f" when {conditions}" if conditions else "")


def declared(kind: str, name: str) -> dict[str, Declared]:
    """The priors plugin ``name`` of ``kind`` declares, checked: a malformed one (low > high, a
    condition on an argument it does not have) is a UserError naming the plugin and argument."""
    factory = registry.get(kind, name)
    info = registry.info(kind, name)
    table = _table_key(factory) in TORCH_OPTIMIZERS
    origin = f"sweeper's table for {info.target}" if table else f"annotation of {info.target} ({info.distribution})"
    priors = annotated_priors(factory, kind)
    arguments = {p.name for p in own_args(kind, factory)}
    out = {}
    for arg, prior in priors.items():
        where = f"{singular(kind)} plugin '{name}' declares for '{arg}' the prior {prior!r}"
        try:
            param = _PARAM.validate_python(prior.as_param())
        except (ValidationError, NotImplementedError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else "not a concrete prior"
            detail = detail.removeprefix("Value error, ")
            raise UserError(f"{where}: {detail}. The plugin comes from {info.where}.") from None
        when = dict(prior.when or {})
        strangers = sorted(set(when) - arguments)
        if strangers:
            raise UserError(
                f"{where}: its condition names '{strangers[0]}', which is not an argument of the plugin "
                f"(it has: {', '.join(sorted(arguments))}). The plugin comes from {info.where}."
            )
        out[arg] = Declared(param, when, origin)
    return out
