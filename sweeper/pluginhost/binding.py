"""Binding a spec's plugin arguments to the factories' signatures before any compute is spent,
and the provenance (distribution, version) of the plugins a spec uses."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from sweeper.errors import UserError
from sweeper.plugin import INJECTED
from sweeper.pluginhost import registry
from sweeper.pluginhost.registry import did_you_mean, singular
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp

# spec section -> plugin kind
SECTIONS = {"dataset": "datasets", "model": "models", "optimizer": "optimizers", "schedule": "schedules"}


def plugin_choices(spec: SweepSpec, section: str) -> list[str]:
    """Every plugin name a section can take: the fixed one, or the searched choices."""
    param = spec.search.space.get(f"{section}.plugin")
    if isinstance(param, sp.CategoricalParam):
        return [str(c) for c in param.choices]
    return [getattr(spec, section).plugin]


def check_plugins(spec: SweepSpec) -> None:
    """Import each plugin the spec can use and bind its fixed and searched arguments to the
    factory's signature; raises UserError naming the dotted path of a bad argument."""
    for section, kind in SECTIONS.items():
        ref = getattr(spec, section)
        prefix = f"{section}.args."
        for name in plugin_choices(spec, section):
            args: dict[str, Any] = dict(ref.args)
            for path, param in spec.search.space.items():
                condition = (param.when or {}).get(f"{section}.plugin", name)
                if path.startswith(prefix) and condition == name:
                    args[path.removeprefix(prefix)] = sp.representatives(param)[0]
            bind_args(kind, name, args, f"{section}.args")


def provenance(spec: SweepSpec) -> dict[str, str]:
    """The distribution and version behind each plugin a trial of this spec uses."""
    out = {}
    for section, kind in SECTIONS.items():
        name = getattr(spec, section).plugin
        info = registry.info(kind, name)
        out[f"{section}.{name}"] = f"{info.distribution}=={info.version}"
    return out


def accepted_args(factory: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The factory's parameters by name, or None when it takes **kwargs (anything goes)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return dict(params)


def own_args(kind: str, factory: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a spec may set (everything but what sweeper injects), in order."""
    return [p for p in inspect.signature(factory).parameters.values()
            if p.name not in INJECTED[kind] and p.name != "self"
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def bind_args(kind: str, name: str, args: dict[str, Any], where: str) -> None:
    """Check that ``args`` (plus what sweeper injects) bind to the factory's signature.

    ``where`` is the spec path of the args (e.g. ``optimizer.args``), used in the message."""
    factory = registry.get(kind, name)
    injected = [a for a in INJECTED[kind] if a in args]
    if injected:
        raise UserError(f"{where}.{injected[0]}: set by sweeper itself for {singular(kind)} plugins; remove it.")
    params = accepted_args(factory)
    supplied = {a: None for a in INJECTED[kind] if params is None or a in params}
    try:
        inspect.signature(factory).bind(**supplied, **args)
    except TypeError as exc:
        unknown = sorted(set(args) - set(params or {}))
        allowed = [p.name for p in own_args(kind, factory)]
        who = f"{singular(kind)} plugin '{name}'"
        source = registry.info(kind, name).where
        if unknown and params is not None:
            hint = did_you_mean(unknown[0], allowed, " (did you mean '{}'?)")
            raise UserError(f"{where}.{unknown[0]}: {who} has no argument '{unknown[0]}'{hint}; "
                            f"it accepts: {', '.join(allowed)}. The plugin comes from {source}.") from None
        raise UserError(f"{where}: cannot call {who} ({source}) with {sorted(args)}: {exc}; "
                        f"it accepts: {', '.join(allowed)}.") from None


def describe_args(kind: str, factory: Callable[..., Any]) -> list[tuple[str, str, str]]:
    """(name, default, type) of each argument a spec may set, as text; default 'required'."""
    def text(value: Any) -> str:
        return value if isinstance(value, str) else getattr(value, "__name__", None) or repr(value)

    return [(p.name, "required" if p.default is p.empty else repr(p.default),
             "" if p.annotation is p.empty else text(p.annotation)) for p in own_args(kind, factory)]
