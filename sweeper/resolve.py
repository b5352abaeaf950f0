"""Resolve a spec against the installed plugins before any compute is spent."""

from __future__ import annotations

from typing import Any

from sweeper import registry
from sweeper import space as sp
from sweeper.spec import SweepSpec

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
            registry.bind_args(kind, name, args, f"{section}.args")


def provenance(spec: SweepSpec) -> dict[str, str]:
    """The distribution and version behind each plugin a trial of this spec uses."""
    out = {}
    for section, kind in SECTIONS.items():
        name = getattr(spec, section).plugin
        info = registry.info(kind, name)
        out[f"{section}.{name}"] = f"{info.distribution}=={info.version}"
    return out
