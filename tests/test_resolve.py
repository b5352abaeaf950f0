"""One resolve step (sweeper/plan/resolve.py): `sweeper validate` is a view of the sweep that
`sweeper run` records, the same spec and the same warnings, for plain, auto-strategy and derived
specs alike; and every shipped spec resolves through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import SPACES, sweeper

from sweeper.plan.resolve import resolve_sweep
from sweeper.spec import load

# a sweep of one trial of one epoch, nothing exported or tracked: what run records, fast
ONE_TRIAL = ("search.n_trials=1", "train.epochs=1", "tracking.enabled=false", "export.formats=[]")


def warnings_of(stderr: str) -> list[str]:
    return [line.removeprefix("warning:").strip() for line in stderr.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize(
    "spec, flags",
    [
        ("smoke", ()),  # written by hand; one epoch leaves the median pruner nothing to judge: a warning
        ("digits", ("--auto", "search.sampler=auto", "search.pruner=auto")),  # derived, chosen
        ("diabetes", ("search.sampler=auto",)),  # a regression, its objective the task's
    ],
)
def test_run_records_the_spec_and_warnings_validate_prints(workdir: Path, spec: str, flags: tuple[str, ...]):
    path, args = str(SPACES / f"{spec}.yaml"), [*ONE_TRIAL, *flags]
    validated = sweeper("validate", path, *args, check=True)
    ran = sweeper("run", path, *args, "--out", "out", "-q", check=True)
    recorded = yaml.safe_load((workdir / "out" / "spec.yaml").read_text())
    assert yaml.safe_load(validated.stdout) == recorded  # validate's comments are YAML comments
    assert warnings_of(validated.stderr) == warnings_of(ran.stderr)
    if spec == "smoke":
        assert any("pruner" in w for w in warnings_of(ran.stderr))  # the comparison compared something


@pytest.mark.parametrize("name", sorted(p.stem for p in SPACES.glob("*.yaml")))
def test_every_shipped_spec_resolves_without_building(name: str):
    """Each shipped spec resolves (derived, chosen, its task, its plugins bound); the dry build,
    which needs each one's data, is what the tests of its data set run."""
    loaded = load(SPACES / f"{name}.yaml")
    resolved = resolve_sweep(loaded, build=False)
    assert resolved.dry is None and not resolved.spec.search.auto
    assert resolved.spec.objective.direction in ("minimize", "maximize")
    assert resolve_sweep(resolved.spec, build=False).spec == resolved.spec  # resolving again changes nothing
