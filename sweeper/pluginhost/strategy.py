"""The search strategy applied where the spec is resolved: the facts its rules need beyond the
spec (this machine's device, whether the plugins let trials fuse) found out here, the rules
themselves in sweeper/spec/strategy.py. `sweeper run` (search/runner.py) and `sweeper validate`
resolve through ``resolve`` and warn with ``notes``, so both see the same strategy."""

from __future__ import annotations

from pydantic import ValidationError

from sweeper.errors import UserError
from sweeper.plugin import FUSABLE_ATTR
from sweeper.pluginhost import registry
from sweeper.pluginhost.tasks import make_task
from sweeper.pluginhost.tasks import resolve as resolve_task
from sweeper.spec import SweepSpec, strategy
from sweeper.spec import space as sp
from sweeper.spec.strategy import Facts, Strategy


def facts(spec: SweepSpec) -> Facts:
    """This machine's device and what the plugins allow, for the trials of ``spec``."""
    return Facts(cuda=_cuda(spec), unfusable=why_unfusable(spec))


def resolve(spec: SweepSpec) -> Strategy:
    """``spec`` with search.sampler/pruner: auto, and the settings they shape that the spec does
    not write, chosen (spec/strategy.py); a spec asking for no auto comes back as it is. Call it
    on the spec as loaded: what was written is read from its fields set."""
    if not strategy.wanted(spec):
        return Strategy(spec, ())
    resolve_task(spec)  # a task that cannot be built stops here with its own message, before facts()
    try:
        return strategy.choose(spec, facts(spec))
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
    if not make_task(spec).fusable:
        return f"task '{spec.task.plugin}' with these task.args trains one trial at a time"
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
    if spec.train.device == "cpu":
        return False
    import torch  # here: validating a spec without auto imports no torch for it

    return torch.cuda.is_available()
