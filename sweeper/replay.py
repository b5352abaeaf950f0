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
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.records import load_trial
from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import Decide, Outcome, execute, execute_group
from sweeper.trial.seeding import derive
from sweeper.trial.states import TrialState

# Wall-clock and memory readings differ run to run by nature; everything else must match.
UNREPRODUCIBLE = ("epoch_seconds", "samples_per_s", "gpu_mem_peak_mb")
GPU_RTOL = 1e-3  # relative tolerance on CUDA without train.deterministic (kernel choice varies)
# A fused trial (trained with others as one model) replayed solo: batched kernels round differently.
# fp32 on the CPU measured at most 2.2e-7 relative over 3 epochs (tests/test_fused.py); this bounds
# it. A trial whose training amplifies rounding (a high learning rate: as a change of thread count
# does) can drift past it: replayed with its fused group it is bitwise.
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
    tracker = Tracker(tracking_uri)
    run, record = load_trial(tracker, run_id)
    tags = run.data.tags
    if f"{TAG}pbt_donor" in tags:
        raise UserError(
            f"run {run_id} continued from trial {tags[f'{TAG}pbt_donor']}'s checkpoint (a PBT "
            f"exploit): replay trains from epoch 1 and cannot reproduce it; replay the trials "
            f"of its lineage instead"
        )
    spec = record.spec
    history = {
        key: _by_epoch(tracker.metric_history(run_id, key))
        for key in run.data.metrics
        if key not in UNREPRODUCIBLE and key not in FOOTPRINT_METRICS
    }
    epochs = len(history.get(spec.objective.metric, []))
    on_gpu = tags.get(f"{TAG}device", "cpu").startswith("cuda")
    tolerance = GPU_RTOL if on_gpu and not spec.train.deterministic else 0.0
    members = json.loads(tags.get(f"{TAG}fused_with", "[]"))
    report = ReplayReport(run_id, record.number, epochs, tolerance)

    for kind_name, version in provenance(spec).items():
        if record.plugins.get(kind_name) != version:
            report.warnings.append(f"plugin {kind_name}: recorded {record.plugins.get(kind_name)}, installed {version}")
    if record.data_seed != derive(spec.seed, "data"):
        report.warnings.append(
            f"data seed: recorded {record.data_seed}, this sweeper derives "
            f"{derive(spec.seed, 'data')} (the data split may differ)"
        )
    stops = {record.number: (tags.get(f"{TAG}state"), epochs)}

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        state, stopped_at = stops[number]
        return state == TrialState.PRUNED and epoch >= stopped_at  # stop where the original was stopped

    with tempfile.TemporaryDirectory() as tmp:
        config = TrialConfig(
            record.number, record.seed, record.params, spec, record.threads, str(Path(tmp) / "replay.pt")
        )
        outcome = None
        if len(members) > 1 and not solo:
            outcome = _replay_fused(tracker, run, config, members, stops, decide, Path(tmp), report)
        if outcome is None:
            if len(members) > 1:  # trained fused, replayed solo
                report.tolerance, report.fused_alone = max(report.tolerance, FUSED_RTOL), True
            outcome = execute(config, decide)
    report.state = outcome.state
    if outcome.state == TrialState.FAILED and tags.get(f"{TAG}state") != TrialState.FAILED:
        report.warnings.append(f"the replay failed: {outcome.reason}")
    for key in ("torch", "cuda", "device_name", "data_fingerprint"):
        old, new = tags.get(f"{TAG}{key}"), outcome.info.get(key)
        if old is not None and new is not None and str(new) != old:
            report.warnings.append(f"{key}: recorded {old}, now {new}")
    recorded, counted = run.data.metrics.get("params"), outcome.info.get("footprint", {}).get("params")
    if recorded is not None and counted is not None and recorded != counted:  # the model's size (latency: timed)
        report.mismatches.append((0, "params", recorded, counted))
    for epoch in range(1, max(epochs, len(outcome.history)) + 1):
        for metric, values in history.items():
            old = values[epoch - 1] if epoch <= len(values) else math.nan
            new = outcome.history[epoch - 1].get(metric, math.nan) if epoch <= len(outcome.history) else math.nan
            if math.isfinite(old) and math.isfinite(new) and old != new:
                report.max_difference = max(report.max_difference, abs(old - new) / max(abs(old), abs(new)))
            if not _same(old, new, report.tolerance):
                report.mismatches.append((epoch, metric, old, new))
    return report


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
    outcome = next(o for o in execute_group(configs, decide) if o.number == config.number)
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
