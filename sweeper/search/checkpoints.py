"""Which trial checkpoints a sweep keeps in <out>/checkpoints, the same rule for both backends:
the best completed trial's always (export rebuilds the model from it), every completed trial's
with export.keep_checkpoints: all (so `sweeper export RUN_ID` reaches each of them)."""

from __future__ import annotations

from pathlib import Path

from sweeper.spec import SweepSpec
from sweeper.track.records import TrialRecord
from sweeper.trial.checkpoint import trial_path


def best(spec: SweepSpec, records: list[TrialRecord]) -> TrialRecord | None:
    """The completed trial with the best objective value (the lowest number on ties), or None."""
    complete = sorted((r for r in records if r.state == "complete"), key=lambda r: r.number)
    return spec.objective.best(complete, lambda r: r.value)


def kept(spec: SweepSpec, records: list[TrialRecord]) -> list[int]:
    """Trial numbers whose checkpoint the sweep keeps."""
    if spec.export.keep_checkpoints == "all":
        return sorted(r.number for r in records if r.state == "complete")
    top = best(spec, records)
    return [] if top is None else [top.number]


def keep_better(spec: SweepSpec, best: TrialRecord | None, new: TrialRecord, out_dir: Path) -> TrialRecord | None:
    """The rule applied as a sweep goes, one completed trial at a time: returns the best of
    ``best`` and ``new`` and deletes the other one's checkpoint (unless every one is kept)."""
    pair = sorted((r for r in (best, new) if r is not None), key=lambda r: r.number)  # ties: the lower number
    winner = spec.objective.best(pair, lambda r: r.value)
    loser = new if winner is best else best
    if loser is not None and spec.export.keep_checkpoints != "all":
        trial_path(out_dir, loser.number).unlink(missing_ok=True)
    return winner


def prune(spec: SweepSpec, records: list[TrialRecord], out_dir: Path) -> None:
    """Delete the checkpoints of finished trials that are not kept."""
    keep = set(kept(spec, records))
    for r in records:
        if r.state in ("complete", "pruned", "failed") and r.number not in keep:
            trial_path(out_dir, r.number).unlink(missing_ok=True)
