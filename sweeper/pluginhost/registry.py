"""Plugin lookup over ``importlib.metadata`` entry points.

Listing reads package metadata only (nothing is imported); ``get`` imports one plugin and
checks the plugin-API version it declares. A name claimed by two distributions must be
pinned as ``"dist_name:name"``. The contract itself is documented in docs/plugins.md.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, overload

from sweeper.errors import UserError
from sweeper.plugin import (
    API_ATTR,
    KINDS,
    LISTED,
    DatasetFactory,
    ModelFactory,
    OptimizerFactory,
    ScheduleFactory,
    TaskFactory,
)

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
        return (
            f"distribution {self.distribution} {self.version}, entry point "
            f"'{self.name} = {self.target}' in group '{GROUP_PREFIX}{self.kind}'"
        )


def normalize(dist_name: str) -> str:
    """PEP 503 form, so `my_pkg`, `My-Pkg` and `my.pkg` pin the same distribution."""
    return re.sub(r"[-_.]+", "-", dist_name).lower()


def split_name(name: str) -> tuple[str, str]:
    """A spec's plugin name as (distribution pin or '', entry-point name): 'dist:name' or 'name'."""
    pin, _, short = name.rpartition(":")
    return pin, short


def did_you_mean(word: str, options: list[str], form: str = " Did you mean '{}'?") -> str:
    """A hint naming the closest option, or '' when none is close."""
    close = difflib.get_close_matches(word, options, n=1)
    return form.format(close[0]) if close else ""


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
    _load.cache_clear()
    info.cache_clear()


def list_plugins(kind: str | None = None) -> list[PluginInfo]:
    """Every installed plugin (or those of one group), sorted; imports nothing."""
    kinds = LISTED if kind is None else (kind,)
    return sorted(
        (_info(k, ep) for k in kinds for ep in _entry_points(k)), key=lambda p: (p.kind, p.name, p.distribution)
    )


def collisions(plugins: list[PluginInfo]) -> dict[tuple[str, str], list[PluginInfo]]:
    """(kind, name) claimed by more than one distribution -> the claimants."""
    seen: dict[tuple[str, str], list[PluginInfo]] = {}
    for p in plugins:
        seen.setdefault((p.kind, p.name), []).append(p)
    return {key: ps for key, ps in seen.items() if len(ps) > 1}


def singular(kind: str) -> str:
    return {"search_spaces": "search space"}.get(kind, kind[:-1])


def _designates(name: str, entry_name: str, distribution: str | None) -> bool:
    """True when a spec's plugin name ('name' or 'dist:name') means this entry point."""
    pin, short = split_name(name)
    return entry_name == short and (not pin or (distribution is not None and normalize(pin) == normalize(distribution)))


def matching(name: str, kind: str | None = None) -> list[PluginInfo]:
    """The listed plugins (of ``kind``, or of every group) that ``name`` designates, or a
    UserError listing what is installed."""
    short = split_name(name)[1]
    listed = list_plugins(kind)
    found = [p for p in listed if _designates(name, p.name, p.distribution)]
    if not found:
        names = sorted({p.name for p in listed})
        raise UserError(
            f"no {singular(kind) + ' ' if kind else ''}plugin named '{name}'.{did_you_mean(short, names)} "
            f"Installed: {', '.join(names) or 'none'}; run 'sweeper plugins'."
        )
    return found


def _find(kind: str, name: str) -> EntryPoint:
    short = split_name(name)[1]
    matches = [ep for ep in _entry_points(kind) if _designates(name, ep.name, ep.dist.name if ep.dist else None)]
    if not matches:
        names = sorted({ep.name for ep in _entry_points(kind)})
        hint = did_you_mean(short, names)
        raise UserError(
            f"unknown {singular(kind)} plugin '{name}'.{hint} Available: {', '.join(names) or 'none'}. "
            f"Third-party plugins register under the entry-point group '{GROUP_PREFIX}{kind}'; "
            f"run 'sweeper plugins' to list what is installed."
        )
    if len(matches) > 1:
        matches.sort(key=lambda ep: _info(kind, ep).distribution)  # stable message, whatever the sys.path order
        owners = "; ".join(_info(kind, ep).where for ep in matches)
        raise UserError(
            f"{singular(kind)} plugin name '{short}' is claimed by several distributions "
            f'({owners}); pin one in the spec, e.g. plugin: "{_info(kind, matches[0]).qualified}".'
        )
    return matches[0]


@functools.cache  # a distribution's name and version are read from its METADATA file: once per process
def info(kind: str, name: str) -> PluginInfo:
    return _info(kind, _find(kind, name))


def api_versions(declared: Any) -> tuple[int, ...] | None:
    """The plugin-API versions a module declares (an int or a sequence of ints), or None when
    it does not declare (or declares something malformed: the caller reports that)."""
    if isinstance(declared, int) and not isinstance(declared, bool):
        return (declared,)
    if (
        isinstance(declared, (list, tuple, range))
        and declared
        and all(isinstance(v, int) and not isinstance(v, bool) for v in declared)
    ):
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
        raise UserError(
            f"{singular(kind)} plugin '{ep.name}' ({i.where}) declares {API_ATTR} = {declared!r} "
            f"in module {ep.module}; expected an int or a list of ints, e.g. {API_ATTR} = "
            f"{PLUGIN_API_VERSION}."
        )
    if PLUGIN_API_VERSION not in versions:
        targets = ", ".join(map(str, versions))
        raise UserError(
            f"{singular(kind)} plugin '{ep.name}' ({i.where}) targets sweeper plugin API "
            f"version {targets} ({ep.module}.{API_ATTR}), but this sweeper implements "
            f"sweeper.PLUGIN_API_VERSION = {PLUGIN_API_VERSION}; install a release of "
            f"{i.distribution} built for API {PLUGIN_API_VERSION}, or a sweeper that "
            f"implements API {targets}."
        )


# The factory of each kind as sweeper.plugin types it, for a kind written out; the last form is for a
# kind known only at run time (and search spaces, whose entry points name a package, not a factory).
@overload
def get(kind: Literal["models"], name: str) -> ModelFactory: ...
@overload
def get(kind: Literal["datasets"], name: str) -> DatasetFactory: ...
@overload
def get(kind: Literal["optimizers"], name: str) -> OptimizerFactory: ...
@overload
def get(kind: Literal["schedules"], name: str) -> ScheduleFactory: ...
@overload
def get(kind: Literal["tasks"], name: str) -> TaskFactory: ...
@overload
def get(kind: str, name: str) -> Callable[..., Any]: ...
def get(kind: str, name: str) -> Callable[..., Any]:
    """Import and return one plugin's factory, after checking its declared API version."""
    return _load(kind, name)


@functools.cache
def _load(kind: str, name: str) -> Any:
    ep = _find(kind, name)
    try:
        factory = ep.load()
    except Exception as exc:  # any import-time failure of third-party code
        raise UserError(
            f"{singular(kind)} plugin '{name}' ({_info(kind, ep).where}) failed to import: "
            f"{type(exc).__name__}: {exc}. Other plugins are unaffected; reinstall or fix that "
            f"distribution, or pin another one."
        ) from exc
    _check_api(kind, ep)
    if kind in KINDS and not callable(factory):
        raise UserError(
            f"{singular(kind)} plugin '{name}' ({_info(kind, ep).where}) is a "
            f"{type(factory).__name__}, not a callable factory; see docs/plugins.md."
        )
    return factory
