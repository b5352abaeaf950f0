"""Executing trials on this machine: in this process (parallel: 1), or in a pool of worker
processes (parallel: N), one trial each at a time.

A worker only trains (trial/execute.py). After every epoch it asks the coordinator (the backend,
in the main process) whether to go on; tracking and storage writes stay with the coordinator.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any, Callable, Iterator, Protocol

from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import Decide, Outcome, execute

# record(number, epoch, metrics): the epoch's slow side effects, run after the worker has its answer
Record = Callable[[int, int, dict[str, float]], None]
# How long the pool waits for a worker's message before it checks that the workers are alive (s)
POLL_S = 0.5


class Executor(Protocol):
    """Where a coordinator's trials run."""

    slots: int  # trials it can start now

    def submit(self, task: TrialConfig) -> None: ...
    def results(self) -> Iterator[Outcome]: ...
    def close(self) -> None: ...


def executor(parallel: int, decide: Decide, record: Record) -> Executor:
    return InlineExecutor(decide, record) if parallel == 1 else ProcessPool(parallel, decide, record)


class InlineExecutor:
    """Runs each submitted trial at once, in this process (parallel: 1)."""

    def __init__(self, decide: Decide, record: Record) -> None:
        self.decide, self.record = decide, record
        self.done: list[Outcome] = []

    @property
    def slots(self) -> int:
        return 0 if self.done else 1  # one trial at a time: finish it before starting the next

    def submit(self, task: TrialConfig) -> None:
        def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
            prune = self.decide(number, epoch, metrics)
            self.record(number, epoch, metrics)
            return prune

        self.done.append(execute(task, decide))

    def results(self) -> Iterator[Outcome]:
        while self.done:
            yield self.done.pop(0)

    def close(self) -> None:
        pass


class ProcessPool:
    """``n`` spawned worker processes, each running one trial at a time."""

    def __init__(self, n: int, decide: Decide, record: Record) -> None:
        ctx = mp.get_context("spawn")  # forking after torch/sqlite have started is unsafe
        self.decide, self.record = decide, record
        self.results_q = ctx.Queue()
        self.tasks_q = [ctx.Queue() for _ in range(n)]
        self.replies_q = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker_loop, args=(i, self.tasks_q[i], self.replies_q[i], self.results_q),
                                  daemon=True) for i in range(n)]
        for p in self.procs:
            p.start()
        self.running: dict[int, TrialConfig] = {}  # worker index -> its task

    @property
    def slots(self) -> int:
        return len(self.procs) - len(self.running)

    def submit(self, task: TrialConfig) -> None:
        index = next(i for i in range(len(self.procs)) if i not in self.running)
        self.running[index] = task
        self.tasks_q[index].put(task)

    def results(self) -> Iterator[Outcome]:
        """Serve pruning questions until at least one trial has finished; yield the finished."""
        while self.running:
            try:
                kind, index, payload = self.results_q.get(timeout=POLL_S)
            except queue.Empty:
                yield from self._reap_dead()
                continue
            if kind == "epoch":
                number, epoch, metrics = payload
                self.replies_q[index].put(self.decide(number, epoch, metrics))
                self.record(number, epoch, metrics)
            else:
                del self.running[index]
                yield payload
                return

    def _reap_dead(self) -> Iterator[Outcome]:
        for index, proc in enumerate(self.procs):
            if index in self.running and not proc.is_alive():
                task = self.running.pop(index)
                yield Outcome(task.number, "failed", reason=f"worker process died (exit code {proc.exitcode})")
                self._restart(index)

    def _restart(self, index: int) -> None:
        """A new worker in the dead one's place, with new queues: a process killed while waiting
        for a reply dies holding its queue's read lock, which would block its successor forever."""
        ctx = mp.get_context("spawn")
        self.tasks_q[index], self.replies_q[index] = ctx.Queue(), ctx.Queue()
        self.procs[index] = ctx.Process(target=_worker_loop, daemon=True,
                                        args=(index, self.tasks_q[index], self.replies_q[index], self.results_q))
        self.procs[index].start()

    def close(self) -> None:
        for q in self.tasks_q:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def _worker_loop(index: int, tasks: Any, replies: Any, results: Any) -> None:
    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        results.put(("epoch", index, (number, epoch, metrics)))
        return replies.get()

    while (task := tasks.get()) is not None:
        results.put(("end", index, execute(task, decide, index)))
