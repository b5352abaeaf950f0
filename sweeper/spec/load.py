"""From YAML text to a validated SweepSpec: a safe loader that reads 1e-3 as a float,
dotted-path overrides (``train.epochs=3``) applied to the parsed tree, then validation, where
every problem becomes a UserError naming the dotted path and what was expected.

Specs come from anywhere (a colleague, a tracking server, a fuzzer): whatever the bytes, loading
either returns a spec or raises a UserError, quickly. Hence the limits below, the refusal of
YAML anchors and aliases (a "billion laughs" file expands to 10^9 nodes from a few lines), and
of numbers that are not numbers (NaN, infinities) anywhere in the spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sweeper.errors import UserError
from sweeper.spec import space as sp
from sweeper.spec.model import SweepSpec

# Limits far above any real spec (the shipped ones are ~1 KB, ~100 nodes, 5 levels deep) and
# far below what would stall the loader or overflow Python's recursion while reading one.
MAX_SPEC_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 40  # nested mappings/sequences
MAX_NODES = 10_000  # YAML nodes (scalars, sequences, mappings) in one document
MAX_ERRORS = 8  # validation problems listed in one message


class _Refused(yaml.YAMLError):
    """YAML that parses but that a spec may not use; ``str`` is the whole explanation."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _Loader(yaml.SafeLoader):
    """Safe loader that reads 1e-3 as a float (YAML 1.1 wants 1.0e-3; users write 1e-3), keeps
    to plain data (dates stay strings; !!binary, !!set, !!omap, !!pairs are refused), refuses
    anchors and aliases, and stops at MAX_DEPTH levels and MAX_NODES nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML's stubs leave it untyped
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                f"YAML aliases (*{event.anchor}) are not allowed in a spec; write the value out "
                f"(a spec is recorded and compared as plain data)",
                event.start_mark,
            )
        if getattr(event, "anchor", None) is not None:
            raise _Refused(
                f"YAML anchors (&{event.anchor}) are not allowed in a spec; write each value out "
                f"(a spec is recorded and compared as plain data)",
                event.start_mark,
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} YAML values; a spec is a few hundred", event.start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep; a spec is a few levels deep", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _refuse_tag(self, node: yaml.Node) -> Any:
        raise _Refused(
            f"the YAML tag {node.tag} is not allowed in a spec; expected plain values (strings, "
            f"numbers, booleans, null, lists, mappings)",
            node.start_mark,
        )


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _as_text(loader: _Loader, node: yaml.Node) -> str:
    """A timestamp (2024-05-01) stays the text it is written as."""
    assert isinstance(node, yaml.ScalarNode)
    return str(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _Loader._refuse_tag)
# What a malformed scalar with an explicit tag raises (!!int abc, !!bool maybe, !!int with no digits).
_SCALAR_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError)


def parse_yaml(text: str, source: str) -> Any:
    """Plain data from YAML text; any problem is a UserError naming ``source`` and the line."""
    loader = None
    try:
        loader = _Loader(text)
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text[: exc.position].count("\n") + 1
        raise UserError(
            f"{source}:{line}: invalid YAML (character {exc.character:#06x} at offset {exc.position}: "
            f"{exc.reason}); expected printable text"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        if isinstance(exc, _Refused):
            raise UserError(f"{where}: {exc.problem}") from None
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{where}: invalid YAML ({problem}); expected a mapping of spec sections.") from None
    except _SCALAR_ERRORS as exc:
        raise UserError(
            f"{source}: invalid YAML value ({_short(str(exc))}); expected plain values (strings, "
            f"numbers, booleans, null, lists, mappings)"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    values = {}
    for item in overrides:
        path, eq, raw = item.partition("=")
        if not eq or not path or " " in path:
            raise UserError(f"override '{_short(item)}': expected dotted.path=value, e.g. train.epochs=3")
        if path.count(".") >= MAX_DEPTH:
            raise UserError(
                f"override '{_short(path)}': nested more than {MAX_DEPTH} levels deep; expected a "
                f"dotted path into the spec, e.g. train.epochs"
            )
        values[path] = parse_yaml(raw, f"override {_short(path)}") if raw else ""
    tree = dict(tree)
    search = tree.get("search") or {}
    space: dict[str, Any] | None = (search.get("space") or {}) if isinstance(search, dict) else None
    for path in [p for p in values if p.startswith("search.space.")] if isinstance(space, dict) else []:
        assert isinstance(space, dict) and isinstance(search, dict)
        key = path.removeprefix("search.space.")
        if not any(key == k or key.startswith(f"{k}.") for k in map(str, space)):
            # a new search-space key: its dots belong to the key (a spec path), not to nesting
            space = {**space, key: values.pop(path)}
            search = tree["search"] = {**search, "space": space}
    try:
        return sp.apply(tree, values)
    except ValueError as exc:
        raise UserError(f"override: {exc}") from None


def load(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read, override and validate a spec; every problem becomes a UserError naming the path."""
    path = Path(path)
    tree = parse_yaml(read_text(path), str(path))
    if not isinstance(tree, dict):
        raise UserError(
            f"{path}: expected a mapping of spec sections (name, dataset, model, ...), got {type(tree).__name__}"
        )
    tree = apply_overrides(tree, list(overrides))
    spec = validate(tree, str(path))
    _check_space_types(spec, str(path))
    return spec


def read_text(path: Path) -> str:
    """A spec file's text: at most MAX_SPEC_BYTES of UTF-8 (a device or a pipe is read that far)."""
    expected = "expected a YAML file such as search_spaces/digits.yaml"
    if path.is_dir():
        raise UserError(f"{path}: is a folder; {expected}")
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the spec ({exc.strerror or exc}); {expected}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise UserError(f"{path}: larger than {MAX_SPEC_BYTES >> 20} MiB; a spec is a few KB ({expected})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(
            f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
            f"{expected}, saved as UTF-8"
        ) from None


def validate(tree: dict[str, Any], source: str) -> SweepSpec:
    _check_numbers(tree, source)
    try:
        spec = SweepSpec.model_validate(tree)
    except ValidationError as exc:
        errors = exc.errors()
        more = f"; and {len(errors) - MAX_ERRORS} more" if len(errors) > MAX_ERRORS else ""
        raise UserError(f"{source}: " + "; ".join(_describe(e) for e in errors[:MAX_ERRORS]) + more) from None
    if spec.search.sampler == "grid":
        try:
            sp.grid_size(spec.search.space)
        except ValueError as exc:
            raise UserError(f"{source}: {exc}") from None
    return spec


# The largest magnitudes a spec's numbers may have: what the tensors and columns they end up in
# hold. A trial's tensors are float32 or narrower (a larger float is inf there); torch, NumPy and
# the databases store integers in 64 bits (a larger int overflows inside a plugin or a driver).
MAX_FLOAT = 3.4028234663852886e38  # torch.finfo(torch.float32).max
MAX_INT = 2**63 - 1


def _check_numbers(tree: Any, source: str) -> None:
    """No NaN or infinity anywhere (ranges, lr, epochs, plugin args): they are never what the
    user meant, and they poison comparisons (a NaN bound makes every range check pass). No
    number beyond MAX_FLOAT or MAX_INT either: it would fail deep inside a plugin or a driver."""
    stack: list[tuple[str, Any]] = [("", tree)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise UserError(
                f"{source}: {where or '(top level)'}: {node} is not a number; expected a finite "
                f"number (NaN and infinities are not allowed in a spec)"
            )
        if isinstance(node, float) and abs(node) > MAX_FLOAT:
            raise UserError(
                f"{source}: {where or '(top level)'}: {node:g} is beyond what a float32 tensor holds "
                f"(±{MAX_FLOAT:.3g}); expected a number of sensible magnitude"
            )
        if isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_INT:
            raise UserError(
                f"{source}: {where or '(top level)'}: {_short(str(node))} is beyond a 64-bit integer "
                f"(±{MAX_INT:,}); expected a number of sensible magnitude"
            )
        if isinstance(node, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))


def _check_space_types(spec: SweepSpec, source: str) -> None:
    """Each searched value must fit the field it addresses (e.g. train.batch_size is an int).
    Checked against the spec without its search section: that section is not what the values
    address, and a large space would otherwise be copied once per value."""
    base = spec.model_dump(exclude={"search"})
    for path, param in spec.search.space.items():
        distinct = dict.fromkeys((type(v), v) for v in sp.representatives(param))  # 1, 1.0 and True differ
        for _, value in distinct:
            try:
                SweepSpec.model_validate(sp.apply(base, {path: value}))
            except (ValidationError, ValueError) as exc:
                detail = _describe(exc.errors()[0]) if isinstance(exc, ValidationError) else str(exc)
                raise UserError(
                    f"{source}: search.space.{path}: value {_short(repr(value))} does not fit the spec ({detail})"
                ) from None


def _describe(err: ErrorDetails) -> str:
    loc = [str(p) for p in err["loc"]]
    if loc[:2] == ["search", "space"] and len(loc) > 3 and loc[3] in ("float", "int", "categorical"):
        del loc[3]  # pydantic puts the union tag in the location
    where = _short(".".join(loc)) or "(top level)"
    if err["type"] == "extra_forbidden":
        allowed = _fields_at(err["loc"][:-1])
        return f"{where}: unknown key" + (f"; expected one of: {', '.join(allowed)}" if allowed else "")
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith(f"{where}."):  # the message names the path itself, more precisely
        return msg
    got = err.get("input")
    shown = "" if isinstance(got, dict) or err["type"] == "missing" else f" (got {_short(repr(got))})"
    return f"{where}: {msg}{shown}"


def _short(text: str, limit: int = 80) -> str:
    """A value quoted in a message: hostile input can be a megabyte long."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


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
