"""The installed package is the tested package: the wheel a user would install (`pip wheel .`,
what deploy/Dockerfile installs), installed non-editable into a fresh virtual environment, runs a
sweep to its end (summary, export in every format, report) and the commands that read files
shipped with it (`sweeper init --from`, `sweeper report`, `sweeper predict`).

Every other test runs the editable tree, which finds any module in the folder whether the wheel
holds it or not: sweeper.review was missing from the wheel, and every installed sweep died at its
end. The fresh environment gets its dependencies (torch, MLflow, ...: gigabytes) from this test's
own environment through a path entry, not its packages: sweeper itself comes from the wheel alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, sweeper_calls, write_spec

# what deploy/Dockerfile copies into its build: the wheel is built from these alone
SOURCES = ("pyproject.toml", "setup.py", "README.md", "sweeper", "plugins", "search_spaces")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with sweeper installed from its wheel; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "tree"
    tree.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, tree / name)
    # --no-build-isolation: the build's setuptools is this environment's (the test extra's), no download
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(tree), "-w", str(root)],
        check=True,
        capture_output=True,
    )
    (wheel,) = root.glob("sweeper-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    purelib = Path(
        subprocess.check_output(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # the dependencies: this environment's site-packages as a path entry (its .pth files, such as
    # the editable install's finder of this checkout, are not run from there)
    (purelib / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    return venv / "bin"


def _env() -> dict[str, str]:
    """The fresh venv's processes see nothing of this environment but the dependencies' path entry."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(bin_dir / "sweeper"), *args], cwd=cwd, capture_output=True, text=True, timeout=900, env=_env()
    )
    assert proc.returncode == 0, f"sweeper {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


def test_the_image_builds_the_wheel_from_the_same_sources():
    builder = (REPO / "deploy" / "Dockerfile").read_text().split(" AS builder", 1)[1].split(" AS runtime", 1)[0]
    copied = {path.rstrip("/") for line in re.findall(r"^COPY (.+) \S+$", builder, re.M) for path in line.split()}
    assert copied == {*SOURCES, "deploy/constraints.txt"}


def test_the_wheel_holds_every_package_of_the_tree(installed: Path):
    wheel = next(installed.parent.parent.glob("sweeper-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [p.parent.relative_to(REPO).as_posix() for p in (REPO / "sweeper").rglob("__init__.py")]
    assert packages and all(f"{p}/__init__.py" in names for p in packages), sorted(
        p for p in packages if f"{p}/__init__.py" not in names
    )
    assert "sweeper/py.typed" in names  # type checkers read the plugin contract's annotations
    assert {f"sweeper_plugins/search_spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.yaml")} <= names


def test_the_installed_package_runs_a_sweep_to_its_end(installed: Path, workdir: Path):
    python = installed / "python"
    found = subprocess.check_output(
        [python, "-c", "import sweeper, sweeper_plugins; print(sweeper.__file__, sweeper_plugins.__file__)"],
        cwd=workdir,
        text=True,
    )
    assert str(REPO) not in found and str(installed.parent) in found, found
    # the quick commands in one interpreter of the installed package; the sweep by its console script
    listed, _ = sweeper_calls(
        python, ["plugins"], ["init", "--from", "smoke", "--out", "spec.yaml"], cwd=workdir, env=_env()
    )
    assert "mlp" in listed  # and a search space the wheel ships was copied:
    write_spec(workdir / "spec.yaml", export={"formats": ["torchscript", "pt2", "onnx"]})
    _run(
        installed, "run", "spec.yaml", "search.n_trials=2", "train.epochs=2", "--out", "runs/w", "--quiet", cwd=workdir
    )
    out = workdir / "runs" / "w"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"] is not None and (out / "report.html").is_file()
    exported = json.loads((out / "export.json").read_text())
    assert {e["format"] for e in exported["formats"] if "error" not in e} == {"torchscript", "pt2", "onnx"}

    np.save(workdir / "x.npy", np.zeros((2, 1, 4, 4), dtype=np.float32))
    _, predicted = sweeper_calls(
        python,
        ["report", str(out), "--out", "again.html"],
        ["predict", str(out / "model.onnx"), "x.npy"],
        cwd=workdir,
        env=_env(),
    )
    assert (workdir / "again.html").stat().st_size > 10_000
    assert predicted.strip()
