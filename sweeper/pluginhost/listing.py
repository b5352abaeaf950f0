"""`sweeper plugins [KIND] [--args]`: what is installed, as text that stays readable at any
width and when piped (a table; with --args one block per plugin)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from sweeper.errors import UserError
from sweeper.pluginhost import binding, registry

err = Console(stderr=True, highlight=False)


def show(kind: str | None, with_args: bool) -> bool:
    """A table (kind, name, distribution, version, entry point; the entry point goes under 100
    columns), or with --args one block per plugin: a header line, then one argument a line,
    wrapped at the terminal's width (80 when piped), so long names never squeeze a column.
    Returns False when a plugin failed to import (listed; its error follows on stderr)."""
    shown = registry.list_plugins(kind)
    console = Console(highlight=False)
    failures = []
    if not shown:
        console.print(f"no {kind + ' ' if kind else ''}plugins installed")
    elif not with_args:
        console.print(_table(shown, wide=console.width >= 100))
    for p in shown if with_args else []:
        _echo(
            f"{registry.singular(p.kind)} {p.name}  ({p.distribution} {p.version}, {p.target})", console.width, "    "
        )
        if p.kind == "search_spaces":
            continue
        try:
            rows = binding.describe_args(p.kind, registry.get(p.kind, p.qualified))
        except UserError as exc:  # one broken plugin must not hide the others
            failures.append(str(exc))
            _echo("  failed to import (see below)", console.width, "    ")
            continue
        for name, default, annotation in rows or [("(no arguments)", "", "")]:
            typed = f": {annotation}" if annotation else ""
            _echo(f"  {name}{typed}" + (f" = {default}" if default else ""), console.width, "      ")
    for (k, name), claimants in registry.collisions(shown).items():
        err.print(
            f"[yellow]note:[/] {k} plugin name '{name}' is claimed by "
            f"{', '.join(c.distribution for c in claimants)}; a spec must pin one, e.g. "
            f'plugin: "{claimants[0].qualified}"',
            soft_wrap=True,
        )
    for message in failures:
        err.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return not failures


def _table(shown: list[registry.PluginInfo], wide: bool) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for column in ("kind", "name", "distribution", "version", *(["entry point"] if wide else [])):
        table.add_column(column, overflow="fold")  # long names fold inside their cell
    for p in shown:
        table.add_row(*(Text(v) for v in (p.kind, p.name, p.distribution, p.version, *([p.target] if wide else []))))
    return table


def _echo(line: str, width: int, indent: str) -> None:
    """Plain text (names are not rich markup), wrapped at ``width``; continuation lines indented."""
    import textwrap

    typer.echo(
        "\n".join(textwrap.wrap(line, width=max(width, 40), subsequent_indent=indent, break_on_hyphens=False)) or line
    )
