"""From YAML text to a validated SweepSpec: a safe loader that reads 1e-3 as a float,
dotted-path overrides (``train.epochs=3``) applied to the parsed tree, then validation, where
every problem becomes a UserError naming the dotted path and what was expected."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sweeper.errors import UserError
from sweeper.spec import space as sp
from sweeper.spec.model import SweepSpec


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


def load(path: str | Path, overrides: list[str] = ()) -> SweepSpec:
    """Read, override and validate a spec; every problem becomes a UserError naming the path."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the spec ({exc.strerror}); expected a YAML file such as "
                        f"search_spaces/digits.yaml") from None
    tree = parse_yaml(text, str(path))
    if not isinstance(tree, dict):
        raise UserError(f"{path}: expected a mapping of spec sections (name, dataset, model, ...), "
                        f"got {type(tree).__name__}")
    tree = apply_overrides(tree, list(overrides))
    spec = validate(tree, str(path))
    _check_space_types(spec, str(path))
    return spec


def validate(tree: dict[str, Any], source: str) -> SweepSpec:
    try:
        return SweepSpec.model_validate(tree)
    except ValidationError as exc:
        raise UserError(f"{source}: " + "; ".join(_describe(e) for e in exc.errors())) from None


def _check_space_types(spec: SweepSpec, source: str) -> None:
    """Each searched value must fit the field it addresses (e.g. train.batch_size is an int)."""
    base = spec.model_dump()
    for path, param in spec.search.space.items():
        for value in sp.representatives(param):
            try:
                SweepSpec.model_validate(sp.apply(base, {path: value}))
            except (ValidationError, ValueError) as exc:
                detail = _describe(exc.errors()[0]) if isinstance(exc, ValidationError) else str(exc)
                raise UserError(f"{source}: search.space.{path}: value {value!r} does not fit the spec "
                                f"({detail})") from None


def _describe(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    if loc[:2] == ["search", "space"] and len(loc) > 3 and loc[3] in ("float", "int", "categorical"):
        del loc[3]  # pydantic puts the union tag in the location
    where = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        allowed = _fields_at(err["loc"][:-1])
        return f"{where}: unknown key" + (f"; expected one of: {', '.join(allowed)}" if allowed else "")
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {got!r})"
    return f"{where}: {msg}{shown}"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: Any = SweepSpec
    for part in loc:
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = field.annotation
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def json_schema() -> dict[str, Any]:
    schema = SweepSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "sweeper sweep spec"
    return schema
