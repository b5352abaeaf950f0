"""Spec YAML: a safe loader that reads 1e-3 as a float, and dotted-path overrides
(``train.epochs=3``) applied to the parsed tree before validation (sweeper/spec.py)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from sweeper import space as sp
from sweeper.errors import UserError


class _Loader(yaml.SafeLoader):
    """Safe loader that reads 1e-3 as a float (YAML 1.1 wants 1.0e-3; users write 1e-3)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{where}: invalid YAML ({problem}); expected a mapping of spec sections.") from None


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    values = {}
    for item in overrides:
        path, eq, raw = item.partition("=")
        if not eq or not path or " " in path:
            raise UserError(f"override '{item}': expected dotted.path=value, e.g. train.epochs=3")
        values[path] = parse_yaml(raw, f"override {path}") if raw else ""
    tree = dict(tree)
    for path in [p for p in values if p.startswith("search.space.")]:
        key = path.removeprefix("search.space.")
        space = (tree.get("search") or {}).get("space") or {}
        if not any(key == k or key.startswith(k + ".") for k in space):
            # a new search-space key: its dots belong to the key (a spec path), not to nesting
            tree["search"] = {**(tree.get("search") or {}), "space": {**space, key: values.pop(path)}}
    try:
        return sp.apply(tree, values)
    except ValueError as exc:
        raise UserError(f"override: {exc}") from None
