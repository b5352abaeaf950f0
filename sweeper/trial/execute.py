"""Run one trial to an Outcome, whatever happens inside it: the code every executor shares (this
process, a worker process, a Ray actor, a replay). After every epoch it asks ``decide`` whether
to stop (a pruner's answer); it never raises for the trial's own failure."""

from __future__ import annotations

import gc
import platform
import time
import traceback
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

__all__ = ["Decide", "Outcome", "devices_used", "execute", "execute_group", "release_device_memory", "saves_state"]

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
    return bool(config.checkpoint) and bool(config.checkpoint_every) and epoch % config.checkpoint_every == 0


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (text if isinstance(exc, TrialFailed) else f"{type(exc).__name__}: {text}")[:500]


def execute(
    config: TrialConfig,
    decide: Decide,
    worker_index: int = 0,
    cache: ProcessCache | None = None,
    ranks: Ranks | None = None,
) -> Outcome:
    """Train ``config`` on its device; save its final training state to ``config.checkpoint``.
    ``cache``: the process's data set and compiled forwards, kept for its next trials. A trial
    of ``train.devices`` > 1 runs as that many processes (trial/launch.py), each of which calls
    this with its ``ranks``: rank 0 saves the states and its Outcome is the trial's."""
    if config.spec.train.devices > 1 and ranks is None:
        return launch.launch(config, decide, worker_index)
    main = ranks is None or ranks.main
    out = Outcome(config.number, TrialState.FAILED)
    started = time.perf_counter()
    extra = {"trial": config.number, "params": config.params}
    limit = TimeLimit(config.spec.train.max_trial_seconds)
    last: dict[str, Any] = {}  # the latest training state and the epoch last saved

    def on_epoch_end(state: checkpoint.State) -> None:
        last["state"] = state
        if main and config.checkpoint and saves_state(config, state["epoch"]):
            with limit.shielded():  # a checkpoint is written whole (no temp file left behind)
                checkpoint.save(Path(config.checkpoint), {**state, **extra})
            last["saved"] = state["epoch"]

    def report(epoch: int, metrics: dict[str, float]) -> None:
        out.history.append(metrics)
        with limit.shielded():  # a question and its answer over a worker's pipe: never cut in two
            prune = decide(config.number, epoch, metrics)
        if prune:
            raise TrialPruned(f"pruned at epoch {epoch}")

    try:
        with limit:
            train = config.spec.train
            if config.threads is not None:
                configure_torch(threads=config.threads, deterministic=train.deterministic)
            device = ranks.device if ranks is not None else resolve_device(train.device, worker_index)
            out.info = {
                "device": str(device),
                "device_name": _device_name(device),
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "cuda": torch.version.cuda or "none",
            }
            resume = None
            if config.resume is not None:
                # loaded on the CPU, then into model and optimizer, which put each tensor where it belongs
                # (an optimizer's step counters stay on the CPU: on the GPU they would sync every step)
                resume = checkpoint.Resume(checkpoint.load(Path(config.resume)), config.new_hyperparameters)
                out.history = [dict(h) for h in resume.state["history"]]
                last["state"] = resume.state
            trained = run_trial(
                config, report, device, out.info, resume=resume, on_epoch_end=on_epoch_end, cache=cache, ranks=ranks
            )
            if main:
                out.info["footprint"] = footprint.measure(trained.model, trained.data, config.spec)
            if main and config.checkpoint and last.get("saved") != last["state"]["epoch"]:
                checkpoint.save(Path(config.checkpoint), {**last["state"], **extra})
            out.state = TrialState.COMPLETE
    except TrialPruned as exc:
        out.state, out.reason = TrialState.PRUNED, str(exc)
    except TrialPreempted as exc:  # its state after the epoch just reported saved: continued from it later
        state = last.get("state")
        if main and config.checkpoint and state is not None and last.get("saved") != state["epoch"]:
            checkpoint.save(Path(config.checkpoint), {**state, **extra})
        out.state, out.reason, out.failure = TrialState.INTERRUPTED, str(exc), FailureKind.PREEMPTED
        out.info["resume"] = config.checkpoint if state is not None else None
    except TrialTimedOut:
        out.reason, out.error = (
            timed_out_reason(limit.seconds or 0, time.perf_counter() - started),
            traceback.format_exc(),
        )
        out.failure = FailureKind.TIMED_OUT
    except torch.cuda.OutOfMemoryError as exc:  # the machine's limit, not the trial's fault: retried
        out.reason, out.error = f"{OOM}: {reason_of(exc)}", traceback.format_exc()
        out.failure = FailureKind.OUT_OF_MEMORY
    except Exception as exc:  # a failing trial never kills the sweep
        out.reason, out.error = reason_of(exc), traceback.format_exc()
        out.failure = _context_lost(exc)
    finally:
        release_device_memory()
    out.info["seconds"] = time.perf_counter() - started  # in the worker: excludes queueing
    out.info["device_seconds"] = out.info["seconds"] * devices_used(
        out.info.get("device", "cpu"), torch.get_num_threads()
    )
    return out


def execute_group(
    configs: list[TrialConfig], decide: Decide, worker_index: int = 0, cache: ProcessCache | None = None
) -> list[Outcome]:
    """Train ``configs`` as one fused model (trial/fused.py; see fused.plan): one Outcome per
    member, as its solo run would give (its history, state, reason and checkpoint). A group that
    cannot train fused (its first step fails) trains one member at a time instead, and each
    Outcome says why in ``info["fuse_fallback"]``."""
    cache = cache if cache is not None else ProcessCache()  # one data set for every member
    if len(configs) == 1:
        return [execute(configs[0], decide, worker_index, cache)]
    outs = {c.number: Outcome(c.number, TrialState.FAILED) for c in configs}
    started = time.perf_counter()
    info: dict[str, Any] = {"fused_with": [c.number for c in configs]}
    sizes: dict[int, dict[str, float]] = {}  # each complete member's footprint

    limit = TimeLimit(configs[0].spec.train.max_trial_seconds)  # the fused model's: its members share it

    def report(index: int, epoch: int, metrics: dict[str, float]) -> None:
        number = configs[index].number
        outs[number].history.append(metrics)
        with limit.shielded():  # a question and its answer over a worker's pipe: never cut in two
            prune = decide(number, epoch, metrics)
        if prune:
            raise TrialPruned(f"pruned at epoch {epoch}")

    try:
        with limit:
            first = configs[0]
            if first.threads is not None:
                configure_torch(threads=first.threads, deterministic=first.spec.train.deterministic)
            device = resolve_device(first.spec.train.device, worker_index)
            info.update(
                device=str(device),
                device_name=_device_name(device),
                threads=torch.get_num_threads(),
                torch=torch.__version__,
                cuda=torch.version.cuda or "none",
            )
            members = fused.fit_fused(configs, device, report, cache=cache)
            info.update(members[0].parts.data_info(), fused_engine=members[0].engine)
            for member in members:
                out = outs[member.config.number]
                out.state, out.reason = member.state, member.reason
                if member.state == TrialState.COMPLETE:  # its model has its own storage again
                    sizes[member.config.number] = footprint.measure(
                        member.parts.model, member.parts.data, member.config.spec
                    )
                if member.state == TrialState.COMPLETE and member.config.checkpoint:
                    state = member.training_state()
                    checkpoint.save(
                        Path(member.config.checkpoint),
                        {**state, "trial": member.config.number, "params": member.config.params},
                    )
    except fused.NotFusable as exc:  # before any member trained an epoch: each trains alone
        release_device_memory()
        solo = [execute(config, decide, worker_index, cache) for config in configs]
        for out in solo:
            out.info["fuse_fallback"] = str(exc)
        return solo
    except Exception as exc:  # the fused model failed as a whole: its running members fail with it (out of
        # memory: each is retried with smaller micro-batches); those pruned or failed before keep their end
        left = {m.config.number: m for m in getattr(exc, "fused_members", []) if m.state.finished}
        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        timed_out = isinstance(exc, TrialTimedOut)
        for number, out in outs.items():
            if number in left:
                out.state, out.reason = left[number].state, left[number].reason
                continue
            out.state, out.error = TrialState.FAILED, traceback.format_exc()
            out.reason = f"{OOM}: {reason_of(exc)}" if oom else reason_of(exc)
            out.failure = FailureKind.OUT_OF_MEMORY if oom else _context_lost(exc)
            if timed_out:
                out.reason = timed_out_reason(limit.seconds or 0, time.perf_counter() - started)
                out.failure = FailureKind.TIMED_OUT
    finally:
        release_device_memory()
    seconds = time.perf_counter() - started  # the group's wall time: each member's share is seconds / N
    share = seconds * devices_used(str(info.get("device", "cpu")), torch.get_num_threads()) / len(configs)
    for number, out in outs.items():
        out.info = {
            **info,
            "seconds": seconds,
            "device_seconds": share,  # the members' shares add up to the group's device time
            **({"footprint": sizes[number]} if number in sizes else {}),
        }
    return [outs[c.number] for c in configs]


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
