"""Plugin lookup over ``importlib.metadata`` entry points.

Listing reads package metadata only (nothing is imported); ``get`` imports one plugin and
checks the plugin-API version it declares. A name claimed by two distributions must be
pinned as ``"dist_name:name"``. The contract itself is documented in docs/plugins.md.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from sweeper.errors import UserError
from sweeper.plugin import API_ATTR, INJECTED, KINDS, LISTED

GROUP_PREFIX = "sweeper."


@dataclass(frozen=True)
class PluginInfo:
    kind: str  # one of LISTED
    name: str  # the entry-point name a spec writes
    target: str  # "module:attr"
    distribution: str
    version: str

    @property
    def qualified(self) -> str:
        return f"{self.distribution}:{self.name}"

    @property
    def where(self) -> str:
        """Who provides it, for messages: distribution, version and entry point."""
        return (f"distribution {self.distribution} {self.version}, entry point "
                f"'{self.name} = {self.target}' in group '{GROUP_PREFIX}{self.kind}'")


def normalize(dist_name: str) -> str:
    """PEP 503 form, so `my_pkg`, `My-Pkg` and `my.pkg` pin the same distribution."""
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def _info(kind: str, ep: EntryPoint) -> PluginInfo:
    dist = ep.dist
    return PluginInfo(kind, ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?")


@functools.cache
def _entry_points(kind: str) -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=GROUP_PREFIX + kind))


def refresh() -> None:
    """Forget cached entry points and loaded factories (after distributions were added or
    removed from sys.path in this process, e.g. in tests)."""
    import importlib

    importlib.invalidate_caches()
    _entry_points.cache_clear()
    get.cache_clear()


def list_plugins(kind: str | None = None) -> list[PluginInfo]:
    """Every installed plugin (or those of one group), sorted; imports nothing."""
    kinds = LISTED if kind is None else (kind,)
    return sorted((_info(k, ep) for k in kinds for ep in _entry_points(k)),
                  key=lambda p: (p.kind, p.name, p.distribution))


def collisions(plugins: list[PluginInfo]) -> dict[tuple[str, str], list[PluginInfo]]:
    """(kind, name) claimed by more than one distribution -> the claimants."""
    seen: dict[tuple[str, str], list[PluginInfo]] = {}
    for p in plugins:
        seen.setdefault((p.kind, p.name), []).append(p)
    return {key: ps for key, ps in seen.items() if len(ps) > 1}


def singular(kind: str) -> str:
    return {"search_spaces": "search space"}.get(kind, kind[:-1])


def _find(kind: str, name: str) -> EntryPoint:
    dist_pin, _, short = name.rpartition(":")
    matches = [ep for ep in _entry_points(kind) if ep.name == short
               and (not dist_pin or (ep.dist and normalize(ep.dist.name) == normalize(dist_pin)))]
    if not matches:
        names = sorted({ep.name for ep in _entry_points(kind)})
        close = difflib.get_close_matches(short, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise UserError(
            f"unknown {singular(kind)} plugin '{name}'.{hint} Available: {', '.join(names) or 'none'}. "
            f"Third-party plugins register under the entry-point group '{GROUP_PREFIX}{kind}'; "
            f"run 'sweeper plugins' to list what is installed.")
    if len(matches) > 1:
        matches.sort(key=lambda ep: _info(kind, ep).distribution)  # stable message, whatever the sys.path order
        owners = "; ".join(_info(kind, ep).where for ep in matches)
        raise UserError(f"{singular(kind)} plugin name '{short}' is claimed by several distributions "
                        f"({owners}); pin one in the spec, e.g. plugin: \"{_info(kind, matches[0]).qualified}\".")
    return matches[0]


def info(kind: str, name: str) -> PluginInfo:
    return _info(kind, _find(kind, name))


def api_versions(declared: Any) -> tuple[int, ...] | None:
    """The plugin-API versions a module declares (an int or a sequence of ints), or None when
    it does not declare (or declares something malformed: the caller reports that)."""
    if isinstance(declared, int) and not isinstance(declared, bool):
        return (declared,)
    if isinstance(declared, (list, tuple, range)) and declared and all(
            isinstance(v, int) and not isinstance(v, bool) for v in declared):
        return tuple(declared)
    return None


def declared_api(kind: str, name: str) -> Any:
    """What the plugin's entry-point module declares as API_ATTR (None if nothing); imports it."""
    get(kind, name)
    return getattr(sys.modules.get(_find(kind, name).module), API_ATTR, None)


def _check_api(kind: str, ep: EntryPoint) -> None:
    from sweeper import PLUGIN_API_VERSION

    module = sys.modules.get(ep.module)
    if module is None or not hasattr(module, API_ATTR):
        return  # undeclared: assumed compatible (e.g. torch.optim.SGD)
    declared = getattr(module, API_ATTR)
    versions = api_versions(declared)
    i = _info(kind, ep)
    if versions is None:
        raise UserError(f"{singular(kind)} plugin '{ep.name}' ({i.where}) declares {API_ATTR} = {declared!r} "
                        f"in module {ep.module}; expected an int or a list of ints, e.g. {API_ATTR} = "
                        f"{PLUGIN_API_VERSION}.")
    if PLUGIN_API_VERSION not in versions:
        targets = ", ".join(map(str, versions))
        raise UserError(f"{singular(kind)} plugin '{ep.name}' ({i.where}) targets sweeper plugin API "
                        f"version {targets} ({ep.module}.{API_ATTR}), but this sweeper implements "
                        f"sweeper.PLUGIN_API_VERSION = {PLUGIN_API_VERSION}; install a release of "
                        f"{i.distribution} built for API {PLUGIN_API_VERSION}, or a sweeper that "
                        f"implements API {targets}.")


@functools.cache
def get(kind: str, name: str) -> Callable[..., Any]:
    """Import and return one plugin's factory, after checking its declared API version."""
    ep = _find(kind, name)
    try:
        factory = ep.load()
    except Exception as exc:  # any import-time failure of third-party code
        raise UserError(
            f"{singular(kind)} plugin '{name}' ({_info(kind, ep).where}) failed to import: "
            f"{type(exc).__name__}: {exc}. Other plugins are unaffected; reinstall or fix that "
            f"distribution, or pin another one.") from exc
    _check_api(kind, ep)
    if kind in KINDS and not callable(factory):
        raise UserError(f"{singular(kind)} plugin '{name}' ({_info(kind, ep).where}) is a "
                        f"{type(factory).__name__}, not a callable factory; see docs/plugins.md.")
    return factory


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
    factory = get(kind, name)
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
        source = info(kind, name).where
        if unknown and params is not None:
            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
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
