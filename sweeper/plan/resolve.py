"""The one resolve step: a spec as loaded to the sweep every process records and runs.

``resolve_sweep`` is the only way a spec is resolved; `sweeper run` (search/runner.py),
`sweeper validate` (its view), `sweeper submit --queue` and a queue's workers all call it:

1. derive: ``search.auto``'s space from the plugins' priors (pluginhost/auto_space.py), its
   model families from the data (pluginhost/families.py), each family the data brought built
   and stepped once on the data's samples (one that fails is refused, with why);
2. size: a derived space with a device-time budget, its too costly choices dropped
   (sized_space.py; only where the caller sizes: `run` and `validate`, never a worker);
3. choose: ``search.sampler/pruner: auto`` and the settings they shape (strategy.py), from the
   facts beyond the spec found out here (this machine's device, whether the plugins fuse);
4. the task: the objective resolved against it (pluginhost/tasks.py);
5. bind: every plugin and its arguments (pluginhost/binding.py), then the caller's own step
   before the build (its checks; the runner also starts its worker pool there);
6. dry build: the data prepared, each plugin choice built on the CPU (preflight.py).

What each step said (where each entry of the space came from, the sizing's changes, the
strategy's reasons, the settings that cannot take effect) comes back with the spec, so every
command shows the same notes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from pydantic import ValidationError

from sweeper.errors import UserError
from sweeper.phases import phase
from sweeper.plan import sized_space, strategy
from sweeper.plan.preflight import DryBuild, Prepared, dry_build, probe_families
from sweeper.plan.sized_space import Sized
from sweeper.plan.strategy import Choice, Facts, Strategy
from sweeper.plugin import FUSABLE_ATTR
from sweeper.pluginhost import registry
from sweeper.pluginhost.auto_space import Derived, derive
from sweeper.pluginhost.binding import check_plugins
from sweeper.pluginhost.tasks import resolve as resolve_task
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp


@dataclass(frozen=True)
class Resolved:
    """A resolved sweep and what resolving it said."""

    spec: SweepSpec  # the sweep every process records and runs
    space: Derived  # its search space, each entry with where it came from
    sized: list[str] | None  # the changes sizing made to a derived space; None: not sized
    choices: tuple[Choice, ...]  # the auto strategy's choices, each with its reason
    notes: list[str]  # settings that cannot take effect on this machine, each with its fix
    dry: DryBuild | None  # what the dry build did; None: not built (a worker's later visit)

    def warnings(self) -> list[str]:
        """The notes and what the dry build warned of: the lines every command prints."""
        return self.notes + (self.dry.warnings if self.dry is not None else [])


def resolve_sweep(
    loaded: SweepSpec,
    *,
    size: Callable[[SweepSpec], Sized] | None = None,
    before_build: Callable[[SweepSpec], None] | None = None,
    build: bool = True,
) -> Resolved:
    """``loaded`` (as `spec.load` returns it) resolved. ``size``: how a derived space with a
    device-time budget is sized (``sized_space.size``, or the runner's, which reads a resumed
    sweep's sizing back); None: not sized. ``before_build``: the caller's step on the resolved
    spec before the dry build: its checks (earlier sweeps there, devices, a cluster) and what it
    starts to overlap the build (the runner's pool). ``build``: run the dry build. Raises
    UserError naming the spec path of what is wrong."""
    derived = derive(loaded)
    prepared: Prepared = {}  # the data set, prepared once for the families' probe and the dry build
    if derived.families is not None and derived.families.added and build:
        with phase("dry build"):
            refused = probe_families(derived.spec, derived.families.added, prepared)
        if refused:
            derived = derive(loaded, refused)
    changes, trial_s = None, None
    if size is not None and sized_space.wanted(loaded):
        done = size(derived.spec)
        sources = {path: derived.sources[path] for path in done.spec.search.space}
        derived = Derived(_round_within(done.spec), sources, derived.families)
        changes, trial_s = done.changes, done.base_s
    chosen = choose(derived.spec, trial_s)
    spec = resolve_task(chosen.spec)
    check_plugins(spec)
    if before_build is not None:
        before_build(spec)
    with phase("dry build"):
        dry = dry_build(spec, prepared) if build else None
    return Resolved(spec, derived, changes, chosen.choices, notes(spec), dry)


def _round_within(spec: SweepSpec) -> SweepSpec:
    """``spec`` with its family round over the model families sizing left."""
    round_ = spec.search.family_round
    if round_ is None:
        return spec
    families = spec.search.space.get("model.plugin")
    choices = families.choices if isinstance(families, sp.CategoricalParam) else [spec.model.plugin]
    return spec.model_copy(update={"search": spec.search.model_copy(update={"family_round": round_.within(choices)})})


def facts(spec: SweepSpec, trial_s: float | None = None) -> Facts:
    """This machine's device and what the plugins allow, for the trials of ``spec``; ``trial_s``:
    one base-point trial's device-seconds where sizing timed it."""
    return Facts(cuda=_cuda(spec), unfusable=why_unfusable(spec), trial_s=trial_s)


def choose(spec: SweepSpec, trial_s: float | None = None) -> Strategy:
    """``spec`` with search.sampler/pruner: auto, and the settings they shape that the spec does
    not write, chosen (strategy.py); a spec asking for no auto comes back as it is. Call it on
    the spec as loaded: what was written is read from its fields set. ``trial_s``: one
    base-point trial's device-seconds, where sizing timed it."""
    if not strategy.wanted(spec):
        return Strategy(spec, ())
    resolve_task(spec)  # a task that cannot be built stops here with its own message, before facts()
    try:
        return strategy.choose(spec, facts(spec, trial_s))
    except ValidationError as exc:  # a written setting the choice contradicts (e.g. search.population)
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        )
        raise UserError(f"the auto strategy's choices do not fit the spec: {detail}") from None


def notes(spec: SweepSpec) -> list[str]:
    """What ``spec`` sets that cannot take effect on this machine, each with its fix."""
    return strategy.notes(spec, facts(spec))


def why_unfusable(spec: SweepSpec) -> str | None:
    """Why no two trials of ``spec`` can share a fused model (what trial/fused.py why_not_fused
    checks that a spec alone tells), or None."""
    if spec.train.compile:
        return "train.compile is on"
    if spec.train.precision == "fp16":
        return "train.precision fp16 needs a loss scaler per member"
    if spec.data.path == "loader":
        return "data.path is loader"
    for kind, section in (("models", "model"), ("optimizers", "optimizer")):
        for plugin in _plugins(spec, section):
            if not getattr(registry.get(kind, plugin), FUSABLE_ATTR, True):
                return f"the {kind[:-1]} plugin '{plugin}' says it cannot be fused ({FUSABLE_ATTR} = False)"
    return None


def _plugins(spec: SweepSpec, section: str) -> list[str]:
    """The plugins a spec section can name: its own, and the choices searched for it."""
    base = getattr(spec, section).plugin
    searched = spec.search.space.get(f"{section}.plugin")
    choices = [str(c) for c in searched.choices] if isinstance(searched, sp.CategoricalParam) else []
    return list(dict.fromkeys([base, *choices]))


def _cuda(spec: SweepSpec) -> bool:
    return spec.train.device != "cpu" and torch.cuda.is_available()
