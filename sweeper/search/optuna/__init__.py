"""The Optuna backend: one study (sqlite in the output folder, or search.storage: PostgreSQL for
many machines), served by any number of processes (`sweeper run`, `sweeper worker`), each running
its trials inline or in a local worker pool.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.search.state import Role

if TYPE_CHECKING:  # imported on use: the adapter (rdb.py) loads without torch
    from sweeper.search.backend import SearchContext, SearchResult
    from sweeper.spec import SweepSpec


class OptunaBackend:
    def check(self, spec: SweepSpec, out_dir: Path) -> None:
        # the spec's own validation covers the Optuna options; the storage opens in store()
        if spec.search.warm_start:
            from sweeper.search.optuna import earlier

            earlier.check(spec, out_dir)  # each earlier sweep is there, comparable, not this one

    def store(self, spec: SweepSpec, out_dir: Path):  # -> LedgerStore (imported on use: optuna, sqlalchemy)
        from sweeper.search.optuna.store import LedgerStore

        return LedgerStore(spec, out_dir)

    def run(self, spec: SweepSpec, ctx: SearchContext) -> SearchResult:
        from sweeper.search.backend import SearchResult
        from sweeper.search.optuna.coordinator import Coordinator
        from sweeper.search.optuna.store import LedgerStore
        from sweeper.search.optuna.study import safe_url
        from sweeper.search.pool import executor
        from sweeper.states import TrialState

        store = ctx.store
        assert isinstance(store, LedgerStore)
        coordinator = Coordinator(spec, store.study, store.ledger, store.heartbeat, ctx)
        done = sum(1 for r in coordinator.records() if TrialState(r.state).finished)
        if done:
            ctx.observer.note(f"joining: {done} trial(s) of the sweep already done")
        if spec.search.storage and spec.search.artifact_root is None and not ctx.tracker.enabled:
            ctx.observer.note(
                "search.storage is shared but checkpoints are not published (no MLflow tracking, no "
                "search.artifact_root): a trial trained on another machine cannot be exported here"
            )
        versions = store.space_versions()
        if versions and ctx.role == Role.RUN:  # resumed in a changed space: the sweep's run says which
            ctx.tracker.set_tags(ctx.sweep.parent_run_id, {"space_version": len(versions)})
        pool = executor(spec.search.parallel, coordinator.decide, coordinator.record, ctx.cache, ctx.prestarted)
        try:
            coordinator.run(pool)
        finally:
            pool.close()
        space: dict[str, Any] = {"space_version": len(versions) or 1}
        if versions:
            space["space_versions"] = versions
        return SearchResult(
            coordinator.records(), safe_url(store.url), space, device_hours=store.ledger.device_seconds() / 3600
        )
