"""The Optuna backend: one study (sqlite in the output folder, or search.storage), trials
proposed in seeded batches by a coordinator in this process and run inline or in a local
worker pool.

- study.py        storage, sampler, pruner; recovery of interrupted trials; FrozenTrial -> TrialRecord
- coordinator.py  ask, prune against earlier batches, tell, log
"""

from __future__ import annotations

from pathlib import Path

from sweeper.search.backend import SearchContext, SearchResult
from sweeper.spec import SweepSpec


class OptunaBackend:
    def check(self, spec: SweepSpec, out_dir: Path) -> None:
        pass  # the spec's own validation covers the Optuna options

    def run(self, spec: SweepSpec, ctx: SearchContext) -> SearchResult:
        from sweeper.search.optuna import study as studies
        from sweeper.search.optuna.coordinator import Coordinator
        from sweeper.search.pool import executor

        study = studies.open_study(spec, ctx.out_dir)
        requeued = studies.recover_interrupted(study)
        if requeued:
            ctx.observer.note(f"trial(s) {', '.join(map(str, requeued))} were left running by a stopped process: "
                              f"marked failed and queued again")
        if not study.get_trials(deepcopy=False):  # a resumed study has run (or queued) them already
            for params in ctx.enqueue:
                study.enqueue_trial(params)
        done = studies.counted(study)
        remaining = None if spec.search.n_trials is None else max(0, spec.search.n_trials - done)
        if done:
            ctx.observer.note(f"resuming: {done} trial(s) already done, "
                              f"{'no cap' if remaining is None else remaining} to go")
        coordinator = Coordinator(spec, study, ctx)
        if remaining != 0:
            pool = executor(spec.search.parallel, coordinator.decide, coordinator.record)
            try:
                coordinator.run(remaining, pool)
            finally:
                pool.close()
        return SearchResult(coordinator.records(), studies.storage_url(spec, ctx.out_dir))
