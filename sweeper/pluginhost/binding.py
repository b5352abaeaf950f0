"""Binding a spec's plugin arguments to the factories' signatures before any compute is spent,
and the provenance (distribution, version) of the plugins a spec uses."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from sweeper.errors import UserError
from sweeper.plugin import INJECTED
from sweeper.pluginhost import registry
from sweeper.pluginhost.registry import did_you_mean, singular
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp

# spec section -> plugin kind
SECTIONS = {
    "task": "tasks",
    "dataset": "datasets",
    "model": "models",
    "optimizer": "optimizers",
    "schedule": "schedules",
}


def plugin_choices(spec: SweepSpec, section: str) -> list[str]:
    """Every plugin name a section can take: the fixed one, or the searched choices."""
    param = spec.search.space.get(f"{section}.plugin")
    if isinstance(param, sp.CategoricalParam):
        return [str(c) for c in param.choices]
    return [getattr(spec, section).plugin]


def searched_args(spec: SweepSpec, section: str, name: str) -> list[tuple[str, sp.Param]]:
    """(argument, parameter) of each searched ``{section}.args.*`` that plugin ``name`` can get:
    those without a ``when`` on ``{section}.plugin``, and those whose ``when`` names ``name``."""
    prefix = f"{section}.args."
    return [
        (path.removeprefix(prefix), param)
        for path, param in spec.search.space.items()
        if path.startswith(prefix) and sp.accepts((param.when or {}).get(f"{section}.plugin", name), name)
    ]


def check_plugins(spec: SweepSpec) -> None:
    """Import each plugin the spec can use, bind its fixed and searched arguments to the
    factory's signature, and check every value they can take against the factory's annotations;
    raises UserError naming the dotted path of a bad argument."""
    for section, kind in SECTIONS.items():
        for name in plugin_choices(spec, section):
            # argument -> the values it can take, each with where it comes from (None: fixed in the spec)
            values: dict[str, list[tuple[Any, str | None]]] = {
                a: [(v, None)] for a, v in getattr(spec, section).args.items()
            }
            for arg, param in searched_args(spec, section, name):
                values.setdefault(arg, []).extend(
                    (v, f"search.space.{section}.args.{arg}") for v in sp.representatives(param)
                )
            written = {a: vs[-1][1] for a, vs in values.items() if vs[-1][1]}  # searched: where it is written
            bind_args(kind, name, {a: vs[0][0] for a, vs in values.items()}, f"{section}.args", written)
            check_types(kind, name, values, f"{section}.args")


def plugin_points(spec: SweepSpec) -> list[tuple[str, dict[str, Any]]]:
    """Points of the search space that together use every plugin choice and every choice of a
    searched categorical plugin argument, for a dry build, each with a label: "base" (each
    active parameter at its first representative value), then one per other choice of a
    categorical ``{section}.plugin`` or ``{section}.args.*`` (e.g. ``model.args.arch=wide``),
    with the parameters its ``when`` conditions need set to enable it. One point per choice,
    not their product; a point already listed is not listed again."""
    space = spec.search.space

    def point(forced: dict[str, Any]) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for path, param in sp.ordered(space):
            if sp.active(param, chosen):
                chosen[path] = forced[path] if path in forced else sp.representatives(param)[0]
        return chosen

    points = [("base", point({}))]
    plugins = [p for p in space if p.split(".")[0] in SECTIONS and p.endswith(".plugin")]  # first
    arguments = [p for p in space if p.split(".")[0] in SECTIONS and p not in plugins]
    for path in plugins + arguments:
        param = space[path]
        if not isinstance(param, sp.CategoricalParam):
            continue
        for choice in param.choices:
            candidate = point({**sp.enabling(space, path), path: choice})
            if all(candidate != known for _, known in points):
                points.append((f"{path}={choice}", candidate))
    return points


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
    return [
        p
        for p in inspect.signature(factory).parameters.values()
        if p.name not in INJECTED[kind]
        and p.name != "self"
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]


def bind_args(kind: str, name: str, args: dict[str, Any], where: str, written: dict[str, str] | None = None) -> None:
    """Check that ``args`` (plus what sweeper injects) bind to the factory's signature.

    ``where`` is the spec path of the args (e.g. ``optimizer.args``), used in the message;
    ``written`` maps an argument given by the search space to its path there."""
    written = written or {}
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
            raise UserError(
                f"{written.get(unknown[0], f'{where}.{unknown[0]}')}: {who} has no argument '{unknown[0]}'{hint}; "
                f"it accepts: {', '.join(allowed)}. The plugin comes from {source}."
            ) from None
        raise UserError(
            f"{where}: cannot call {who} ({source}) with {sorted(args)}: {exc}; it accepts: {', '.join(allowed)}."
        ) from None


def factory_annotations(factory: Callable[..., Any]) -> dict[str, Any]:
    """The factory's parameter annotations, resolved (``Annotated`` extras kept); a parameter whose
    annotation does not resolve (a name imported only for type checkers) is left out."""
    target = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]  # a class: its __init__
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:
        hints = {}
        namespace = getattr(inspect.unwrap(target), "__globals__", {})
        for p in inspect.signature(factory).parameters.values():
            try:  # the plugin's own annotation text, evaluated in its own module
                ann = p.annotation
                hints[p.name] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307
            except Exception:
                continue
        return {k: v for k, v in hints.items() if v is not inspect.Parameter.empty}


def type_text(annotation: Any) -> str:
    """An annotation as a user reads it: ``int``, ``float | None``, ``tuple[int, ...]``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _adapter(annotation: Any) -> Any:
    """A pydantic validator for ``annotation``, or None when pydantic cannot build one (then
    the argument's type is not checked; binding and the dry build still are)."""
    from pydantic import ConfigDict, TypeAdapter

    try:
        return TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:
        return None


def _reinterpreted(given: Any, validated: Any) -> bool:
    """Whether lax validation turned a value into another kind: a string or bool into a number,
    a number into a bool, a float into an int. pydantic accepts those; in a spec they are slips
    ("wide" for an int, true for a width), and the factory would receive the value as written.
    An int where a float is expected is fine."""
    if isinstance(given, (list, tuple)) and isinstance(validated, (list, tuple)) and len(given) == len(validated):
        return any(map(_reinterpreted, given, validated))
    if isinstance(given, dict) and isinstance(validated, dict):
        return any(_reinterpreted(v, validated.get(k, v)) for k, v in given.items())
    kinds = (bool, int, float, str)  # bool first: a bool is also an int
    was = next((k for k in kinds if isinstance(given, k)), None)
    now = next((k for k in kinds if isinstance(validated, k)), None)
    return was is not None and now is not None and was is not now and (was, now) != (int, float)


def check_types(kind: str, name: str, values: dict[str, list[tuple[Any, str | None]]], where: str) -> None:
    """Check each value an argument can take against the factory's annotation of it (its type,
    and constraints such as ``Annotated[int, Field(ge=1)]``). ``values`` maps an argument to
    (value, origin) pairs, origin being the search-space path a value comes from or None."""
    from pydantic import ValidationError

    factory = registry.get(kind, name)
    hints = factory_annotations(factory)
    for arg, candidates in values.items():
        if arg not in hints:
            continue
        adapter = _adapter(hints[arg])
        if adapter is None:
            continue
        for value, origin in candidates:
            reason = ""
            try:
                ok = not _reinterpreted(value, adapter.validate_python(value))
            except ValidationError as exc:
                ok, reason = False, f": {exc.errors()[0]['msg']}"
            if not ok:
                source = f" (from {origin})" if origin else ""
                raise UserError(
                    f"{where}.{arg}: {singular(kind)} plugin '{name}' expects {type_text(hints[arg])}, "
                    f"got {value!r}{source}{reason}. The plugin comes from "
                    f"{registry.info(kind, name).where}."
                )


def describe_args(kind: str, factory: Callable[..., Any]) -> list[tuple[str, str, str]]:
    """(name, default, type) of each argument a spec may set, as text; default 'required'."""

    hints = factory_annotations(factory)

    def text(name: str, value: Any) -> str:
        if name in hints and typing.get_origin(hints[name]) is typing.Annotated:
            return type_text(hints[name])  # the type, without its range
        return value if isinstance(value, str) else getattr(value, "__name__", None) or repr(value)

    return [
        (
            p.name,
            "required" if p.default is p.empty else repr(p.default),
            "" if p.annotation is p.empty else text(p.name, p.annotation),
        )
        for p in own_args(kind, factory)
    ]
