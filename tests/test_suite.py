"""The suite's own set-up: ``./dev test`` runs two pytest-xdist workers with ``--dist loadgroup``,
each test in its module's group (tests/conftest.py), so that a module's shared sweeps (module
fixtures) are made once and the Ray modules run one at a time."""

from __future__ import annotations

import pytest


def test_each_test_runs_in_its_modules_xdist_group(request: pytest.FixtureRequest):
    if not getattr(request.config.option, "loadgroup", False):  # what pytest-xdist sets on its workers
        pytest.skip("not on a pytest-xdist worker under --dist loadgroup")
    # pytest-xdist sends a group to one worker by the '@group' suffix it gives the test's nodeid
    assert request.node.nodeid.endswith("@test_suite"), request.node.nodeid
