"""The documentation holds: README.md is a front door (at most 250 lines, its links resolve, its
commands and the tour's in docs/ parse as the CLI defines them) and docs/ is a MkDocs site that
builds in --strict mode (a broken link or anchor, a link out of docs/, a page missing from the nav:
each an error)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 250


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` with this interpreter's MkDocs (the project's test extra)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def nav_pages(nav: list) -> set[str]:
    """Every page file a MkDocs nav names, at any depth."""
    pages: set[str] = set()
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_the_manual_builds_in_strict_mode(tmp_path: Path):
    proc = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reviewing = (tmp_path / "site" / "reviewing" / "index.html").read_text()
    for shot in ("mlflow-runs.png", "report.png", "optuna-dashboard.png"):  # the browser test's screenshots
        assert f'src="../{shot}"' in reviewing and (tmp_path / "site" / shot).exists()


def test_a_broken_link_anchor_outside_link_or_page_off_the_nav_fails_the_build(tmp_path: Path):
    """The strict build has teeth: each kind of mistake a moved section leaves behind is an error."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(DOCS, tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[a](no-such-page.md) [b](reviewing.md#no-such-anchor) [c](../README.md)\n")
    (tmp_path / "docs" / "stray-page.md").write_text("# Off the nav\n")
    proc = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    for mistake in ("no-such-page.md", "no-such-anchor", "../README.md", "stray-page.md"):
        assert mistake in output, output


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert nav_pages(config["nav"]) == {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the manual is docs/"
    for heading in ("## Two commands", "## A five-minute tour", "## The manual"):
        assert heading in lines


def test_the_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local and not [t for t in local if not (REPO / t).exists()]


def tour_commands() -> list[list[str]]:
    """The `sweeper ...` lines of the tour's shell blocks (README and docs/getting-started.md), as
    arguments: comments and `&` dropped, the tour's shell variables given a value."""
    text = README.read_text() + (DOCS / "getting-started.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    values = {"$DB": "postgresql+psycopg://postgres@127.0.0.1/sweeps", "$BEST": "0123456789abcdef"}
    commands = []
    for line in "\n".join(blocks).splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["sweeper"]:
            args = [values.get(w, w) for w in words[1:] if w != "&"]
            commands += [args] if args not in commands else []
    return commands


@pytest.mark.parametrize("args", tour_commands(), ids=lambda args: " ".join(args[:2]))
def test_a_tour_command_parses_as_the_cli_defines_it(args: list[str], monkeypatch: pytest.MonkeyPatch):
    """Each command of the tour names a real subcommand with options it has and the arguments it
    takes (what the run itself does is the end-to-end tests' part)."""
    import typer.main

    from sweeper.cli import app

    monkeypatch.chdir(REPO)
    group = typer.main.get_command(app)
    command = group.commands[args[0]]  # type: ignore[attr-defined]
    command.make_context(args[0], args[1:])  # raises click's UsageError on an unknown option or argument
