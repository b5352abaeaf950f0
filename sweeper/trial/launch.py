"""A trial of ``train.devices`` N > 1: N processes, one per device, started as torchrun starts
them (RANK, LOCAL_RANK, WORLD_SIZE set; ``python -m sweeper.trial.rank``), from whichever
process trains the trial (a search.parallel worker, the sweep's own process, a Ray trial actor,
a replay): the same launcher on both backends, inside the devices the trial reserved.

This process stays the trial's face to the search: rank 0 sends each epoch's metrics here and
gets the pruner's (or a queue's preemption) answer back over a socket pair; each rank sends its
Outcome when it ends. A rank that dies (a signal, os._exit) or fails while the others may wait
for it in a collective ends the trial at once: every rank is killed (SIGKILL: a rank blocked in
a collective runs no Python that could stop it), so no device stays held. A rank killed from
outside is a lost process: the trial is interrupted and retried like a trial whose worker died;
a rank that raises fails the trial with its reason, as a one-device trial that raised does.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialPreempted
from sweeper.states import FailureKind, TrialState
from sweeper.trial.build import TrialConfig
from sweeper.trial.outcome import Decide, Outcome, devices_used
from sweeper.trial.time_limit import timed_out_reason

# past train.max_trial_seconds the ranks stop themselves (trial/time_limit.py); a rank stuck in a
# native call cannot: after this much longer they are killed from here
KILL_AFTER_S = 30.0


@dataclass(frozen=True)
class RankJob:
    """What every rank of one trial reads at its start (pickled to a file beside its store)."""

    config: TrialConfig
    worker_index: int  # the search.parallel worker's index: its ranks use devices index*N .. index*N+N-1
    store: str  # the rendezvous file of init_process_group (file://): fresh per trial, no port to race for
    parent: int  # this process: a rank whose parent is gone exits


def launch(config: TrialConfig, decide: Decide, worker_index: int = 0) -> Outcome:
    """Train ``config`` as ``train.devices`` ranks; their Outcome as one (rank 0's, or the
    failing rank's), with ``info["ranks"]`` and the device time of all of them."""
    n = config.spec.train.devices
    started = time.perf_counter()
    want_cuda = config.spec.train.device == "cuda" or (config.spec.train.device == "auto" and torch.cuda.is_available())
    visible = torch.cuda.device_count() if want_cuda else n
    if visible < n:
        out = Outcome(config.number, TrialState.FAILED)
        out.reason = f"train.devices is {n} but {visible} CUDA device(s) are visible to this worker"
        return out
    with tempfile.TemporaryDirectory(prefix="sweeper-ranks-") as tmp:
        job = Path(tmp) / "job.pkl"
        job.write_bytes(pickle.dumps(RankJob(config, worker_index, str(Path(tmp) / "store"), os.getpid())))
        gang = Gang(job, n)
        try:
            out = gang.run(config, decide)
        finally:
            gang.kill()
    seconds = time.perf_counter() - started
    threads = int(out.info.get("threads", 1)) * n  # rank 0's torch threads: each CPU rank has as many
    out.info.update(
        ranks=n,
        seconds=seconds,
        device_seconds=seconds * devices_used(str(out.info.get("device", "cpu")), threads, n),
    )
    return out


class Gang:
    """A trial's rank processes and this side of their socket pairs."""

    def __init__(self, job: Path, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []
        for rank in range(n):
            mine, theirs = socket.socketpair()
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n)}
            command = [sys.executable, "-m", "sweeper.trial.rank", str(job), str(rank), str(theirs.fileno())]
            self.procs.append(subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=env))
            theirs.close()
            self.conns.append(Connection(mine.detach()))

    def run(self, config: TrialConfig, decide: Decide) -> Outcome:
        """Answer rank 0's questions until every rank has sent its Outcome, or one has died or
        failed (then the others are killed by the caller)."""
        history: list[dict[str, float]] = []  # the epochs rank 0 reported, should it die
        ends: dict[int, Outcome] = {}
        listening = dict(enumerate(self.conns))
        limit = config.spec.train.max_trial_seconds
        deadline = None if limit is None else time.monotonic() + limit + KILL_AFTER_S
        started = time.perf_counter()
        while len(ends) < self.n:
            if deadline is not None and time.monotonic() > deadline:
                out = Outcome(config.number, TrialState.FAILED, history=history, failure=FailureKind.TIMED_OUT)
                out.reason = timed_out_reason(limit or 0, time.perf_counter() - started, how="killed")
                return out
            left = None if deadline is None else max(0.0, deadline - time.monotonic())  # None: no limit
            for ready in wait(list(listening.values()), timeout=left):
                rank = next(r for r, c in listening.items() if c is ready)
                conn = listening[rank]
                try:
                    message = conn.recv()
                except (EOFError, OSError):  # its end of the pair closed: the process is gone
                    return self._lost(config, rank, history)
                if message[0] == "decide":
                    _, number, epoch, metrics = message
                    history.append(metrics)
                    conn.send(_answer(decide, number, epoch, metrics))
                    continue
                ends[rank] = message[1]
                del listening[rank]
                if ends[rank].state == TrialState.FAILED:  # the others may wait for it in a collective
                    return _failed(ends[rank], rank, history)
        return ends[0]

    def _lost(self, config: TrialConfig, rank: int, history: list[dict[str, float]]) -> Outcome:
        try:
            code = self.procs[rank].wait(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:  # it closed its socket and lives on: killed with the rest
            code = None
        how = "closed its connection" if code is None else _exit_text(code)
        reason = f"rank {rank} of {self.n} died ({how}) during epoch {len(history) + 1}"
        return Outcome(
            config.number, TrialState.INTERRUPTED, history=history, reason=reason, failure=FailureKind.LOST_WORKER
        )

    def kill(self) -> None:
        """Every rank still running killed and reaped; the sockets closed."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        for conn in self.conns:
            conn.close()


def _answer(decide: Decide, number: int, epoch: int, metrics: dict[str, float]) -> tuple[Any, ...]:
    try:
        return ("prune",) if decide(number, epoch, metrics) else ("go",)
    except TrialPreempted as exc:  # every rank stops after this epoch; rank 0 saves the state
        return ("preempt", str(exc))


def _failed(out: Outcome, rank: int, history: list[dict[str, float]]) -> Outcome:
    """A rank's failure as the trial's: rank 0's Outcome as it is; another's with its rank named
    and the epochs rank 0 reported."""
    if rank == 0:
        return out
    reason = f"rank {rank}: {out.reason}"
    return Outcome(out.number, TrialState.FAILED, history, reason, out.error, out.info, out.failure)


def _exit_text(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
