"""The vocabulary of a trial's life, one spelling for every module: the state a trial is in
(``TrialState``: the Outcome of an execution, a TrialRecord, trial.json, summary.json, the Optuna
and Ray adapters) and why a trial failed when that is not the trial's own doing (``FailureKind``:
what the search answers with a retry or a new worker). Both are ``StrEnum``s: their values are the
strings summary.json and MLflow have always carried, so records written before read the same."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["FailureKind", "TrialState"]


class TrialState(StrEnum):
    WAITING = "waiting"  # proposed, not claimed by any process yet
    RUNNING = "running"
    COMPLETE = "complete"  # trained every epoch; its objective values count
    PRUNED = "pruned"  # stopped early by the pruner; its epochs count
    FAILED = "failed"  # raised, or its result could not be measured (FailureKind says when not its own fault)
    INTERRUPTED = "interrupted"  # its process died or its lease ran out: retried, this attempt does not count

    @property
    def finished(self) -> bool:
        """No more epochs will come: complete, pruned, failed or interrupted."""
        return self not in (TrialState.WAITING, TrialState.RUNNING)

    @property
    def trained(self) -> bool:
        """It trained at least one epoch to the pruner's or its own end: complete or pruned."""
        return self in (TrialState.COMPLETE, TrialState.PRUNED)


class FailureKind(StrEnum):
    """Why a trial failed, where the answer is the search's, not the trial's: each kind has a
    response (retried, a new worker, the sweep stopped). A failure of the trial's own (a plugin
    raising, a NaN loss) has no kind."""

    OUT_OF_MEMORY = "oom"  # the device ran out of memory: retried with train.accumulate doubled
    LOST_WORKER = "lost_worker"  # its worker process died (killed, crashed): retried with the same params
    LOST_CONTEXT = "lost_context"  # the CUDA context of its process is unusable: the process is replaced
    LOST_LEASE = "lost_lease"  # its process stopped renewing its lease (another machine): retried
    # its device was wanted by a sweep of higher priority (a queue): stopped after an epoch, its
    # state saved, retried from that state (not counted against search.max_retries)
    PREEMPTED = "preempted"
    TIMED_OUT = "timed_out"  # it ran past train.max_trial_seconds: stopped, its device freed, not retried
