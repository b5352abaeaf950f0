"""Executing trials: in this process, or in a pool of worker processes.

A worker only trains. After every epoch it asks the coordinator (the backend, in the main
process) whether to go on; tracking and storage writes stay with the coordinator.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from sweeper.errors import TrialFailed, TrialPruned

# decide(number, epoch, metrics) -> True to prune the trial now (fast: a worker waits for it)
Decide = Callable[[int, int, dict[str, float]], bool]
# record(number, epoch, metrics): the epoch's slow side effects, run after the worker has its answer
Record = Callable[[int, int, dict[str, float]], None]


@dataclass(frozen=True)
class Task:
    number: int
    seed: int
    params: dict[str, Any]
    spec: dict[str, Any]  # the trial's resolved spec (plain data: it crosses processes)
    threads: int  # torch CPU threads for this trial
    checkpoint: str  # where a completed trial's checkpoint (its final training state) goes
    # epochs between training states saved to `checkpoint` while training (0: only the final one)
    checkpoint_every: int = 0
    resume: str | None = None  # a training state file to continue from instead of epoch 1
    # resume from another trial's state with this task's hyperparameters (PBT; see checkpoint.Resume)
    new_hyperparameters: bool = False


@dataclass
class Outcome:
    number: int
    state: str  # complete | pruned | failed
    history: list[dict[str, float]] = field(default_factory=list)
    reason: str | None = None
    error: str | None = None  # traceback, for the trial's MLflow run
    info: dict[str, Any] = field(default_factory=dict)  # device, data fingerprint, versions


def saves_state(task: Task, epoch: int) -> bool:
    """True if the trial's training state is saved to ``task.checkpoint`` after this epoch."""
    return bool(task.checkpoint_every) and epoch % task.checkpoint_every == 0


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (text if isinstance(exc, TrialFailed) else f"{type(exc).__name__}: {text}")[:500]


def execute(task: Task, decide: Decide, worker_index: int = 0) -> Outcome:
    """Run one trial to an Outcome; never raises for a trial's own failure."""
    import torch

    from sweeper import checkpoint
    from sweeper.seeding import configure_torch
    from sweeper.spec import SweepSpec
    from sweeper.trainer import resolve_device
    from sweeper.trial import TrialConfig, run_trial

    out = Outcome(task.number, "failed")
    started = time.perf_counter()
    extra = {"trial": task.number, "params": task.params}
    last: dict[str, Any] = {}  # the latest training state and the epoch last saved

    def on_epoch_end(state: checkpoint.State) -> None:
        last["state"] = state
        if saves_state(task, state["epoch"]):
            checkpoint.save(Path(task.checkpoint), {**state, **extra})
            last["saved"] = state["epoch"]

    def report(epoch: int, metrics: dict[str, float]) -> None:
        out.history.append(metrics)
        if decide(task.number, epoch, metrics):
            raise TrialPruned(f"pruned at epoch {epoch}")

    try:
        spec = SweepSpec.model_validate(task.spec)
        configure_torch(threads=task.threads, deterministic=spec.train.deterministic)
        device = resolve_device(spec.train.device, worker_index)
        out.info = {"device": str(device), "device_name": _device_name(device), "threads": task.threads,
                    "torch": torch.__version__, "cuda": torch.version.cuda or "none"}
        resume = None
        if task.resume is not None:
            resume = checkpoint.Resume(checkpoint.load(Path(task.resume), device), task.new_hyperparameters)
            out.history = [dict(h) for h in resume.state["history"]]
            last["state"] = resume.state
        run_trial(TrialConfig(task.number, task.seed, task.params, spec), report, device, out.info,
                  resume=resume, on_epoch_end=on_epoch_end)
        if last.get("saved") != last["state"]["epoch"]:
            checkpoint.save(Path(task.checkpoint), {**last["state"], **extra})
        out.state = "complete"
    except TrialPruned as exc:
        out.state, out.reason = "pruned", str(exc)
    except Exception as exc:  # a failing trial never kills the sweep
        out.reason, out.error = reason_of(exc), traceback.format_exc()
    out.info["seconds"] = time.perf_counter() - started  # in the worker: excludes queueing
    return out


def _device_name(device: Any) -> str:
    import platform

    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


class InlineExecutor:
    """Runs each submitted trial at once, in this process (parallel: 1)."""

    def __init__(self, decide: Decide, record: Record) -> None:
        self.decide, self.record = decide, record
        self.done: list[Outcome] = []
        self.busy = 0

    @property
    def slots(self) -> int:
        return 0 if self.done else 1  # one trial at a time: finish it before starting the next

    def submit(self, task: Task) -> None:
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
        self.running: dict[int, Task] = {}  # worker index -> its task

    @property
    def slots(self) -> int:
        return len(self.procs) - len(self.running)

    def submit(self, task: Task) -> None:
        index = next(i for i in range(len(self.procs)) if i not in self.running)
        self.running[index] = task
        self.tasks_q[index].put(task)

    def results(self) -> Iterator[Outcome]:
        """Serve pruning questions until at least one trial has finished; yield the finished."""
        while self.running:
            try:
                kind, index, payload = self.results_q.get(timeout=0.5)
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
        ctx = mp.get_context("spawn")
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
