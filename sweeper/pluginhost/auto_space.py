"""``search.space: auto``: the search space derived from the priors the chosen plugins declare
(priors.py), plus the training settings that matter; entries written in ``search.space`` win,
entry by entry. Each entry keeps where it came from, for `sweeper validate`.

With several candidate plugins of a section (``search.auto.models: [mlp, cnn]``) the space gets
``model.plugin`` as a categorical and each plugin's arguments conditioned on it
(``when: {model.plugin: mlp}``; an argument several candidates share: ``[mlp, cnn]``, its range
the envelope of theirs). Arguments the spec fixes in ``{section}.args`` stay fixed.

The model families come from the data (families.py): without ``search.auto.models``, every
installed model that takes the data set's kind of data, the spec's own first (a hand-written
``model.plugin`` is extended, not replaced; a hand-written argument of the spec's models is
conditioned on the families that take it). The families are tried in a first round at low
fidelity (``search.family_round``) before the search within the survivors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sweeper.errors import UserError
from sweeper.pluginhost import registry
from sweeper.pluginhost.base_point import plugin_default
from sweeper.pluginhost.binding import accepted_args, plugin_choices
from sweeper.pluginhost.families import Families
from sweeper.pluginhost.families import find as find_families
from sweeper.pluginhost.priors import Declared, declared, describe
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.spec.load import check_space_types
from sweeper.spec.search import AutoSpaceSpec, FamilyRound

HAND_WRITTEN = "search.space (hand-written)"
# spec section -> (plugin kind, its list in search.auto)
SEARCHED_SECTIONS = {"model": "models", "optimizer": "optimizers", "schedule": "schedules"}
# Schedules chosen among when the spec names none and search.auto.schedules is unset: a constant LR
# or a cosine decay, the two that need no tuning of their own.
DEFAULT_SCHEDULES = ["none", "cosine"]
# train.label_smoothing of a classification task: 0 (none) to 0.2 (past it accuracy suffers on
# small class counts; Szegedy et al. 2016 used 0.1).
LABEL_SMOOTHING = sp.FloatParam(type="float", low=0.0, high=0.2)


@dataclass(frozen=True)
class Derived:
    """A spec whose search space is explicit (no ``search.auto``), and where each entry came from."""

    spec: SweepSpec
    sources: dict[str, str]  # search.space path -> its origin, e.g. "prior of model plugin 'mlp' (...)"
    families: Families | None = None  # the model families chosen among and refused; None: not derived


def derive(spec: SweepSpec, refused: dict[str, str] | None = None) -> Derived:
    """``spec`` with ``search.auto`` replaced by the derived space (hand-written entries kept);
    a spec without ``search.auto`` is returned as it is. ``refused``: model families the dry
    build refused (name -> why), left out. Raises UserError naming the path of a plugin that is
    unknown, a prior that is malformed, or a derived space the spec refuses."""
    auto = spec.search.auto
    if auto is None:
        return Derived(spec, dict.fromkeys(spec.search.space, HAND_WRITTEN))
    families = find_families(spec, auto.models, refused)
    spec, moved = _fixed_for_their_families(spec, families)
    hand = dict(spec.search.space)
    entries: dict[str, tuple[sp.Param, str]] = {}
    for section, kind in SEARCHED_SECTIONS.items():
        names = families.names if section == "model" else _candidates(spec, section, kind, auto)
        plugin_path = f"{section}.plugin"
        if section == "model" and families.added:  # the data's families: the spec's own first
            hand.pop(plugin_path, None)
            hand = _conditioned(hand, families)
            origin = f"the data's kind ({families.kind}): {', '.join(families.named)} (the spec's) first"
            entries[plugin_path] = (sp.CategoricalParam(type="categorical", choices=list(names)), origin)
        elif plugin_path not in hand and len(names) > 1:
            origin = f"search.auto.{kind}" if getattr(auto, kind) else "training default (schedules)"
            entries[plugin_path] = (sp.CategoricalParam(type="categorical", choices=list(names)), origin)
        added = section == "model" and bool(families.added)
        entries.update(_plugin_arguments(spec, section, kind, names, hand, added))
    # the task's own priors (a regression's loss): the spec's task, which the data decides, not a choice
    entries.update(_plugin_arguments(spec, "task", "tasks", [spec.task.plugin], hand))
    if auto.train:
        entries.update(_training(spec, hand))
    space = {path: hand.get(path, param) for path, (param, _) in entries.items()} | hand
    sources = {path: moved.get(path, HAND_WRITTEN) if path in hand else entries[path][1] for path in space}
    space = _settle_conditions(spec, space)
    tree = spec.model_dump()
    tree["search"]["space"] = {path: param.model_dump(exclude_none=True) for path, param in space.items()}
    tree["search"]["auto"] = None
    try:
        derived = SweepSpec.model_validate(tree)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"]))
        problem = error["msg"].removeprefix("Value error, ")
        raise UserError(
            f"search.auto: the derived search space is refused{f' at {where}' if where != 'search' else ''}: "
            f"{problem}; an entry written in search.space replaces the derived one of its path"
        ) from None
    check_space_types(derived, "search.auto")
    # the validated space in a copy of the spec as written: the fields it set stay the ones it set
    # (the auto strategy, plan/strategy.py, chooses only what the spec does not write)
    search = spec.search.model_copy(
        update={"space": derived.search.space, "auto": None, "family_round": _round(spec, families)}
    )
    return Derived(spec.model_copy(update={"search": search}), {path: sources[path] for path in space}, families)


def _round(spec: SweepSpec, families: Families) -> FamilyRound | None:
    """The first round across the families, when there are several and the spec sets none."""
    search = spec.search
    # Ray Tune has no round (spec/search.py OPTUNA_ONLY); several objectives rank no family first
    if search.family_round is not None or len(families.names) < 2 or search.backend != "optuna" or len(spec.goals) > 1:
        return search.family_round
    return FamilyRound.at_low_fidelity(families.names, spec.train.epochs)


def _fixed_for_their_families(spec: SweepSpec, families: Families) -> tuple[SweepSpec, dict[str, str]]:
    """``spec`` with each argument it fixes in model.args that not every family takes moved into
    search.space as a one-value choice conditioned on the families that take it (the families
    the data brought train at their own defaults there), and where each moved entry came from."""
    if not families.added:
        return spec, {}
    takers = {name: accepted_args(registry.get("models", name)) for name in families.names}
    args, space, moved = dict(spec.model.args), dict(spec.search.space), {}
    for arg, value in spec.model.args.items():
        owners = [name for name, accepted in takers.items() if accepted is None or arg in accepted]
        path = f"model.args.{arg}"
        if len(owners) == len(families.names):
            continue
        del args[arg]
        if path in space:  # searched by hand too: that entry wins, conditioned on its families (_conditioned)
            continue
        when: Any = owners[0] if len(owners) == 1 else owners
        space[path] = sp.CategoricalParam(type="categorical", choices=[value], when={"model.plugin": when})
        moved[path] = f"model.args (fixed in the spec; the families that take it: {', '.join(owners)})"
    if args == spec.model.args:
        return spec, {}
    model = spec.model.model_copy(update={"args": args})
    search = spec.search.model_copy(update={"space": space})
    return spec.model_copy(update={"model": model, "search": search}), moved


def _conditioned(hand: dict[str, sp.Param], families: Families) -> dict[str, sp.Param]:
    """Hand-written ``model.args.*`` entries with no condition on ``model.plugin``, conditioned on
    the families that take the argument (they were written for the spec's own models)."""
    out = {}
    for path, param in hand.items():
        when: dict[str, Any] = dict(param.when or {})
        if path.startswith("model.args.") and "model.plugin" not in when:
            arg = path.removeprefix("model.args.")
            owners = [
                name
                for name in families.names
                if (accepted := accepted_args(registry.get("models", name))) is None or arg in accepted
            ]
            if len(owners) < len(families.names):
                when["model.plugin"] = owners[0] if len(owners) == 1 else owners
                param = param.model_copy(update={"when": when})
        out[path] = param
    return out


def _candidates(spec: SweepSpec, section: str, kind: str, auto: AutoSpaceSpec) -> list[str]:
    """The plugins of ``section`` to choose among: a hand-written ``{section}.plugin``'s choices,
    else search.auto's list, else the spec's own (schedules: DEFAULT_SCHEDULES for a spec that
    names none, when training settings are derived)."""
    listed = getattr(auto, kind)
    if f"{section}.plugin" in spec.search.space:
        names = plugin_choices(spec, section)
    elif listed:
        names = list(dict.fromkeys(listed))
    elif section == "schedule" and spec.schedule.plugin == "none" and auto.train:
        names = list(DEFAULT_SCHEDULES)
    else:
        names = [getattr(spec, section).plugin]
    for name in names:
        try:
            registry.get(kind, name)
        except UserError as exc:
            raise UserError(f"search.auto.{kind}: {exc}") from None
    return names


def _plugin_arguments(
    spec: SweepSpec, section: str, kind: str, names: list[str], hand: dict[str, sp.Param], added: bool = False
) -> dict[str, tuple[sp.Param, str]]:
    """``{section}.args.*`` entries from the candidates' priors (not those the spec fixes or
    writes by hand), each conditioned on the plugins that declare it when not all of them do.
    ``added``: the candidates include families the data brought (no user listed them), so priors
    that cannot share an entry are not an error: the first family's kind of prior is searched."""
    fixed = getattr(spec, section).args
    claims: dict[str, list[tuple[str, Declared]]] = {}
    for name in names:
        for arg, prior in declared(kind, name).items():
            if arg not in fixed and f"{section}.args.{arg}" not in hand:
                claims.setdefault(arg, []).append((name, prior))
    out = {}
    for arg, claimed in claims.items():
        path = f"{section}.args.{arg}"
        if added:  # families the data brought: those whose priors cannot share one entry keep their defaults
            claimed = _sharing(path, claimed, kind)
        owners = [name for name, _ in claimed]
        param = _envelope(path, [prior.param for _, prior in claimed], owners, kind)
        when: dict[str, Any] = {}
        if len(owners) < len(names):
            when[f"{section}.plugin"] = owners[0] if len(owners) == 1 else owners
        conditions = {repr(prior.when) for _, prior in claimed}
        if len(conditions) > 1:
            raise UserError(
                f"search.auto: {registry.singular(kind)} plugins {', '.join(owners)} condition '{arg}' differently; "
                f"write search.space.{path} by hand"
            )
        when |= {f"{section}.args.{other}": value for other, value in claimed[0][1].when.items()}
        param = param.model_copy(update={"when": when or None})
        out[path] = (param, _origin(kind, claimed))
    return out


def _sharing(path: str, claimed: list[tuple[str, Declared]], kind: str) -> list[tuple[str, Declared]]:
    """The claims of an argument that one entry can hold: the first (the spec's family first),
    and each later one whose prior and condition are alike to those kept so far."""
    kept = [claimed[0]]
    for claim in claimed[1:]:
        group = [*kept, claim]
        try:
            _envelope(path, [prior.param for _, prior in group], [name for name, _ in group], kind)
        except UserError:
            continue
        if claim[1].when == kept[0][1].when:
            kept.append(claim)
    return kept


def _origin(kind: str, claimed: list[tuple[str, Declared]]) -> str:
    """Where an argument's entry comes from: ``prior of model plugin 'mlp' (annotation of ...)``,
    or for several plugins, whether their priors agreed or the entry is their envelope."""
    if len(claimed) == 1:
        name, prior = claimed[0]
        return f"prior of {registry.singular(kind)} plugin '{name}' ({prior.origin})"
    names = ", ".join(f"'{name}'" for name, _ in claimed)
    how = "the same in each" if len({repr(p.param) for _, p in claimed}) == 1 else "their envelope"
    return f"priors of {registry.singular(kind)} plugins {names} ({how})"


def _envelope(path: str, params: list[sp.Param], owners: list[str], kind: str) -> sp.Param:
    """One parameter covering every candidate's prior of an argument: the first when they agree,
    else the smallest range holding theirs (categorical: every choice), when they are alike."""
    first = params[0]
    if all(p == first for p in params):
        return first
    if all(isinstance(p, sp.CategoricalParam) for p in params):
        choices = [c for p in params if isinstance(p, sp.CategoricalParam) for c in p.choices]
        return sp.CategoricalParam(type="categorical", choices=list(dict.fromkeys(choices)))
    if isinstance(first, (sp.FloatParam, sp.IntParam)) and all(
        type(p) is type(first) and p.log == first.log and p.step == first.step for p in params
    ):
        low = min(p.low for p in params if isinstance(p, (sp.FloatParam, sp.IntParam)))
        high = max(p.high for p in params if isinstance(p, (sp.FloatParam, sp.IntParam)))
        return first.model_copy(update={"low": low, "high": high})
    raise UserError(
        f"search.auto: {registry.singular(kind)} plugins {', '.join(owners)} declare priors of different "
        f"kinds for '{path}'; write search.space.{path} by hand"
    )


def _training(spec: SweepSpec, hand: dict[str, sp.Param]) -> dict[str, tuple[sp.Param, str]]:
    """train.batch_size: the spec's, and the powers of two from a quarter of it up to it (32, 64,
    128 for 128): no larger, as the spec's is the one known to fit the data and the device's
    memory. train.label_smoothing: for a task that takes it and was given none."""
    out: dict[str, tuple[sp.Param, str]] = {}
    batch = spec.train.batch_size
    powers = {1 << k for k in range(batch.bit_length()) if batch <= 4 * (1 << k) < 4 * batch}
    sizes = sorted(b for b in {*powers, batch} if b >= spec.train.accumulate)
    if "train.batch_size" not in hand and len(sizes) > 1:
        param = sp.CategoricalParam(type="categorical", choices=list(sizes))
        out["train.batch_size"] = (param, f"training default (powers of two from train.batch_size / 4 up to {batch})")
    task_takes = accepted_args(registry.get("tasks", spec.task.plugin))
    smoothing = task_takes is not None and "label_smoothing" in task_takes
    given = spec.train.label_smoothing or "label_smoothing" in spec.task.args or "task.args.label_smoothing" in hand
    if smoothing and not given and "train.label_smoothing" not in hand:
        out["train.label_smoothing"] = (
            LABEL_SMOOTHING,
            f"training default (task '{spec.task.plugin}' takes label smoothing)",
        )
    return out


def _settle_conditions(spec: SweepSpec, space: dict[str, sp.Param]) -> dict[str, sp.Param]:
    """A derived condition on an argument that is not searched (the spec fixes it, or no prior
    covers it) is decided now, on its fixed value or the default of the plugin that declares the
    condition: met, the condition goes; not met, so does the entry."""
    settled = {}
    for path, param in space.items():
        when = dict(param.when or {})
        keep = True
        for dep, condition in list(when.items()):
            if dep in space or ".args." not in dep:
                continue
            section, _, arg = dep.partition(".args.")
            owner = when.get(f"{section}.plugin", getattr(spec, section).plugin)
            owner = owner[0] if isinstance(owner, list) else owner  # shared conditions are alike (checked)
            value = getattr(spec, section).args.get(arg, plugin_default(section, str(owner), arg))
            keep = keep and sp.accepts(condition, value)
            del when[dep]
        if keep:
            settled[path] = param.model_copy(update={"when": when or None})
    return settled


def provenance_lines(derived: Derived) -> list[str]:
    """The search space, one entry a line, with where each entry came from (for `sweeper validate`)."""
    space = derived.spec.search.space
    width = max((len(path) for path in space), default=0)
    return [f"{path:<{width}}  {describe(param)}  <- {derived.sources[path]}" for path, param in space.items()]
