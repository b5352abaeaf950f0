"""The Optuna backend: one study (sqlite in the output folder, or search.storage: PostgreSQL for
many machines), served by any number of processes (`sweeper run`, `sweeper worker`), each running
its trials inline or in a local worker pool.

- rdb.py          the adapter: every use of Optuna's private API (a trial's claim, lease renewal
                  and end, one transaction each; storage ids; system attrs; stale heartbeats)
- engine.py       the database engine's settings; creating tables while other processes race
- study.py        storage, sampler, pruner; the user attrs a trial carries; FrozenTrial -> TrialRecord
                  (the one map between Optuna's trial states and sweeper's)
- ledger.py       sweeper's rows beside the study: preparation, budget claims, members, stop
- store.py        joining a sweep: the study and ledger of this process, the spec check
- lease.py        trial leases: heartbeats, stale trials
- coordinator.py  the loop serving the sweep, composed of:
  - proposer.py   the budget; claiming waiting trials; proposing a batch (or one trial)
  - batches.py    the views of earlier batches that sample a batch and prune its trials
  - live.py       the trials this process trains: start, pruning, epochs, end
  - recovery.py   lost and out-of-memory trials, a dead lock holder's work; the circuit breaker
- status.py       `sweeper status`, `sweeper stop`, `sweeper dashboard`
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported on use: the adapter (rdb.py) loads without torch
    from sweeper.search.backend import SearchContext, SearchResult
    from sweeper.spec import SweepSpec


class OptunaBackend:
    def check(self, spec: SweepSpec, out_dir: Path) -> None:
        pass  # the spec's own validation covers the Optuna options; the storage opens in store()

    def store(self, spec: SweepSpec, out_dir: Path):  # -> LedgerStore (imported on use: optuna, sqlalchemy)
        from sweeper.search.optuna.store import LedgerStore

        return LedgerStore(spec, out_dir)

    def run(self, spec: SweepSpec, ctx: SearchContext) -> SearchResult:
        from sweeper.search.backend import SearchResult
        from sweeper.search.optuna.coordinator import Coordinator
        from sweeper.search.optuna.store import LedgerStore
        from sweeper.search.optuna.study import safe_url
        from sweeper.search.pool import executor
        from sweeper.trial.states import TrialState

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
        pool = executor(spec.search.parallel, coordinator.decide, coordinator.record, ctx.cache, ctx.prestarted)
        try:
            coordinator.run(pool)
        finally:
            pool.close()
        return SearchResult(coordinator.records(), safe_url(store.url), store.ledger.device_seconds() / 3600)
