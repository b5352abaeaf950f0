"""Run one trial, or the members of one fused model, to an Outcome each, whatever happens inside
it: the code every executor shares (this process, a worker process, a Ray actor, a replay). After
every epoch it asks ``decide`` whether to stop (a pruner's answer); it never raises for a trial's
own failure."""

from __future__ import annotations

import gc
import platform
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialFailed, TrialPreempted, TrialPruned
from sweeper.states import FailureKind, TrialState
from sweeper.trial import checkpoint, footprint, fused, launch
from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
from sweeper.trial.ddp import Ranks
from sweeper.trial.outcome import Decide, Outcome, devices_used
from sweeper.trial.seeding import configure_torch
from sweeper.trial.time_limit import TimeLimit, TrialTimedOut, timed_out_reason
from sweeper.trial.trainer import resolve_device

__all__ = ["Decide", "Outcome", "devices_used", "execute", "release_device_memory", "saves_state"]

OOM = FailureKind.OUT_OF_MEMORY.value  # the reason's prefix of a trial out of device memory (its failure says so)
# What CUDA reports once a kernel has faulted: the process's CUDA context is unusable from then on
# (every later call fails), so the process that ran the trial must not run another.
CONTEXT_LOST = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "uncorrectable ECC error",
)


def saves_state(config: TrialConfig, epoch: int) -> bool:
    """True if the trial's training state is saved to ``config.checkpoint`` after this epoch."""
    every = bool(config.checkpoint_every) and epoch % config.checkpoint_every == 0
    return bool(config.checkpoint) and (every or epoch == config.pause_epoch)


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (text if isinstance(exc, TrialFailed) else f"{type(exc).__name__}: {text}")[:500]


@dataclass
class _Run:
    """One execute call: its trials' outcomes (by number), the time limit they share (a fused
    model's members share their model's), what they share of ``info`` and when it started."""

    configs: list[TrialConfig]
    decide: Decide
    limit: TimeLimit
    outs: dict[int, Outcome]
    info: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def report(self, number: int, epoch: int, metrics: dict[str, float]) -> None:
        """Trial ``number``'s epoch to the caller's ``decide``; TrialPruned when it says stop."""
        self.outs[number].history.append(metrics)
        with self.limit.shielded():  # a question and its answer over a worker's pipe: never cut in two
            prune = self.decide(number, epoch, metrics)
        if prune:
            raise TrialPruned(f"pruned at epoch {epoch}")

    def fail(self, exc: Exception) -> None:
        """Every trial not ended before ``exc`` fails with its reason (out of memory: retried
        with smaller micro-batches; past the time limit); a fused model's members that had left
        (pruned, failed) keep their end."""
        left = {m.config.number: m for m in getattr(exc, "fused_members", []) if m.state.finished}
        for number, out in self.outs.items():
            if number in left:
                out.state, out.reason = left[number].state, left[number].reason
                continue
            out.state, out.error, out.reason = TrialState.FAILED, traceback.format_exc(), reason_of(exc)
            if isinstance(exc, TrialTimedOut):
                out.reason = timed_out_reason(self.limit.seconds or 0, time.perf_counter() - self.started)
                out.failure = FailureKind.TIMED_OUT
            elif isinstance(exc, torch.cuda.OutOfMemoryError):  # the machine's limit, not the trial's fault
                out.reason, out.failure = f"{OOM}: {out.reason}", FailureKind.OUT_OF_MEMORY
            else:
                out.failure = _context_lost(exc)

    def outcomes(self) -> list[Outcome]:
        """The outcomes, in the configs' order, each with the shared info, the wall time (in the
        worker: excludes queueing) and its share of the device time (the shares add up)."""
        seconds = time.perf_counter() - self.started
        used = devices_used(str(self.info.get("device", "cpu")), torch.get_num_threads())
        for out in self.outs.values():
            out.info = {**self.info, **out.info, "seconds": seconds, "device_seconds": seconds * used / len(self.outs)}
        return [self.outs[c.number] for c in self.configs]


def execute(
    configs: Sequence[TrialConfig],
    decide: Decide,
    worker_index: int = 0,
    cache: ProcessCache | None = None,
    ranks: Ranks | None = None,
) -> list[Outcome]:
    """Train ``configs`` on their device, one Outcome each: one trial alone, or several as one
    fused model (trial/fused.py; see fused.plan) whose members each end as their solo runs would
    (history, state, reason, checkpoint). A group that cannot train fused (its first step fails)
    trains one trial at a time instead, each Outcome saying why in ``info["fuse_fallback"]``.
    ``cache``: the process's data set and compiled forwards, kept for its next trials. A trial
    of ``train.devices`` > 1 runs as that many processes (trial/launch.py), each of which calls
    this with its ``ranks``: rank 0 saves the states and its Outcome is the trial's."""
    cache = cache if cache is not None else ProcessCache()  # one data set for every member
    first = configs[0]
    if len(configs) == 1 and first.spec.train.devices > 1 and ranks is None:
        return [launch.launch(first, decide, worker_index)]
    outs = {c.number: Outcome(c.number, TrialState.FAILED) for c in configs}
    run = _Run(list(configs), decide, TimeLimit(first.spec.train.max_trial_seconds), outs)
    try:
        with run.limit:
            device = _start(run, worker_index, ranks)
            if len(configs) == 1:
                _alone(run, device, cache, ranks)
            else:
                _fused(run, device, cache)
    except fused.NotFusable as exc:  # before any member trained an epoch: each trains alone
        release_device_memory()
        solo = [execute([config], decide, worker_index, cache)[0] for config in configs]
        for out in solo:
            out.info["fuse_fallback"] = str(exc)
        return solo
    except Exception as exc:  # a failing trial never kills the sweep
        run.fail(exc)
    finally:
        release_device_memory()
    return run.outcomes()


def _start(run: _Run, worker_index: int, ranks: Ranks | None) -> torch.device:
    """The process's threads and the trials' device, described in the shared info."""
    train = run.configs[0].spec.train
    if run.configs[0].threads is not None:
        configure_torch(threads=run.configs[0].threads, deterministic=train.deterministic)
    device = ranks.device if ranks is not None else resolve_device(train.device, worker_index)
    run.info.update(
        device=str(device),
        device_name=_device_name(device),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        cuda=torch.version.cuda or "none",
    )
    return device


def _alone(run: _Run, device: torch.device, cache: ProcessCache, ranks: Ranks | None) -> None:
    """Train the one trial; save its training state to ``config.checkpoint`` (every
    ``checkpoint_every`` epochs and at its end; when preempted, after its last epoch)."""
    config = run.configs[0]
    out = run.outs[config.number]
    main = ranks is None or ranks.main
    extra = {"trial": config.number, "params": config.params}
    last: dict[str, Any] = {}  # the latest training state and the epoch last saved

    def save(state: checkpoint.State) -> None:
        if main and config.checkpoint and last.get("saved") != state["epoch"]:
            with run.limit.shielded():  # a checkpoint is written whole (no temp file left behind)
                checkpoint.save(Path(config.checkpoint), {**state, **extra})
            last["saved"] = state["epoch"]

    def on_epoch_end(state: checkpoint.State) -> None:
        last["state"] = state
        if saves_state(config, state["epoch"]):
            save(state)

    resume = None
    if config.resume is not None:
        # loaded on the CPU, then into model and optimizer, which put each tensor where it belongs
        # (an optimizer's step counters stay on the CPU: on the GPU they would sync every step)
        resume = checkpoint.Resume(checkpoint.load(Path(config.resume)), config.new_hyperparameters)
        out.history = [dict(h) for h in resume.state["history"]]
        last["state"] = resume.state
    try:
        trained = run_trial(
            config,
            lambda epoch, metrics: run.report(config.number, epoch, metrics),
            device,
            out.info,
            resume=resume,
            on_epoch_end=on_epoch_end,
            cache=cache,
            ranks=ranks,
        )
    except TrialPruned as exc:
        out.state, out.reason = TrialState.PRUNED, str(exc)
        paused = config.pause_on_prune or len(out.history) == config.pause_epoch
        if config.pause_on_prune and "state" in last:
            save(last["state"])
        if paused and last.get("saved") == len(out.history):  # promotable: continued from this state
            out.info["resume"] = config.checkpoint
        return
    except TrialPreempted as exc:  # its state after the epoch just reported saved: continued from it later
        if "state" in last:
            save(last["state"])
        out.state, out.reason, out.failure = TrialState.INTERRUPTED, str(exc), FailureKind.PREEMPTED
        out.info["resume"] = config.checkpoint if "state" in last else None
        return
    if main:
        out.info["footprint"] = footprint.measure(trained.model, trained.data, config.spec)
        save(last["state"])
    out.state = TrialState.COMPLETE


def _fused(run: _Run, device: torch.device, cache: ProcessCache) -> None:
    """Train the trials as one fused model; save each complete member's state to its checkpoint."""
    run.info["fused_with"] = [c.number for c in run.configs]
    members = fused.fit_fused(
        run.configs, device, lambda k, epoch, metrics: run.report(run.configs[k].number, epoch, metrics), cache=cache
    )
    run.info.update(members[0].parts.data_info(), fused_engine=members[0].engine)
    for member in members:
        config, out = member.config, run.outs[member.config.number]
        out.state, out.reason = member.state, member.reason
        if member.state != TrialState.COMPLETE:
            continue
        # the member's model has its own storage again (fit_fused released the fused tensors)
        out.info["footprint"] = footprint.measure(member.parts.model, member.parts.data, config.spec)
        if config.checkpoint:
            state = member.training_state()
            checkpoint.save(Path(config.checkpoint), {**state, "trial": config.number, "params": config.params})


def release_device_memory() -> None:
    """Give the CUDA memory a finished trial cached back (the next trial, or another process on
    the GPU, may need it); the sweep's data set stays (it is held by the data cache)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()  # an exception's frames may still hold the trial's tensors
        torch.cuda.empty_cache()


def _context_lost(exc: BaseException) -> FailureKind | None:
    """LOST_CONTEXT when CUDA reported a fault that leaves the process's context unusable."""
    lost = isinstance(exc, torch.AcceleratorError) and any(m in str(exc) for m in CONTEXT_LOST)
    return FailureKind.LOST_CONTEXT if lost else None


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
