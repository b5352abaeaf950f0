"""Plugin lookup over ``importlib.metadata`` entry points.

Listing reads package metadata only (nothing is imported); ``get`` imports one plugin.
A name claimed by two distributions must be pinned as ``"dist_name:name"``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from sweeper.errors import UserError
from sweeper.plugin import INJECTED, KINDS

GROUP_PREFIX = "sweeper."


@dataclass(frozen=True)
class PluginInfo:
    kind: str  # one of plugin.KINDS
    name: str  # the entry-point name a spec writes
    target: str  # "module:attr"
    distribution: str
    version: str

    @property
    def qualified(self) -> str:
        return f"{self.distribution}:{self.name}"


def _info(kind: str, ep: EntryPoint) -> PluginInfo:
    dist = ep.dist
    return PluginInfo(kind, ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?")


@functools.cache
def _entry_points(kind: str) -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=GROUP_PREFIX + kind))


def list_plugins(kind: str | None = None) -> list[PluginInfo]:
    """Every installed plugin (or those of one kind), sorted; imports nothing."""
    kinds = KINDS if kind is None else (kind,)
    return sorted((_info(k, ep) for k in kinds for ep in _entry_points(k)), key=lambda p: (p.kind, p.name))


def _singular(kind: str) -> str:
    return kind[:-1]


def _find(kind: str, name: str) -> EntryPoint:
    dist_pin, _, short = name.rpartition(":")
    matches = [ep for ep in _entry_points(kind) if ep.name == short
               and (not dist_pin or (ep.dist and ep.dist.name == dist_pin))]
    if not matches:
        names = sorted({ep.name for ep in _entry_points(kind)})
        close = difflib.get_close_matches(short, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown {_singular(kind)} plugin '{name}'.{hint} Available: {', '.join(names) or 'none'}. "
            f"Third-party plugins register under the entry-point group '{GROUP_PREFIX}{kind}'; "
            f"run 'sweeper plugins' to list what is installed.")
    if len(matches) > 1:
        owners = ", ".join(sorted(_info(kind, ep).qualified for ep in matches))
        raise UserError(f"{_singular(kind)} plugin name '{short}' is claimed by several distributions "
                        f"({owners}); pin one in the spec, e.g. plugin: \"{_info(kind, matches[0]).qualified}\".")
    return matches[0]


def info(kind: str, name: str) -> PluginInfo:
    return _info(kind, _find(kind, name))


@functools.cache
def get(kind: str, name: str) -> Callable[..., Any]:
    """Import and return one plugin's factory."""
    ep = _find(kind, name)
    try:
        return ep.load()
    except Exception as exc:  # any import-time failure of third-party code
        i = _info(kind, ep)
        raise UserError(
            f"{_singular(kind)} plugin '{name}' from distribution {i.distribution} {i.version} "
            f"(entry point {name} = {i.target}) failed to import: {type(exc).__name__}: {exc}. "
            f"Other plugins are unaffected; reinstall or fix that distribution.") from exc


def accepted_args(factory: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The factory's parameters by name, or None when it takes **kwargs (anything goes)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return dict(params)


def bind_args(kind: str, name: str, args: dict[str, Any], where: str) -> None:
    """Check that ``args`` (plus what sweeper injects) bind to the factory's signature.

    ``where`` is the spec path of the args (e.g. ``optimizer.args``), used in the message."""
    factory = get(kind, name)
    injected = [a for a in INJECTED[kind] if a in args]
    if injected:
        raise UserError(f"{where}.{injected[0]}: set by sweeper itself for {_singular(kind)} plugins; remove it.")
    params = accepted_args(factory)
    supplied = {a: None for a in INJECTED[kind] if params is None or a in params}
    try:
        inspect.signature(factory).bind(**supplied, **args)
    except TypeError as exc:
        unknown = sorted(set(args) - set(params or {}))
        allowed = [p for p in (params or {}) if p not in INJECTED[kind] and p != "self"]
        if unknown and params is not None:
            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UserError(f"{where}.{unknown[0]}: {_singular(kind)} plugin '{name}' has no argument "
                            f"'{unknown[0]}'{hint}; it accepts: {', '.join(allowed)}.") from None
        raise UserError(f"{where}: cannot call {_singular(kind)} plugin '{name}' with {sorted(args)}: {exc}; "
                        f"it accepts: {', '.join(allowed)}.") from None
