"""Replay one trial from its MLflow run (its trial.json: see track/records.py) and compare every
per-epoch metric with the record."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sweeper.errors import UserError
from sweeper.pluginhost.binding import provenance
from sweeper.track.mlflow import TAG, Tracker
from sweeper.track.records import load_trial
from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import execute
from sweeper.trial.seeding import derive

# Wall-clock and memory readings differ run to run by nature; everything else must match.
UNREPRODUCIBLE = ("epoch_seconds", "samples_per_s", "gpu_mem_peak_mb")
GPU_RTOL = 1e-3  # relative tolerance on CUDA without train.deterministic (kernel choice varies)
# A fused trial (trained with others as one model) replays solo: batched kernels round differently.
# fp32 on the CPU measured at most 2.2e-7 relative (tests/test_fused.py); this bounds it.
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

    @property
    def matches(self) -> bool:
        return not self.mismatches


def replay(run_id: str, tracking_uri: str) -> ReplayReport:
    tracker = Tracker(tracking_uri)
    run, record = load_trial(tracker, run_id)
    tags = run.data.tags
    if f"{TAG}pbt_donor" in tags:
        raise UserError(f"run {run_id} continued from trial {tags[f'{TAG}pbt_donor']}'s checkpoint (a PBT "
                        f"exploit): replay trains from epoch 1 and cannot reproduce it; replay the trials "
                        f"of its lineage instead")
    spec = record.spec
    history = {key: _by_epoch(tracker.metric_history(run_id, key))
               for key in run.data.metrics if key not in UNREPRODUCIBLE}
    epochs = len(history.get(spec.objective.metric, []))
    on_gpu = tags.get(f"{TAG}device", "cpu").startswith("cuda")
    tolerance = GPU_RTOL if on_gpu and not spec.train.deterministic else 0.0
    if f"{TAG}fused_with" in tags:  # trained fused, replayed solo
        tolerance = max(tolerance, FUSED_RTOL)
    report = ReplayReport(run_id, record.number, epochs, tolerance)

    for kind_name, version in provenance(spec).items():
        if record.plugins.get(kind_name) != version:
            report.warnings.append(f"plugin {kind_name}: recorded {record.plugins.get(kind_name)}, "
                                   f"installed {version}")
    if record.data_seed != derive(spec.seed, "data"):
        report.warnings.append(f"data seed: recorded {record.data_seed}, this sweeper derives "
                               f"{derive(spec.seed, 'data')} (the data split may differ)")
    recorded_state = tags.get(f"{TAG}state")

    def decide(number: int, epoch: int, metrics: dict[str, float]) -> bool:
        return recorded_state == "pruned" and epoch >= epochs  # stop where the original was stopped

    with tempfile.TemporaryDirectory() as tmp:
        config = TrialConfig(record.number, record.seed, record.params, spec, record.threads,
                             str(Path(tmp) / "replay.pt"))
        outcome = execute(config, decide)
    report.state = outcome.state
    if outcome.state == "failed" and recorded_state != "failed":
        report.warnings.append(f"the replay failed: {outcome.reason}")
    for key in ("torch", "cuda", "device_name", "data_fingerprint"):
        old, new = tags.get(f"{TAG}{key}"), outcome.info.get(key)
        if old is not None and new is not None and str(new) != old:
            report.warnings.append(f"{key}: recorded {old}, now {new}")
    for epoch in range(1, max(epochs, len(outcome.history)) + 1):
        for metric, values in history.items():
            old = values[epoch - 1] if epoch <= len(values) else math.nan
            new = outcome.history[epoch - 1].get(metric, math.nan) if epoch <= len(outcome.history) else math.nan
            if math.isfinite(old) and math.isfinite(new) and old != new:
                report.max_difference = max(report.max_difference, abs(old - new) / max(abs(old), abs(new)))
            if not _same(old, new, report.tolerance):
                report.mismatches.append((epoch, metric, old, new))
    return report


def _by_epoch(metrics: list) -> list[float]:
    """One value per epoch (step), the last logged: a worker killed between logging an epoch and
    checkpointing it logs that epoch again when its trial resumes."""
    values = {m.step: m.value for m in sorted(metrics, key=lambda m: (m.step, m.timestamp))}
    return [values[step] for step in sorted(values)]


def _same(a: float, b: float, rtol: float) -> bool:
    if rtol == 0.0:
        return a == b
    return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol * 1e-3)
