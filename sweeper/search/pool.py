"""Executing trials on this machine: in this process (parallel: 1), or in a pool of worker
processes (parallel: N), one task each at a time. A task is one trial, or a group of trials
trained as one fused model (trial/fused.py).

A worker only trains (trial/execute.py). After every epoch it asks the coordinator (the backend,
in the main process) whether to go on; tracking and storage writes stay with the coordinator.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from sweeper.errors import SweepStopped
from sweeper.states import FailureKind, TrialState
from sweeper.trial.build import ProcessCache, TrialConfig
from sweeper.trial.execute import Decide, Outcome, devices_used, execute
from sweeper.trial.time_limit import timed_out_reason

# record(number, epoch, metrics): the epoch's slow side effects, run after the worker has its answer
Record = Callable[[int, int, dict[str, float]], None]
# How long the pool waits for a worker's message before it checks that the workers are alive (s)
POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # prctl(2) option


def kill_grace_s(limit_s: float) -> float:
    """How long past train.max_trial_seconds the pool waits before it kills a trial's worker (s):
    time for the trial's own watchdog (trial/time_limit.py) to stop it and its worker to report it,
    which keeps the worker and its process cache; a tenth of the limit, 2 s to 60 s."""
    return min(60.0, max(2.0, 0.1 * limit_s))


class Executor(Protocol):
    """Where a coordinator's trials run."""

    @property
    def slots(self) -> int:
        """Tasks it can start now."""

    def submit(self, task: list[TrialConfig]) -> None:
        """Start a task: one trial, or several trained as one fused model."""

    def results(self, timeout_s: float) -> Iterator[Outcome]:
        """Serve the running trials; yield those that finished, after at most ``timeout_s``
        without one (so that the caller can look at the study meanwhile)."""

    def close(self) -> None: ...


class Prestarted:
    """Worker processes spawned before their pool: their start (importing torch, then
    torch._dynamo, which torch.optim imports on first use; the cost: docs/speed.md#start-up)
    overlaps this process's own (the preflight, MLflow, the Optuna storage). The sweep holds them
    until its ProcessPool takes them; ``discard`` stops those no pool took."""

    def __init__(self) -> None:
        self.workers: list[tuple[Any, Connection]] = []  # (process, this side's pipe), by index

    def start(self, n: int) -> None:
        """Spawn workers until ``n`` wait."""
        ctx = mp.get_context("spawn")
        for index in range(len(self.workers), n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker_loop, args=(index, theirs, os.getpid()), daemon=True)
            proc.start()
            theirs.close()
            self.workers.append((proc, mine))

    def take(self, n: int) -> list[tuple[Any, Connection]]:
        """The first ``n`` workers, for a pool; the others are stopped (more than it needs)."""
        taken, self.workers = self.workers[:n], self.workers[n:]
        self.discard()
        return taken

    def discard(self) -> None:
        """Stop the workers no pool took (the sweep stopped before it trained)."""
        while self.workers:
            proc, conn = self.workers.pop()
            proc.terminate()  # it holds nothing yet: no trial, no file
            proc.join(timeout=5)
            conn.close()


def executor(
    parallel: int,
    decide: Decide,
    record: Record,
    cache: ProcessCache | None = None,
    prestarted: Prestarted | None = None,
) -> Executor:
    """Where the trials run: this process (parallel 1; with ``cache``, this process's data set
    and compiled forwards) or a pool of ``parallel`` workers (taking the ``prestarted`` ones)."""
    if parallel == 1:
        return InlineExecutor(decide, record, cache)
    return ProcessPool(parallel, decide, record, prestarted)


class InlineExecutor:
    """Runs each submitted trial at once, in this process (parallel: 1). The training thread
    waits only for the pruning decision; each epoch's records (MLflow, storage, display) are
    written by a recording thread, in order, meanwhile (a GPU is not left idle while they go
    out), and all of a trial's records are written before its outcome is handed on."""

    def __init__(self, decide: Decide, record: Record, cache: ProcessCache | None = None) -> None:
        self.decide, self.record = decide, record
        # this process's data set and compiled forwards, trial after trial
        self.cache = cache if cache is not None else ProcessCache()
        self.done: list[Outcome] = []
        self.recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweeper-record")  # one: in order

    @property
    def slots(self) -> int:
        return 0 if self.done else 1  # one trial at a time: finish it before starting the next

    def submit(self, task: list[TrialConfig]) -> None:
        records: list[Future[None]] = []

        def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
            try:  # the answer may be TrialPreempted (a queue's worker): the epoch is recorded still
                return self.decide(number, epoch, metrics)
            finally:
                records.append(self.recorder.submit(self.record, number, epoch, metrics))

        outcomes = execute(task, decide, cache=self.cache)
        for written in records:
            written.result()  # raises what the recording raised
        self.done.extend(outcomes)

    def results(self, timeout_s: float = 0.0) -> Iterator[Outcome]:
        while self.done:
            outcome = self.done.pop(0)
            yield outcome
            if outcome.context_lost:  # this process cannot use CUDA any more: a re-run starts afresh
                raise SweepStopped(
                    f"the sweep stopped: trial {outcome.number} broke this process's CUDA context ({outcome.reason}); "
                    f"no later trial could run in it. The trial is recorded as failed. Run the same command again: "
                    f"the sweep resumes in a new process (with search.parallel above 1, a worker process that "
                    f"breaks its context is replaced instead)"
                )

    def close(self) -> None:
        self.recorder.shutdown(wait=True)


class ProcessPool:
    """``n`` spawned worker processes, each running one trial at a time.

    Each worker talks to this process over a pipe of its own (task, epoch question, answer,
    outcome): nothing is shared between workers, so a worker killed at any moment (an OOM kill,
    a crash in native code) takes only its own pipe with it. Queues shared by all workers would
    not do: a worker killed while it holds a queue's lock blocks every other worker's writes."""

    def __init__(self, n: int, decide: Decide, record: Record, prestarted: Prestarted | None = None) -> None:
        self.ctx = mp.get_context("spawn")  # forking after torch/sqlite have started is unsafe
        self.decide, self.record = decide, record
        self.procs: list[Any] = [None] * n
        self.conns: list[Connection] = [None] * n  # type: ignore[list-item]
        taken = prestarted.take(n) if prestarted is not None else []
        for index in range(n):
            if index < len(taken):
                self.procs[index], self.conns[index] = taken[index]
            else:
                self._start_worker(index)
        self.running: dict[int, list[TrialConfig]] = {}  # worker index -> its task
        # worker index -> when it began its task (time.monotonic()): a worker still starting (importing
        # torch) when the task was sent does not spend the trial's train.max_trial_seconds
        self.started: dict[int, float] = {}
        self.epochs: dict[int, list[dict[str, float]]] = {}  # trial number -> the epochs it reported (a killed one's)
        self.oom_kills = oom_kill_count()

    @property
    def slots(self) -> int:
        return len(self.procs) - len(self.running)

    def _start_worker(self, index: int) -> None:
        mine, theirs = self.ctx.Pipe()
        self.procs[index] = self.ctx.Process(target=_worker_loop, args=(index, theirs, os.getpid()), daemon=True)
        self.procs[index].start()
        theirs.close()  # the worker's end lives in the worker: its death reads as end-of-file here
        self.conns[index] = mine

    def submit(self, task: list[TrialConfig]) -> None:
        index = next(i for i in range(len(self.procs)) if i not in self.running)
        self.running[index] = task
        _send(self.conns[index], task)

    def results(self, timeout_s: float = POLL_S) -> Iterator[Outcome]:
        """Serve pruning questions until a trial has finished (yield it) or ``timeout_s`` has
        passed without one."""
        deadline = time.monotonic() + timeout_s
        while self.running:
            overdue = list(self._stop_overdue())
            if overdue:
                yield from overdue
                return
            ready = wait(
                [self.conns[i] for i in self.running], timeout=min(POLL_S, max(0.0, deadline - time.monotonic()))
            )
            if not ready:
                dead = list(self._reap_dead())
                yield from dead
                if dead or time.monotonic() >= deadline:
                    return
                continue
            for ready_conn in ready:
                conn = cast(Connection, ready_conn)  # wait() returns the objects it was given
                index = self.conns.index(conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):  # the worker is gone
                    yield from self._reap_dead(wait_s=POLL_S)
                    return
                if kind == "start":
                    self.started[index] = time.monotonic()
                elif kind == "epoch":
                    number, epoch, metrics = payload
                    self.epochs.setdefault(number, []).append(metrics)
                    _send(conn, self.decide(number, epoch, metrics))
                    self.record(number, epoch, metrics)
                else:
                    for config in self.running.pop(index):
                        self.epochs.pop(config.number, None)
                    self.started.pop(index, None)
                    if any(o.context_lost for o in payload):  # the worker exits (see _worker_loop): a new one
                        self.procs[index].join()  # takes its place
                        self.conns[index].close()
                        self._start_worker(index)
                    yield from payload
                    return

    def _stop_overdue(self) -> Iterator[Outcome]:
        """Kill the workers whose task has run past train.max_trial_seconds and a grace (hung where
        the trial's own watchdog cannot raise: in native code, a collective); their trials fail,
        timed out (not retried), and a new worker takes each one's place."""
        now = time.monotonic()
        for index, task in list(self.running.items()):
            limit_s = task[0].spec.train.max_trial_seconds
            if limit_s is None or index not in self.started:
                continue
            ran_s = now - self.started[index]
            if ran_s < limit_s + kill_grace_s(limit_s):
                continue
            del self.running[index], self.started[index]
            kill_tree(self.procs[index].pid)
            self.procs[index].join()
            self.conns[index].close()
            self._start_worker(index)
            train = task[0].spec.train
            device = "cuda" if train.device != "cpu" and torch.cuda.is_available() else "cpu"  # as it ran
            threads = task[0].threads or 1  # the coordinator sets every trial's threads
            reason = timed_out_reason(limit_s, ran_s, "its worker process killed")
            for config in task:
                held = devices_used(device, threads, train.devices)
                info = {"seconds": ran_s, "device_seconds": ran_s * held / len(task)}
                history = self.epochs.pop(config.number, [])
                yield Outcome(
                    config.number, TrialState.FAILED, history, reason, failure=FailureKind.TIMED_OUT, info=info
                )

    def _reap_dead(self, wait_s: float = 0.0) -> Iterator[Outcome]:
        for index in list(self.running):
            proc = self.procs[index]
            proc.join(wait_s)
            if not proc.is_alive():
                task = self.running.pop(index)  # its trials are retried; the worker starts afresh, new pipe
                self.started.pop(index, None)
                for config in task:
                    self.epochs.pop(config.number, None)
                reason = death(proc.exitcode, self.oom_kills)
                yield from (
                    Outcome(config.number, TrialState.INTERRUPTED, reason=reason, failure=FailureKind.LOST_WORKER)
                    for config in task
                )
                self.oom_kills = oom_kill_count()
                self.conns[index].close()
                self._start_worker(index)

    def close(self) -> None:
        for conn in self.conns:
            _send(conn, None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        for conn in self.conns:
            conn.close()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process it started (their children read from /proc on Linux):
    a hung trial holds nothing that needs an orderly exit (its checkpoint is written atomically)."""
    for child in _children(pid):
        kill_tree(child)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _children(pid: int) -> list[int]:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # not Linux, or already gone
        return []
    found = []
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def oom_kill_count() -> int | None:
    """Processes the kernel's out-of-memory killer has killed in this process's memory cgroup, or
    None where that is not readable (cgroup v2: memory.events; v1: memory.oom_control)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "memory"):
            folder = Path("/sys/fs/cgroup", *(["memory"] if controllers else []), path.lstrip("/"))
            for name in ("memory.events", "memory.oom_control"):
                try:
                    found = re.search(r"^oom_kill (\d+)$", (folder / name).read_text(), re.MULTILINE)
                except OSError:
                    continue
                if found:
                    return int(found.group(1))
    return None


def death(exitcode: int | None, oom_kills_before: int | None) -> str:
    """Why a worker process ended, as the trial's reason: the system's out-of-memory killer
    (when the cgroup counted a kill meanwhile, or it was SIGKILLed), a signal, or an exit code."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            now = oom_kill_count()
            if now is not None and oom_kills_before is not None and now > oom_kills_before:
                return "its worker process was killed by the system's out-of-memory killer (SIGKILL)"
            return (
                "its worker process was killed (SIGKILL), most likely by the system for lack of memory "
                "(the kernel's out-of-memory killer; `dmesg` says) or by a user"
            )
        return f"its worker process was killed by {name}"
    return f"its worker process died (exit code {exitcode})"


def _send(conn: Connection, message: Any) -> None:
    try:
        conn.send(message)
    except OSError:  # the worker died: its end-of-file is read (and the trial failed) in results()
        pass


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the process that started it dies (even by
    SIGKILL), so an orphan never trains on, holding memory. Elsewhere the worker exits at its
    next message to the parent (the pipe is closed)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _worker_loop(index: int, conn: Connection, parent: int) -> None:
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        conn.send(("epoch", (number, epoch, metrics)))
        return conn.recv()

    from sweeper.trial import lazy_dynamo

    lazy_dynamo.defer()  # torch.optim imports no torch._dynamo unless a trial compiles
    cache = ProcessCache()  # the data set and compiled forwards of this worker's trials, for its lifetime
    try:
        while (task := conn.recv()) is not None:
            conn.send(("start", None))  # the trial's clock (train.max_trial_seconds) starts now
            outcomes = execute(task, decide, index, cache)
            conn.send(("end", outcomes))
            if any(
                o.context_lost for o in outcomes
            ):  # every later CUDA call here would fail: the pool starts a new worker
                return
    except (EOFError, OSError):  # the parent is gone: nobody wants the result
        pass
