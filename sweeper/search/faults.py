"""What a sweep does when trials fail, whichever backend runs them: a failure the trial's own
configuration causes is recorded (and, repeated from the start, stops the sweep: the circuit
breaker); a failure of resources (out of memory, a worker killed) is retried.

- ``breaker_trips``: the first ``search.max_failures_in_a_row`` trials all failed with the same
  error and none finished: every later trial would most likely hit it too, so the sweep stops
  with that error rather than spend its budget (GPU-hours) on it.
- ``oom_retry``: a trial out of (CUDA) memory is run again with ``train.accumulate`` doubled: the
  same optimizer steps over micro-batches half as large, so its activations need about half
  the memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sweeper.errors import SweepStopped
from sweeper.spec import SweepSpec
from sweeper.states import FailureKind, TrialState
from sweeper.track.records import TrialRecord

_NUMBER = re.compile(r"\d+(\.\d+)?")
# The failures of a machine, not of the trial's configuration: the trial is retried, and its
# failure says nothing about its parameters. Not LOST_CONTEXT: the kernel fault that broke the
# context is most likely the trial's own (its process is replaced; the trial is not retried).
RESOURCE_FAILURES = (FailureKind.OUT_OF_MEMORY, FailureKind.LOST_WORKER, FailureKind.LOST_LEASE)


def resource_failure(record: TrialRecord) -> bool:
    """True for a failed trial that failed for lack of a machine's resources (RESOURCE_FAILURES)."""
    return record.failure in RESOURCE_FAILURES


def same_error(reason: str) -> str:
    """A failure's reason with its numbers masked: 'size mismatch 12 vs 13' and '14 vs 15' agree."""
    return _NUMBER.sub("#", reason)


def breaker_trips(spec: SweepSpec, records: Iterable[TrialRecord]) -> str | None:
    """The error that stops the sweep, or None. Trips when no trial has completed or been pruned
    (pruned trials trained: their configuration works) and the first ``max_failures_in_a_row``
    failed trials (in trial order, resource failures aside) failed with the same error."""
    limit = spec.search.max_failures_in_a_row
    if not limit:
        return None
    failures = []
    for r in sorted(records, key=lambda r: r.number):
        if r.state.trained:
            return None
        if r.state == TrialState.FAILED and not resource_failure(r):
            failures.append(r)
    if len(failures) < limit or len({same_error(r.reason or "") for r in failures[:limit]}) != 1:
        return None
    return failures[0].reason or "an unknown error"


def breaker(spec: SweepSpec, records: list[TrialRecord], left: int | None) -> SweepStopped | None:
    """The error that stops the sweep when the breaker trips on ``records`` (``left``: trials of
    the budget not started), else None; it says what to do next."""
    error = breaker_trips(spec, records)
    if error is None:
        return None
    failed = [r for r in records if r.state == TrialState.FAILED and not resource_failure(r)]
    budget = f"the other {left} trial(s) of the budget were not started" if left else "no further trial started"
    run = failed[0].mlflow_run_id
    traceback = f"error.txt in MLflow run {run} (trial {failed[0].number})" if run else "in its MLflow run"
    return SweepStopped(
        f"the sweep stopped: its first {len(failed)} trials ({', '.join(str(r.number) for r in failed)}) all failed "
        f"with the same error and none completed, so the others would most likely fail too ({budget}).\n"
        f"  {error}\nThe traceback: {traceback}. Fix the cause and run the same command again: the sweep "
        f"resumes, failed trials stay recorded. To keep trying regardless, set search.max_failures_in_a_row "
        f"higher (0: never stop)."
    )


def oom_retry(trial_spec: SweepSpec, attempt: int) -> int | None:
    """The ``train.accumulate`` of the next attempt of a trial (its spec, values applied) that ran
    out of memory on its ``attempt``-th attempt (1-based), or None when no retry is left:
    ``search.max_retries`` spent, or micro-batches of one sample already (on each rank: a DDP
    rank's batch is its share of train.batch_size)."""
    train = trial_spec.train
    doubled = train.accumulate * 2
    if attempt > trial_spec.search.max_retries or doubled > train.batch_size // train.devices:
        return None
    return doubled
