"""Search-space parameters addressed by dotted paths into the spec.

Sampling goes through a duck-typed ``suggest_float/suggest_int/suggest_categorical`` object
(an Optuna trial, or anything shaped like one), so this module imports no backend.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

Scalar = bool | int | float | str | None
# The most points the grid sampler may visit: Optuna's GridSampler (and Ray's grid_search) hold
# every point in memory; 100,000 points is ~10 MB there and far more trials than a sweep runs.
MAX_GRID_POINTS = 100_000


class _Param(BaseModel):
    # allow_inf_nan=False: a range bound of .nan or .inf (or "nan") is an error, not a range
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    # Sample this parameter only when each named parameter has the given value, or, for a list of
    # values, any one of them (``when: {model.plugin: [mlp, cnn]}``).
    when: dict[str, Scalar | list[Scalar]] | None = None


class FloatParam(_Param):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> FloatParam:
        _check_range(self.low, self.high, self.log, self.step)
        return self


class IntParam(_Param):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> IntParam:
        _check_range(self.low, self.high, self.log, self.step if self.step != 1 else None)
        return self


class CategoricalParam(_Param):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    if low > high:
        raise ValueError(f"low ({low}) must be <= high ({high})")
    if log and low <= 0:
        raise ValueError(f"log scale needs low > 0 (got low={low})")
    if log and step is not None:
        raise ValueError("log and step cannot be combined; choose one")


class Suggester(Protocol):
    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


def ordered(space: dict[str, Param]) -> list[tuple[str, Param]]:
    """Parameters in sampling order: each after the parameters its ``when`` refers to."""
    done: dict[str, Param] = {}
    pending = dict(space)
    while pending:
        ready = [p for p, param in pending.items() if all(dep in done for dep in (param.when or {}))]
        if not ready:
            path, param = next(iter(pending.items()))
            missing = [d for d in (param.when or {}) if d not in space]
            if missing:
                raise ValueError(
                    f"search.space.{path}.when refers to '{missing[0]}', which is not a "
                    f"parameter of the space (known: {', '.join(space)})"
                )
            raise ValueError(f"search.space: the 'when' conditions of {', '.join(pending)} form a cycle")
        for path in ready:
            done[path] = pending.pop(path)
    return list(done.items())


def drawable(p: Param, value: Scalar) -> bool:
    """Whether sampling ``p`` can give a value equal to ``value`` (what a ``when`` compares)."""
    if isinstance(p, CategoricalParam):
        return any(choice == value for choice in p.choices)
    if isinstance(p, IntParam):
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # suggest_int's 3 equals 3.0
        return isinstance(value, int) and p.low <= value <= p.high and (p.log or (value - p.low) % p.step == 0)
    return False  # a float is drawn equal to a given number only by chance


def _never_drawn(dep: str, p: Param, value: Any) -> str:
    """Why ``dep`` is never drawn equal to ``value``."""
    if isinstance(p, CategoricalParam):
        return f"'{dep}' takes one of {p.choices}, never {value!r}"
    if isinstance(p, IntParam):
        steps = f" in steps of {p.step}" if p.step != 1 and not p.log else ""
        return f"'{dep}' takes an int in [{p.low}, {p.high}]{steps}, never {value!r}"
    return f"'{dep}' is a float parameter, drawn equal to {value!r} only by chance (make it categorical)"


def accepts(condition: Scalar | list[Scalar], value: Any) -> bool:
    """Whether ``value`` satisfies one ``when`` condition: equal to it, or to one of a list's values."""
    return any(value == wanted for wanted in condition) if isinstance(condition, list) else value == condition


def enabling(space: dict[str, Param], path: str) -> dict[str, Scalar]:
    """The values that ``path``'s ``when`` conditions, and those of the parameters they name,
    require: the assignment under which ``path`` is sampled (for a list of values, the first one
    that can be drawn). Raises ValueError naming the condition when no draw satisfies them all (a
    value never drawn, a path that is not a parameter, two conditions wanting one parameter at
    different values)."""
    forced: dict[str, tuple[Scalar, str]] = {}  # parameter -> (value, the condition asking it)
    pending = [path]
    while pending:
        current = pending.pop()
        for dep, condition in (space[current].when or {}).items():
            where = f"search.space.{current}.when: {{{dep}: {condition!r}}}"
            if dep not in space:
                raise ValueError(
                    f"{where} refers to '{dep}', which is not a parameter of the space (known: {', '.join(space)}); "
                    f"the condition would never hold"
                )
            if dep in forced:
                if not accepts(condition, forced[dep][0]):
                    raise ValueError(
                        f"{where} never holds together with {forced[dep][1]} (both are needed for "
                        f"'{path}' to be sampled)"
                    )
                continue
            wanted = condition if isinstance(condition, list) else [condition]
            value = next((v for v in wanted if drawable(space[dep], v)), None)
            if value is None or not wanted:
                shown = wanted[0] if len(wanted) == 1 else (wanted or "an empty list")
                raise ValueError(
                    f"{where} never holds: {_never_drawn(dep, space[dep], shown)}; '{current}' would never be sampled"
                )
            forced[dep] = (value, where)
            pending.append(dep)
    return {dep: value for dep, (value, _) in forced.items()}


def active(param: Param, chosen: dict[str, Any]) -> bool:
    return all(dep in chosen and accepts(condition, chosen[dep]) for dep, condition in (param.when or {}).items())


def suggest(space: dict[str, Param], trial: Suggester) -> dict[str, Any]:
    """Sample one point; conditional parameters whose condition fails are left out."""
    chosen: dict[str, Any] = {}
    for path, p in ordered(space):
        if not active(p, chosen):
            continue
        if isinstance(p, FloatParam):
            chosen[path] = trial.suggest_float(path, p.low, p.high, step=p.step, log=p.log)
        elif isinstance(p, IntParam):
            chosen[path] = trial.suggest_int(path, p.low, p.high, step=p.step, log=p.log)
        else:
            chosen[path] = trial.suggest_categorical(path, p.choices)
    return chosen


def fit(space: dict[str, Param], params: dict[str, Any]) -> dict[str, Any] | None:
    """``params`` (a trial of an earlier space) as a point of ``space``: parameters the space
    lacks, or whose ``when`` fails, left out; numbers clipped into their range (ints rounded,
    onto the step's grid); None when a categorical value is not among the choices (the trial
    says nothing about this space) or nothing is left. A parameter the trial lacks stays unset:
    the sampler draws it."""
    chosen: dict[str, Any] = {}
    for path, p in ordered(space):
        if path not in params or not active(p, chosen):
            continue
        value = params[path]
        if isinstance(p, CategoricalParam):
            if not any(choice == value and type(choice) is type(value) for choice in p.choices):
                return None
            chosen[path] = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            chosen[path] = _clip(p, value)
        else:
            return None
    return chosen or None


def _clip(p: FloatParam | IntParam, value: float) -> float | int:
    """``value`` inside ``p``'s range, on its step's grid (an int param: an int)."""
    inside = min(max(value, p.low), p.high)
    if p.step is not None and not p.log:
        steps = round((inside - p.low) / p.step)
        top = int((p.high - p.low) // p.step)  # the last grid point at or below high
        inside = p.low + min(steps, top) * p.step
    return int(round(inside)) if isinstance(p, IntParam) else float(inside)


def grid_values(path: str, p: Param) -> list[Any]:
    """The discrete values of one parameter, for the grid sampler."""
    count = grid_count(path, p)
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    if isinstance(p, IntParam):
        return list(range(p.low, p.high + 1, p.step))
    step = p.step or 0.0  # grid_count refused a float without a step
    return [round(p.low + i * step, 12) for i in range(count)]


def grid_count(path: str, p: Param) -> int:
    """How many values the grid sampler visits for one parameter, counted without listing them;
    more than MAX_GRID_POINTS is an error (a tiny step, a huge range)."""
    if isinstance(p, CategoricalParam):
        count = len(p.choices)
    elif isinstance(p, IntParam) and not p.log:
        count = (p.high - p.low) // p.step + 1
    elif isinstance(p, FloatParam) and p.step is not None:
        steps = (p.high - p.low) / p.step  # inf when the span overflows a float
        count = int(round(steps)) + 1 if steps < MAX_GRID_POINTS else MAX_GRID_POINTS + 1
    else:
        raise ValueError(
            f"search.space.{path}: the grid sampler needs discrete values "
            f"(categorical, int without log, or float with step)"
        )
    if count > MAX_GRID_POINTS:
        raise ValueError(
            f"search.space.{path}: the grid sampler would visit more than {MAX_GRID_POINTS:,} "
            f"values of it (the most a grid may hold); use a larger step or a smaller range, "
            f"or a sampler that does not enumerate (tpe, random)"
        )
    return count


def grid_size(space: dict[str, Param]) -> int:
    """How many points the grid sampler visits; more than MAX_GRID_POINTS is an error."""
    size = 1
    for path, p in space.items():
        size *= grid_count(path, p)
        if size > MAX_GRID_POINTS:
            raise ValueError(
                f"search.space: the grid of {', '.join(space)} has more than {MAX_GRID_POINTS:,} "
                f"points (the most a grid may hold); use fewer values, or a sampler that does not "
                f"enumerate (tpe, random)"
            )
    return size


def representatives(p: Param) -> list[Any]:
    """A few values a parameter can take: enough to type-check its path in the spec."""
    if isinstance(p, CategoricalParam):
        return list(p.choices)
    return [p.low, p.high]


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts, creating missing dicts; a key that itself contains dots
    (a search-space key) is matched whole when present."""
    parts = path.split(".")
    node, walked = tree, []
    while len(parts) > 1:
        if ".".join(parts) in node:  # the rest of the path is itself a key (a search-space key)
            node[".".join(parts)] = value
            return
        n = next((n for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in node), 1)
        key = ".".join(parts[:n])
        walked.append(key)
        if node.get(key) is None:
            node[key] = {}
        if not isinstance(node[key], dict):
            raise ValueError(f"'{'.'.join(walked)}' is a value, not a section: cannot set '{path}'")
        node, parts = node[key], parts[n:]
    node[parts[0]] = value


def apply(tree: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``tree`` with each dotted path set to its value."""
    out = copy.deepcopy(tree)
    for path, value in values.items():
        set_path(out, path, value)
    return out


def as_json(space: dict[str, Param]) -> dict[str, dict[str, Any]]:
    """Each parameter as plain data (type, range or choices, condition): how the sweep's run and
    its Optuna study show the search space."""
    return {path: p.model_dump(mode="json", exclude_none=True) for path, p in space.items()}
