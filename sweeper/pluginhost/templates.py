"""Search spaces shipped by plugin distributions, and `sweeper init --from` that copies one.

A distribution registers a template in the ``sweeper.search_spaces`` group: the entry-point
name is the template's name, the value a package holding ``<name>.yaml``::

    [project.entry-points."sweeper.search_spaces"]
    spirals = "my_package.search_spaces"     # -> my_package/search_spaces/spirals.yaml
"""

from __future__ import annotations

from pathlib import Path

from sweeper.errors import UserError
from sweeper.plugin import KINDS
from sweeper.pluginhost import registry

GROUP = "search_spaces"


def _text(p: registry.PluginInfo) -> str:
    from importlib.resources import files

    package = p.target.partition(":")[0].strip()
    try:
        return (files(package) / f"{p.name}.yaml").read_text()
    except Exception as exc:  # import error, missing file: the distribution's to fix
        raise UserError(
            f"search space '{p.name}' ({p.where}) cannot be read: expected the file "
            f"{p.name}.yaml inside package {package} ({type(exc).__name__}: {exc})."
        ) from None


def find(source: str) -> registry.PluginInfo:
    """The template ``source`` names: a search space's name (or 'dist:name'), or a plugin
    whose distribution ships exactly one search space."""
    templates = registry.list_plugins(GROUP)
    _, short = registry.split_name(source)
    if any(t.name == short for t in templates):
        return registry.info(GROUP, source)
    owners = {
        p.distribution for k in KINDS for p in registry.list_plugins(k) if p.name == short or p.qualified == source
    }
    shipped = [t for t in templates if t.distribution in owners]
    available = ", ".join(t.qualified for t in templates) or "none installed"
    if len(shipped) == 1:
        return shipped[0]
    if shipped:
        raise UserError(
            f"'{source}' comes from {', '.join(sorted(owners))}, which ships several search "
            f"spaces: {', '.join(t.qualified for t in shipped)}; pass one of them to --from."
        )
    what = f"plugin '{source}' (from {', '.join(sorted(owners))}) ships" if owners else f"'{source}' is"
    raise UserError(
        f"{what} no search space. Search spaces available to 'sweeper init --from': {available}. "
        f"A distribution ships one in the entry-point group 'sweeper.{GROUP}'."
    )


def init(source: str, out: Path | None, force: bool = False) -> tuple[Path, registry.PluginInfo]:
    """Copy a shipped search space into a new spec file (comments kept) and check that it
    validates; returns the path written and the template's provenance."""
    from sweeper.spec import parse_yaml, validate

    template = find(source)
    text = _text(template)
    tree = parse_yaml(text, f"{template.qualified}.yaml")
    if not isinstance(tree, dict):
        raise UserError(f"search space '{template.name}' ({template.where}) is not a mapping of spec sections.")
    validate(tree, f"search space '{template.name}' ({template.where})")
    out = out or Path(f"{template.name}.yaml")
    if out.exists() and not force:
        raise UserError(f"{out} already exists; choose another path with --out, or pass --force to overwrite it.")
    header = (
        f"# Copied by `sweeper init --from {source}` from search space '{template.name}' of "
        f"{template.distribution} {template.version}.\n# Edit freely; check with `sweeper validate {out}`.\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + text)
    return out, template
