"""The architecture holds: import contracts (import-linter) that fail on a violation, and a
Layout section in the manual (docs/architecture.md) that lists the package tree as it is. (Files
are split by responsibility, not to a line count: ruff and mypy keep the lines honest.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c(['--no-logo', '--no-cache']))",
]


def layout_tree() -> set[str]:
    """The sweeper/ paths the manual's Layout section lists (nesting by two-space indentation)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    paths, stack = set(), []
    for line in block.splitlines()[1:]:
        match = re.match(r"( *)(\S+)", line)
        if not match:
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        stack = stack[:depth] + [name]
        if stack[0] == "sweeper/" and (name.endswith("/") or name.endswith(".py")):
            paths.add("".join(stack).rstrip("/"))
    return paths


def test_documented_layout_matches_the_tree():
    root = REPO / "sweeper"
    modules = list(root.rglob("*.py"))
    actual = {str(p.relative_to(REPO)) for p in modules if p.name != "__init__.py"}
    actual |= {str(p.parent.relative_to(REPO)) for p in modules}  # the packages
    assert layout_tree() == actual


def lint(package_root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the project's contracts, on the sweeper package found under package_root."""
    return subprocess.run(
        LINT,
        cwd=package_root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(package_root), "PATH": "/usr/bin:/bin"},
    )


def test_import_contracts_hold():
    proc = lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 5 kept, 0 broken." in proc.stdout


@pytest.mark.parametrize(
    "module, line, broken",
    [
        ("trial/batching.py", "import sweeper.search.runner", "sweeper.trial.batching -> sweeper.search.runner"),
        ("trial/trainer.py", "import mlflow", "one trial is pure PyTorch"),
        ("track/mlflow.py", "from sweeper.spec import SweepSpec", "the tracker is a generic MLflow adapter"),
        ("search/checkpoints.py", "from sweeper.search import runner", "no import cycles"),
        ("search/warm_start.py", "from sweeper.trial import holdout", "the held-out test split is read once"),
    ],
)
def test_a_deliberate_violation_fails_the_contracts(tmp_path: Path, module: str, line: str, broken: str):
    shutil.copytree(REPO / "sweeper", tmp_path / "sweeper", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    target = tmp_path / "sweeper" / module
    target.write_text(f"{line}  # a deliberate violation\n" + target.read_text())
    proc = lint(tmp_path)
    assert proc.returncode == 1 and "BROKEN" in proc.stdout and broken in proc.stdout, proc.stdout + proc.stderr


def test_optunas_private_api_is_used_in_the_adapter_only():
    """Outside sweeper/search/optuna/rdb.py, a module that imports optuna reaches no private name
    (``x._name`` on anything but its own ``self``/``cls``, or an import from a private module):
    the adapter is the one place tested at both ends of the declared Optuna range."""
    import ast

    found = []
    for path in (REPO / "sweeper").rglob("*.py"):
        if path.name == "rdb.py" and path.parent.name == "optuna":
            continue
        tree = ast.parse(path.read_text())
        nodes = list(ast.walk(tree))
        modules = [n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)]
        modules += [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
        if not any(m.split(".")[0] == "optuna" for m in modules):
            continue
        where = path.relative_to(REPO)
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
                if "._" in (node.module or "") or any(a.name.startswith("_") for a in node.names):
                    found.append(f"{where}:{node.lineno}: from {node.module} import ...")
    assert not found, found
