"""The Optuna coordinator: one per process serving the sweep. It claims trials, answers its
workers' pruning questions, tells results and logs them; workers only train.

Many processes (on many machines) may serve one study: each trial is claimed by exactly one
(an atomic WAITING -> RUNNING update) and leased to it (lease.py); the budget is claimed in the
ledger (ledger.py), so it is spent exactly once whatever the number of processes.

Reproducible mode (default): trials are proposed in batches of ``search.batch_size``. Batch b
(named by its first slot) is proposed, once, by whichever process first claims it in the
ledger, from the results of the trials of earlier batches only (with ``search.staleness`` S,
of the batches before b less the last S), by a sampler seeded from the sweep's "sampler" stream
at b; each trial is pruned against those same trials (a "shadow" in-memory study). A batch is
proposed only when every trial of the batches it knows has finished.
The sampler's input and every pruning decision are then functions of the seed and of results,
never of timing, so any number of processes and workers gives the same trial table.
``reproducible: false`` asks a new trial whenever a worker is free and prunes against
everything reported so far: more throughput, no such guarantee.

Fused trials (search.fuse): a process claims the waiting trials of one chunk of a batch together
(chunks of ``fuse`` slots: which trials share a fused model is a function of the spec, never of
timing) and hands them to one worker as one task; trials of another architecture in the chunk
wait as further tasks (see trial/fused.py: plan).

The coordinator composes the parts of a trial's life, each given its collaborators:
proposer.py (the budget; claiming WAITING trials; proposing batches or single trials),
batches.py (the views of earlier batches that sample a batch and prune its trials), live.py
(the trials this process trains: start, pruning, epochs, end), recovery.py (lost and
out-of-memory trials, a dead lock holder's work, the circuit breaker).
"""

from __future__ import annotations

import time

import optuna
import torch

from sweeper.errors import TrialPreempted
from sweeper.phases import launched_at
from sweeper.search.backend import SearchContext
from sweeper.search.optuna import lease
from sweeper.search.optuna.batches import EarlierBatches
from sweeper.search.optuna.finished import FinishedTrials
from sweeper.search.optuna.ledger import Ledger, Sweep
from sweeper.search.optuna.live import LiveTrials
from sweeper.search.optuna.proposer import Budget, Found, Proposer
from sweeper.search.optuna.recovery import POLL_S, Breaker, Recovery
from sweeper.search.optuna.study import records
from sweeper.search.pool import Executor
from sweeper.spec import SweepSpec
from sweeper.track.records import TrialRecord
from sweeper.trial.build import TrialConfig


class Coordinator:
    """Serves the sweep from this process: claims and proposes trials, hands them to the
    executor, answers its pruning questions and records its epochs and results."""

    def __init__(
        self, spec: SweepSpec, study: optuna.Study, ledger: Ledger, heartbeat: lease.Heartbeat, ctx: SearchContext
    ) -> None:
        self.spec, self.study, self.ledger = spec, study, ledger
        # trials per fused model (1: none fused)
        cuda = spec.train.device != "cpu" and torch.cuda.is_available()
        fuse = spec.search.fuse_size(cuda=cuda) if spec.train.devices == 1 else 1  # a DDP trial trains alone
        self.device_unit = "GPU-hours" if cuda else "core-hours"  # what search.budget counts here
        self.observer = ctx.observer
        self.budget = Budget(spec, study, ctx.role)
        # reproducible: false proposes and prunes in a view of the finished trials (finished.py)
        self.batches = EarlierBatches(spec, study, ctx.enqueue, FinishedTrials(spec, study, ledger.member))
        self.proposer = Proposer(spec, study, ledger, heartbeat, self.budget, self.batches, ctx.tracker, fuse)
        self.recovery = Recovery(spec, study, ledger, ctx, self.proposer, self.batches)
        self.breaker = Breaker(spec, study, ledger, self.budget, ctx)
        self.live = LiveTrials(spec, study, heartbeat, ctx, self.batches, self.recovery, self.breaker, fuse)
        self.pending: list[list[TrialConfig]] = []  # claimed tasks waiting for a free worker
        # elsewhere(waiting, spent): asked before each claim (False) and while nothing can be
        # claimed until other processes' trials end (True), with the device-seconds this process's
        # trials of the sweep have spent so far; True: this process serves another sweep now (a
        # queue's worker), once the trials it holds have finished
        self.elsewhere = ctx.elsewhere or (lambda waiting, spent: False)
        self.spent_here = 0.0
        self.preempt = ctx.preempt if spec.search.parallel == 1 else None  # raised in this process only

    def run(self, executor: Executor) -> None:
        """Serve the sweep until its budget is spent (a worker), and every trial has finished
        (``sweeper run``), or until ``sweeper stop``, or until ``elsewhere()`` (a queue's worker)
        once the trials this process holds have finished. The heartbeat runs meanwhile."""
        while True:
            self.recovery.recover(self.live.ids())
            sweep = self._read()
            if self.spec.search.budget is not None:  # the ledger's deadline holds search.budget's clock
                self.live.clock_end = sweep.deadline()
            if executor.slots and self.pending:  # claimed already: they run even after a stop request
                executor.submit(self.pending.pop(0))
                continue
            # a queue's worker (search/queue) leaves for another sweep instead of claiming here
            leaving = bool(executor.slots) and not sweep.stop and self.elsewhere(False, self.spent_here)
            if executor.slots and not sweep.stop and not leaving:
                proposal = self.proposer.next(sweep)
                if proposal.found is Found.TRIALS:
                    tasks = self.live.start(proposal.trials)
                    executor.submit(tasks[0])
                    self.pending.extend(tasks[1:])
                if proposal.found is not Found.NOTHING:
                    continue
            if self.live:
                for outcome in executor.results(POLL_S):
                    self.live.finish(outcome)
                    self.ledger.spend(outcome.info.get("device_seconds", 0.0))
                    self.spent_here += outcome.info.get("device_seconds", 0.0)
                continue
            if leaving:
                return
            if self.budget.over(sweep):
                if self.breaker.stopped is not None:
                    raise self.breaker.stopped
                if sweep.device_budget_spent():
                    self.observer.note(budget_spent(sweep, self.device_unit))
                elif self.spec.search.budget is not None and clock_ran_out(sweep):
                    self.observer.note(clock_ran_out(sweep))
                return
            # a queue's worker: another sweep has a trial to claim while this one's batch runs
            # elsewhere (not while another process holds the lock for a moment: it proposes)
            if sweep.proposing is None and self.elsewhere(True, self.spent_here):
                return
            time.sleep(POLL_S)  # the trials of this batch run elsewhere: the next batch waits for them

    def _read(self) -> Sweep:
        sweep = self.ledger.read()
        assert sweep is not None, "the ledger row exists once the sweep is prepared"
        return sweep

    def decide(self, number: int, epoch: int, metrics: dict[str, float]) -> bool:
        """True if the pruner stops trial ``number`` after this epoch (a worker waits for it);
        TrialPreempted (a queue's worker, trials trained in this process) when a sweep of higher
        priority wants the device."""
        prune = self.live.decide(number, epoch, metrics)
        if not prune and self.preempt is not None and self.live.fuse == 1 and (why := self.preempt()):
            # its epoch is reported; the trial stops here, its state saved, and is retried from it
            raise TrialPreempted(f"preempted after epoch {epoch} {why}")
        return prune

    def record(self, number: int, epoch: int, metrics: dict[str, float]) -> None:
        """An epoch's metrics stored, logged and shown, after the worker has its answer."""
        self.live.record(number, epoch, metrics)

    def records(self) -> list[TrialRecord]:
        """Every trial of the study (earlier invocations' and other processes' included)."""
        return records(self.study)


def budget_spent(sweep: Sweep, unit: str) -> str:
    """The line that says why a sweep stopped claiming trials: its device budget is spent."""
    cap = sweep.device_budget_s() or 0.0
    spent = sweep.device_seconds / 3600
    return f"device-hour budget spent: {spent:.4g} of {cap / 3600:.4g} {unit}; no further trial claimed"


def clock_ran_out(sweep: Sweep) -> str:
    """The line that says why a sweep with search.budget stopped claiming trials at its clock's
    deadline (the ledger's); '' before it."""
    end = sweep.deadline()
    if end is None or time.time() < end:
        return ""
    return (
        f"search.budget's clock ran out: trials until {end - launched_at():.1f} s from launch, the rest kept "
        "for the finish; no further trial claimed (docs/strategy.md#a-budget-true-to-the-clock)"
    )
