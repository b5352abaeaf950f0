"""The local worker pool: trials in this process or in spawned worker processes, each epoch's
pruning question answered before its slow side effects, a dead worker replaced."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from conftest import config, learned

from sweeper.search.pool import InlineExecutor, Prestarted, ProcessPool, executor
from sweeper.trial.build import ProcessCache, TrialConfig


def task(number: int, tmp: Path, **kwargs) -> TrialConfig:
    base = config(seed=number + 1, epochs=3)
    return TrialConfig(number, base.seed, {}, base.spec, threads=1, checkpoint=str(tmp / f"{number}.pt"), **kwargs)


class Calls:
    """decide/record callbacks that remember their order; prune trial ``prune`` at ``at``."""

    def __init__(self, prune: int | None = None, at: int = 2) -> None:
        self.log: list[tuple[str, int, int]] = []
        self.prune, self.at = prune, at
        self.threads: set[str] = set()  # where record ran

    def decide(self, number: int, epoch: int, metrics: dict[str, float]) -> bool:
        self.log.append(("decide", number, epoch))
        return number == self.prune and epoch >= self.at

    def record(self, number: int, epoch: int, metrics: dict[str, float]) -> None:
        self.log.append(("record", number, epoch))
        self.threads.add(threading.current_thread().name)


def test_inline_executor_runs_one_trial_at_a_time(tmp_path: Path):
    calls = Calls()
    pool = executor(1, calls.decide, calls.record)
    assert isinstance(pool, InlineExecutor) and pool.slots == 1
    pool.submit([task(0, tmp_path)])
    assert pool.slots == 0  # its result must be collected before the next trial starts
    (outcome,) = list(pool.results())
    assert outcome.state == "complete" and len(outcome.history) == 3 and pool.slots == 1
    # each epoch: the pruning question first, then its side effects, written by the recording
    # thread (the training thread goes on meanwhile), every one before the outcome is handed on
    decided = [entry for entry in calls.log if entry[0] == "decide"]
    recorded = [entry for entry in calls.log if entry[0] == "record"]
    assert decided == [("decide", 0, e) for e in (1, 2, 3)] and recorded == [("record", 0, e) for e in (1, 2, 3)]
    assert all(calls.log.index(("decide", 0, e)) < calls.log.index(("record", 0, e)) for e in (1, 2, 3))
    assert calls.threads == {"sweeper-record_0"} and threading.current_thread().name not in calls.threads
    assert (tmp_path / "0.pt").is_file()  # the final training state


def test_process_pool_runs_trials_side_by_side_and_prunes(tmp_path: Path):
    calls = Calls(prune=1, at=2)
    prestarted = Prestarted()
    prestarted.start(2)  # as run_sweep does, before its preflight: the pool takes these workers
    early = [proc.pid for proc, _ in prestarted.workers]
    pool = ProcessPool(2, calls.decide, calls.record, prestarted)
    assert [proc.pid for proc in pool.procs] == early and not prestarted.workers
    try:
        pool.submit([task(0, tmp_path)])
        pool.submit([task(1, tmp_path)])
        assert pool.slots == 0
        outcomes = {}
        while len(outcomes) < 2:
            outcomes.update({o.number: o for o in pool.results(timeout_s=1)})
    finally:
        pool.close()
    assert outcomes[0].state == "complete" and len(outcomes[0].history) == 3
    assert outcomes[1].state == "pruned" and outcomes[1].reason == "pruned at epoch 2"
    assert len(outcomes[1].history) == 2 and not (tmp_path / "1.pt").exists()
    for number, epochs in ((0, 3), (1, 2)):
        mine = [(kind, e) for kind, n, e in calls.log if n == number]
        assert mine == [(kind, e) for e in range(1, epochs + 1) for kind in ("decide", "record")]
    # a worker trains exactly what this process would
    inline = InlineExecutor(lambda *a: False, lambda *a: None)
    inline.submit([task(0, tmp_path / "inline")])
    assert learned(next(inline.results()).history) == learned(outcomes[0].history)


def test_prestarted_workers_that_no_pool_takes_are_stopped():
    prestarted = Prestarted()
    prestarted.start(2)
    procs = [proc for proc, _ in prestarted.workers]
    prestarted.discard()  # the sweep stopped before it trained (a spec or preflight error)
    assert not prestarted.workers and not any(proc.is_alive() for proc in procs)


def test_a_dead_worker_interrupts_its_trial_and_is_replaced(tmp_path: Path):
    pool: ProcessPool

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        if number == 0:  # trial 0's worker dies while it waits for this answer (an OOM kill, say)
            os.kill(pool.procs[0].pid, signal.SIGKILL)
            pool.procs[0].join()
        return False

    pool = ProcessPool(1, decide, lambda *a: None)
    try:
        pool.submit([task(0, tmp_path)])
        (dead,) = list(pool.results(timeout_s=300))
        # the coordinator retries an interrupted trial (tests/test_distributed.py)
        # SIGKILL is what the kernel's out-of-memory killer sends: the reason says so
        assert dead.state == "interrupted" and dead.reason.startswith("its worker process was killed (SIGKILL)")
        assert "out-of-memory killer" in dead.reason
        assert pool.slots == 1 and pool.procs[0].is_alive()  # a new worker, with a new pipe, took its place
        pool.submit([task(1, tmp_path)])
        (alive,) = list(pool.results(timeout_s=300))
    finally:
        pool.close()
    assert alive.state == "complete" and alive.number == 1


def test_the_trials_of_one_process_share_its_data_set(tmp_path: Path):
    """A worker process (and the sweep's own, inline) loads the data set once, not per trial:
    its ProcessCache holds it from one trial to the next."""
    cache = ProcessCache()
    inline = InlineExecutor(lambda *a: False, lambda *a: None, cache)
    inline.submit([task(0, tmp_path)])
    (first,) = cache.data.held.values()
    inline.submit([task(1, tmp_path)])
    assert [o.state for o in inline.results()] == ["complete"] * 2
    (second,) = cache.data.held.values()
    assert second[0] is first[0]
    inline.close()
