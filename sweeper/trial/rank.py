"""One rank of a DDP trial: ``python -m sweeper.trial.rank JOB RANK FD`` (trial/launch.py starts
N of them). It joins the trial's process group (NCCL on CUDA, gloo on the CPU), trains its share
through the same ``execute`` as a one-device trial, and sends its Outcome to the launcher over
the socket ``FD``. Rank 0 asks the launcher after each epoch whether to go on and shares the
answer with the others, so every rank stops at the same epoch."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import torch.distributed as dist

from sweeper.errors import TrialPreempted
from sweeper.states import TrialState
from sweeper.trial.ddp import Ranks
from sweeper.trial.execute import execute, reason_of
from sweeper.trial.launch import RankJob
from sweeper.trial.outcome import Decide, Outcome
from sweeper.trial.trainer import resolve_device

# a collective that waits this long for a peer fails (a peer that died is noticed by the launcher
# first, which kills every rank; this bounds a rank whose launcher is gone as well)
COLLECTIVE_TIMEOUT_S = 600
PARENT_CHECK_S = 1.0  # how often a rank looks whether its launcher still lives


def main() -> None:
    job_file, rank, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conn = Connection(fd)
    job: RankJob = pickle.loads(Path(job_file).read_bytes())
    _exit_with(job.parent)
    config, n = job.config, job.config.spec.train.devices
    try:
        # worker w's ranks: devices w*N .. w*N+N-1 (search.parallel workers never share one)
        device = resolve_device(config.spec.train.device, job.worker_index * n + rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = f"file://{job.store}"
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        dist.init_process_group(backend, init_method=store, rank=rank, world_size=n, timeout=timeout)
    except Exception as exc:  # no device, no process group: the trial fails with why
        out = Outcome(config.number, TrialState.FAILED, reason=f"rank {rank}: {reason_of(exc)}")
        out.error = traceback.format_exc()
        conn.send(("outcome", out))
        return
    ranks = Ranks(rank, n, device)
    if device.type == "cpu":  # the trial's CPU threads (default: the machine's) shared by its ranks
        config = replace(config, threads=max(1, (config.threads or torch.get_num_threads()) // n))
    (out,) = execute([config], _decide(ranks, conn), job.worker_index, ranks=ranks)
    conn.send(("outcome", out))
    if out.state != TrialState.FAILED:  # a failed rank's peers may wait in a collective: no farewell
        dist.destroy_process_group()


def _decide(ranks: Ranks, conn: Connection) -> Decide:
    """Rank 0 asks the launcher; every rank acts on its answer."""

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        answer = None
        if ranks.main:
            conn.send(("decide", number, epoch, metrics))
            answer = conn.recv()
        answer = ranks.share(answer)
        if answer[0] == "preempt":
            raise TrialPreempted(answer[1])
        return bool(answer[0] == "prune")

    return decide


def _exit_with(parent: int) -> None:
    """Exit when the launcher's process is gone (killed with its worker): a rank must not hold
    its device, nor wait in a collective, for a trial nobody reads any more."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="sweeper-rank-parent", daemon=True).start()


if __name__ == "__main__":
    main()
