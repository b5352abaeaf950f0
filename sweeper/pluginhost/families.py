"""The model families a derived search space (``search.auto``) chooses among, from the data: each
installed model plugin that declares it takes the kind of data the spec's data set declares it
gives (``DATA_KINDS_ATTR``, ``DATA_KIND_ATTR`` in sweeper.plugin). The spec's own model, or its
hand-written ``model.plugin`` choices, come first: where the search starts, not a limit.
``search.auto.models`` restricts the families to its list. The dry build checks each family
found here against the data set's samples (plan/resolve.py); one that fails there is refused
with its error, not the sweep.

What `sweeper validate` lists: the candidates and why each fits, the refused and why.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.errors import UserError
from sweeper.plugin import DATA_KIND_ATTR, DATA_KINDS, DATA_KINDS_ATTR
from sweeper.pluginhost import registry
from sweeper.pluginhost.binding import plugin_choices
from sweeper.spec import SweepSpec


@dataclass(frozen=True)
class Family:
    name: str  # the model plugin, as a spec writes it
    why: str  # why it is a candidate, or why it is refused


@dataclass(frozen=True)
class Families:
    """The model plugins a derived space chooses among, and those it refused."""

    kind: str | None  # the data's kind (one of DATA_KINDS); None: its data set declares none
    named: tuple[str, ...]  # the spec's own: its model, or its hand-written model.plugin choices
    candidates: tuple[Family, ...]  # in order: the spec's first
    refused: tuple[Family, ...]
    from_data: bool  # the candidates come from the data (no search.auto.models, a declared kind)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.candidates]

    @property
    def added(self) -> list[str]:
        """The candidates the data brought beyond the spec's own."""
        return [name for name in self.names if name not in self.named] if self.from_data else []

    def lines(self) -> list[str]:
        """For `sweeper validate`: each candidate and each refused family, with why."""
        out = [f"{f.name}: {f.why}" for f in self.candidates]
        return out + [f"{f.name}: refused: {f.why}" for f in self.refused]


def data_kind(spec: SweepSpec) -> str | None:
    """The kind of data the spec's data set plugin declares it gives; None when it declares none.
    A declared value outside DATA_KINDS is a UserError naming the plugin."""
    factory = registry.get("datasets", spec.dataset.plugin)
    kind = getattr(factory, DATA_KIND_ATTR, None)
    if kind is not None and kind not in DATA_KINDS:
        where = registry.info("datasets", spec.dataset.plugin).where
        raise UserError(
            f"data set plugin '{spec.dataset.plugin}' declares {DATA_KIND_ATTR} = {kind!r}; "
            f"expected one of {', '.join(DATA_KINDS)}. The plugin comes from {where}."
        )
    return kind


def takes(name: str) -> tuple[str, ...] | None:
    """The kinds of data model plugin ``name`` declares it takes; None when it declares none."""
    kinds = getattr(registry.get("models", name), DATA_KINDS_ATTR, None)
    return None if kinds is None else tuple(kinds)


def find(spec: SweepSpec, listed: list[str] | None, refused: dict[str, str] | None = None) -> Families:
    """The families of ``spec``'s derived space. ``listed``: search.auto.models (a restriction);
    ``refused``: families the dry build refused, by name, with why."""
    refused = dict(refused or {})
    named = tuple(plugin_choices(spec, "model"))
    kind = data_kind(spec)
    shown = f"'{spec.dataset.plugin}' gives {kind}s" if kind else ""
    candidates: list[Family] = []
    out: list[Family] = []
    hand_written = "model.plugin" in spec.search.space  # hand-written entries win, as everywhere in search.auto
    if listed and not hand_written:
        pool = list(dict.fromkeys(listed))
    elif listed:
        pool = list(named)
    elif kind is None:
        pool = list(named)
    else:
        pool = list(dict.fromkeys([*named, *_installed()]))
    for name in pool:
        if name in refused:
            out.append(Family(name, refused[name]))
            continue
        try:
            declared = takes(name)
        except UserError as exc:  # it fails to import, or is unknown
            if name in named or listed:
                raise UserError(f"search.auto.models: {exc}" if listed else str(exc)) from None
            out.append(Family(name, f"cannot be loaded: {exc}"))
            continue
        by = "named in search.auto.models" if listed else "named by the spec" if name in named else ""
        if declared is None:
            if by:
                candidates.append(Family(name, by))
            else:
                out.append(
                    Family(name, f"declares no kinds of data ({DATA_KINDS_ATTR}): searched only where a spec names it")
                )
        elif kind is not None and kind not in declared:
            why = f"takes {', '.join(declared)}; the data set {shown}"
            if name in named and not listed:
                candidates.append(Family(name, f"named by the spec (though it {why})"))
            else:
                out.append(Family(name, why))
        else:
            fits = f"takes {kind}s; the data set {shown}" if kind else f"takes {', '.join(declared)}"
            candidates.append(Family(name, f"{by}; {fits}" if by else fits))
    if not candidates:
        raise UserError(
            f"search.auto.models: no model plugin fits the data set '{spec.dataset.plugin}' "
            f"({'; '.join(f'{f.name}: {f.why}' for f in out)})"
        )
    from_data = not listed and kind is not None
    return Families(kind, named, tuple(candidates), tuple(out), from_data)


def _installed() -> list[str]:
    """Every installed model plugin, by the name a spec writes (``dist:name`` where two
    distributions claim one name)."""
    plugins = registry.list_plugins("models")
    clash = registry.collisions(plugins)
    return [p.qualified if ("models", p.name) in clash else p.name for p in plugins]
