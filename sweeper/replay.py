"""Replay one trial from its MLflow run (its trial.json: see track/records.py) and compare every
per-epoch metric with the record. A trial trained fused with others trains again with the same
members, fused as before (so bitwise on a CPU), or alone with ``solo``."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.pluginhost.binding import provenance
from sweeper.spec.objectives import FOOTPRINT_METRICS
from sweeper.states import TrialState
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.records import TrialJson, load_trial
from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import Decide, Outcome, execute
from sweeper.trial.seeding import derive

# Wall-clock and memory readings differ run to run by nature; everything else must match.
UNREPRODUCIBLE = ("epoch_seconds", "samples_per_s", "gpu_mem_peak_mb")
GPU_RTOL = 1e-3  # relative tolerance on CUDA without train.deterministic (kernel choice varies)
# A fused trial (trained with others as one model) replayed solo: batched kernels round differently.
# This bounds the difference measured in fp32 on the CPU with a wide margin
# (docs/fused-trials.md#correctness). A trial whose training amplifies rounding (a high learning
# rate: as a change of thread count does) can drift past it: replayed with its fused group it is
# bitwise.
FUSED_RTOL = 1e-5


@dataclass
class ReplayReport:
    run_id: str
    number: int
    epochs: int
    tolerance: float  # relative; 0.0 means bitwise
    max_difference: float = 0.0  # the largest relative difference between recorded and replayed metrics
    mismatches: list[tuple[int, str, float, float]] = field(default_factory=list)  # epoch, metric, recorded, replayed
    warnings: list[str] = field(default_factory=list)
    state: str = ""
    fused_with: list[int] = field(default_factory=list)  # the members it trained with again (fused), if any
    fused_alone: bool = False  # it trained fused, and was replayed alone

    @property
    def matches(self) -> bool:
        return not self.mismatches


def replay(run_id: str, tracking_uri: str, solo: bool = False) -> ReplayReport:
    """Train the trial of run ``run_id`` again from its trial.json (with its fused group, unless
    ``solo``) and compare it with the record: every per-epoch metric, the model's size, and the
    plugins, data seed and software it trained with (differences in those are warnings only)."""
    tracker = Tracker(tracking_uri)
    run, record = load_trial(tracker, run_id)
    tags = run.data.tags
    _refuse_pbt_exploit(run_id, tags)
    spec = record.spec
    history = _recorded_history(tracker, run_id, run.data.metrics)
    epochs = len(history.get(spec.objective.metric, []))
    on_gpu = tags.get(f"{TAG}device", "cpu").startswith("cuda")
    tolerance = GPU_RTOL if on_gpu and not spec.train.deterministic else 0.0
    members = json.loads(tags.get(f"{TAG}fused_with", "[]"))
    report = ReplayReport(run_id, record.number, epochs, tolerance)
    _warn_of_provenance(record, report)
    outcome = _train_again(tracker, run, record, members, solo, report)
    report.state = outcome.state
    _warn_of_environment(tags, outcome, report)
    _compare_metrics(run.data.metrics.get("params"), history, outcome, report)
    return report


def _refuse_pbt_exploit(run_id: str, tags: dict[str, str]) -> None:
    """A UserError for a trial that continued from another's checkpoint: replay cannot reproduce it."""
    if f"{TAG}pbt_donor" in tags:
        raise UserError(
            f"run {run_id} continued from trial {tags[f'{TAG}pbt_donor']}'s checkpoint (a PBT "
            f"exploit): replay trains from epoch 1 and cannot reproduce it; replay the trials "
            f"of its lineage instead"
        )


def _recorded_history(tracker: Tracker, run_id: str, metrics: dict[str, float]) -> dict[str, list[float]]:
    """The run's per-epoch values of each metric a replay must reproduce (no timings, no footprint)."""
    return {
        key: _by_epoch(tracker.metric_history(run_id, key))
        for key in metrics
        if key not in UNREPRODUCIBLE and key not in FOOTPRINT_METRICS
    }


def _warn_of_provenance(record: TrialJson, report: ReplayReport) -> None:
    """Warnings where the installed plugins or this sweeper's data seed differ from the record's."""
    spec = record.spec
    for kind_name, version in provenance(spec).items():
        if record.plugins.get(kind_name) != version:
            report.warnings.append(f"plugin {kind_name}: recorded {record.plugins.get(kind_name)}, installed {version}")
    if record.data_seed != derive(spec.seed, "data"):
        report.warnings.append(
            f"data seed: recorded {record.data_seed}, this sweeper derives "
            f"{derive(spec.seed, 'data')} (the data split may differ)"
        )


def _train_again(
    tracker: Tracker, run: Any, record: TrialJson, members: list[int], solo: bool, report: ReplayReport
) -> Outcome:
    """The trial trained again, fused with ``members`` as before (unless ``solo``, or a member's
    run is missing) or alone; pruned where the original was."""
    stops = {record.number: (run.data.tags.get(f"{TAG}state"), report.epochs)}

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        state, stopped_at = stops[number]
        return state == TrialState.PRUNED and epoch >= stopped_at  # stop where the original was stopped

    with tempfile.TemporaryDirectory() as tmp:
        config = TrialConfig(
            record.number, record.seed, record.params, record.spec, record.threads, str(Path(tmp) / "replay.pt")
        )
        outcome = None
        if len(members) > 1 and not solo:
            outcome = _replay_fused(tracker, run, config, members, stops, decide, Path(tmp), report)
        if outcome is None:
            if len(members) > 1:  # trained fused, replayed solo
                report.tolerance, report.fused_alone = max(report.tolerance, FUSED_RTOL), True
            (outcome,) = execute([config], decide)
    return outcome


def _warn_of_environment(tags: dict[str, str], outcome: Outcome, report: ReplayReport) -> None:
    """Warnings where the replay failed and the original did not, or ran on other software or hardware."""
    if outcome.state == TrialState.FAILED and tags.get(f"{TAG}state") != TrialState.FAILED:
        report.warnings.append(f"the replay failed: {outcome.reason}")
    for key in ("torch", "cuda", "device_name", "data_fingerprint"):
        old, new = tags.get(f"{TAG}{key}"), outcome.info.get(key)
        if old is not None and new is not None and str(new) != old:
            report.warnings.append(f"{key}: recorded {old}, now {new}")


def _compare_metrics(
    recorded: float | None, history: dict[str, list[float]], outcome: Outcome, report: ReplayReport
) -> None:
    """The mismatches between the record and the replay: the model's size (``recorded``: its
    params count), then every metric of ``history`` at every epoch either of them trained."""
    counted = outcome.info.get("footprint", {}).get("params")
    if recorded is not None and counted is not None and recorded != counted:  # the model's size (latency: timed)
        report.mismatches.append((0, "params", recorded, counted))
    for epoch in range(1, max(report.epochs, len(outcome.history)) + 1):
        for metric, values in history.items():
            old = values[epoch - 1] if epoch <= len(values) else math.nan
            new = outcome.history[epoch - 1].get(metric, math.nan) if epoch <= len(outcome.history) else math.nan
            if math.isfinite(old) and math.isfinite(new) and old != new:
                report.max_difference = max(report.max_difference, abs(old - new) / max(abs(old), abs(new)))
            if not _same(old, new, report.tolerance):
                report.mismatches.append((epoch, metric, old, new))


def _replay_fused(
    tracker: Tracker,
    run: Any,
    config: TrialConfig,
    members: list[int],
    stops: dict[int, tuple[str | None, int]],
    decide: Decide,
    tmp: Path,
    report: ReplayReport,
) -> Outcome | None:
    """Train ``config`` again with the members of its fused model, in their order; None (and a
    warning) where a member's run cannot be found (replay solo then)."""
    parent = run.data.tags.get("mlflow.parentRunId")
    ids = tracker.trial_run_ids(parent, members) if parent else {}
    missing = [n for n in members if n != config.number and n not in ids]
    if missing:
        report.warnings.append(
            f"trained fused with trials {members}, but the runs of {missing} were not found: replayed alone"
        )
        return None
    configs = []
    metric = config.spec.objective.metric
    for number in members:
        if number == config.number:
            configs.append(config)
            continue
        sibling, record = load_trial(tracker, ids[number])
        stops[number] = (
            sibling.data.tags.get(f"{TAG}state"),
            len(_by_epoch(tracker.metric_history(ids[number], metric))),
        )
        configs.append(
            TrialConfig(
                record.number, record.seed, record.params, record.spec, record.threads, str(tmp / f"replay-{number}.pt")
            )
        )
    outcome = next(o for o in execute(configs, decide) if o.number == config.number)
    if "fused_with" in outcome.info:
        report.fused_with = members
    else:  # the group could not train fused this time: its members trained alone
        report.tolerance = max(report.tolerance, FUSED_RTOL)
        report.warnings.append(
            f"its fused model could not be built again ({outcome.info.get('fuse_fallback')}): replayed alone"
        )
    return outcome


def _by_epoch(metrics: list) -> list[float]:
    """One value per epoch (step), the last logged: a worker killed between logging an epoch and
    checkpointing it logs that epoch again when its trial resumes."""
    values = {m.step: m.value for m in sorted(metrics, key=lambda m: (m.step, m.timestamp))}
    return [values[step] for step in sorted(values)]


def _same(a: float, b: float, rtol: float) -> bool:
    if rtol == 0.0:
        return a == b
    return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol * 1e-3)
