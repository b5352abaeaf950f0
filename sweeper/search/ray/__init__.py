"""The Ray Tune backend: the same spec and trial code as the Optuna backend, scheduled by Tune
on a local Ray or a cluster.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""

from __future__ import annotations

from pathlib import Path

from sweeper.search.backend import SearchContext, SearchResult
from sweeper.search.state import FileStore
from sweeper.spec import SweepSpec


class RayBackend:
    def check(self, spec: SweepSpec, out_dir: Path) -> None:
        from sweeper.search.ray import cluster
        from sweeper.track.mlflow import resolve_uri

        addr = cluster.address(spec)
        cluster.storage_path(spec, out_dir, addr)
        cluster.check_tracking(resolve_uri(spec.tracking.mlflow_uri) if spec.tracking.enabled else None, addr)

    def store(self, spec: SweepSpec, out_dir: Path) -> FileStore:
        return FileStore(out_dir)  # one driver process serves a Ray sweep

    def run(self, spec: SweepSpec, ctx: SearchContext) -> SearchResult:
        from sweeper.search.ray import driver

        return driver.run(spec, ctx)
