"""The base point of a search space (``search.base_first``): the trial a user would run by hand
before any search. Each searched parameter takes the value the spec fixes at its path, else the
default of the plugin argument it sets, else its range's centre (the geometric centre of a log
range; a choice: its first option). A value outside the parameter's range is clipped into it
(a choice not offered: the first option); a conditional parameter is left out when its condition
fails at the base point, as a sampled trial leaves it out.

A function of the spec alone (no timing, no randomness): the same spec gives the same first
trial, so the reproducibility contract (same spec and seed, same trial table) holds.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import SECTIONS
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp


def base_point(spec: SweepSpec) -> dict[str, Any]:
    """The base point of ``spec``'s search space: its active parameters and their values."""
    space = spec.search.space
    tree = spec.model_dump()
    chosen: dict[str, Any] = {}
    for path, param in sp.ordered(space):
        if sp.active(param, chosen):
            chosen[path] = _inside(param, _preferred(spec, tree, path, chosen))
    return chosen


def family_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """The first round's trials (``search.family_round``): the base point of each family, in
    the round's order; none without a round."""
    round_ = spec.search.family_round
    if round_ is None:
        return []
    return [base_point(spec.with_values({"model.plugin": family})) for family in round_.families]


def _preferred(spec: SweepSpec, tree: dict[str, Any], path: str, chosen: dict[str, Any]) -> Any:
    """The value the spec fixes at ``path``, else the plugin's default for it (None: neither)."""
    fixed = _at(tree, path)
    if fixed is not None:
        return fixed
    section, _, arg = path.partition(".args.")
    if not arg or section not in SECTIONS:
        return None
    plugin = chosen.get(f"{section}.plugin", getattr(spec, section).plugin)
    return plugin_default(section, str(plugin), arg)


def plugin_default(section: str, plugin: str, arg: str) -> Any:
    """The default of argument ``arg`` of ``section``'s plugin ``plugin`` (None: it has none)."""
    factory = registry.get(SECTIONS[section], plugin)
    try:
        parameter = inspect.signature(factory).parameters.get(arg)
    except (TypeError, ValueError):  # a factory without a readable signature (a builtin)
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _at(tree: dict[str, Any], path: str) -> Any:
    """The spec's value at a dotted path (None: unset)."""
    node: Any = tree
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _inside(param: sp.Param, value: Any) -> Any:
    """``value`` as a point of ``param``: clipped into a range, or the range's centre when it is
    no number; a choice's own value when offered, else its first option."""
    if isinstance(param, sp.CategoricalParam):
        offered = [c for c in param.choices if c == value and type(c) is type(value)]
        return offered[0] if offered else param.choices[0]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        value = math.sqrt(param.low * param.high) if param.log else (param.low + param.high) / 2
    fitted = sp.fit({"x": param.model_copy(update={"when": None})}, {"x": value})
    assert fitted is not None  # a number always fits a numeric parameter
    return fitted["x"]
