"""examples/sweeper-plugin-example, pip-installed into a fresh virtual environment: its plugins
are listed with their distribution, `sweeper init --from` copies its spec, a sweep using its
model, data set and optimizer completes, and its own test suite passes there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conftest import REPO, sweeper_calls

from sweeper.pluginhost import registry

EXAMPLE = REPO / "examples" / "sweeper-plugin-example"
DIST = "sweeper-plugin-example"


def run(*cmd: object, cwd: Path) -> str:
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_example_package_in_a_fresh_venv(tmp_path: Path, workdir: Path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    # Reuse this interpreter's packages (torch, sweeper, pip, setuptools): addsitedir also runs
    # their .pth files, which is what makes an editable sweeper importable there.
    target = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).strip())
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (target / "_sweeper_test_parent.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))

    source = tmp_path / "example"  # a copy: building writes build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", source, cwd=tmp_path)
    where = run(python, "-c", "import sweeper_plugin_example as m; print(m.__file__)", cwd=tmp_path)
    assert where.startswith(str(target))  # installed into the new venv ...
    assert "gated_mlp" not in {p.name for p in registry.list_plugins()}  # ... and only there

    listed, shown, _, provenance = sweeper_calls(
        python,
        ["plugins"],
        ["plugins", "show", "lion"],
        ["init", "--from", "spirals"],
        ["validate", "spirals.yaml"],
        cwd=workdir,
    )
    rows = [line.split("│")[1:6] for line in listed.splitlines() if DIST in line]
    assert sorted(tuple(c.strip() for c in r[:4]) for r in rows) == [
        ("datasets", "spirals", DIST, "0.1.0"),
        ("models", "gated_mlp", DIST, "0.1.0"),
        ("optimizers", "lion", DIST, "0.1.0"),
        ("search_spaces", "spirals", DIST, "0.1.0"),
    ]
    shown = " ".join(shown.split())
    assert "lr 0.0001 float" in shown and "beta1 0.9 float" in shown and "plugin API 1" in shown
    assert f"dataset.spirals={DIST}==0.1.0, model.gated_mlp={DIST}==0.1.0, optimizer.lion={DIST}==0.1.0" in provenance
    run(
        python,
        "-m",
        "sweeper",
        "run",
        "spirals.yaml",
        "search.n_trials=2",
        "train.epochs=2",
        "tracking.enabled=false",
        "--quiet",
        "--out",
        "out",
        cwd=workdir,
    )
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert summary["counts"] == {"complete": 2}
    assert [summary["spec"][s]["plugin"] for s in ("dataset", "model", "optimizer")] == ["spirals", "gated_mlp", "lion"]
    assert summary["best"]["value"] > 1 / 3  # better than chance on 3 arms
    exported = summary["export"]["formats"]  # the spec lists none: the default, pt2 and ONNX (docs/export.md)
    assert [e["format"] for e in exported] == ["pt2", "onnx"] and not [e for e in exported if "error" in e], exported

    tests = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", source / "tests", cwd=source)
    assert "4 passed" in tests
