"""What preparing a sweep produces (its MLflow parent run, the LR warm start's findings), and
where it is kept so that a re-run, or another process joining the sweep, uses the same:

- ``FileStore``: <out>/sweep.json, for a sweep served by one process (backend ray);
- the Optuna ledger (search/optuna/store.py), in the study's database, for sweeps that any
  number of processes on any machines serve.

Exactly one process prepares a sweep; the others wait for it and read what it found.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from sweeper import files
from sweeper.errors import UserError
from sweeper.spec import SweepSpec

STATE_FILE = "sweep.json"  # in --out (FileStore)


class Role(StrEnum):
    """What a process serving a sweep does (search/runner.py run_sweep)."""

    RUN = "run"  # `sweeper run`: sizes and prepares the sweep, serves it until every trial has ended, summarises
    WORKER = "worker"  # `sweeper worker` (or a queue's): trains trials until none waits; no summary
    FINISH = "finish"  # a queue's finisher: `run`'s end for a sweep whose trials have all ended


class Prepared(BaseModel):
    """A prepared sweep: where it is tracked and what the LR warm start decided."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = 2
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    lr_range: tuple[float, float] | None = None  # the narrowed search range of optimizer.args.lr
    enqueue: list[dict[str, Any]] = []  # params of the trials to run first
    lr_finder: dict[str, Any] | None = None  # summary.json's lr_finder entry
    warm_start: dict[str, Any] | None = None  # summary.json's warm_start entry: what earlier sweeps gave
    fresh: bool = False  # prepared by this process just now (not stored)

    def apply(self, spec: SweepSpec) -> SweepSpec:
        """The spec with the warm start's narrowed LR range."""
        if self.lr_range is None:
            return spec
        from sweeper.search.lr_range_tests import narrow  # imports torch: only when there is a range

        return narrow(spec, *self.lr_range)

    def stored(self) -> str:
        return self.model_dump_json(exclude={"fresh"})


# prepare(): start the sweep's parent run and run the warm start; returns what they produced
Prepare = Callable[[], Prepared]


class SweepStore(Protocol):
    def prepare(self, spec: SweepSpec, role: Role, tracking_uri: str | None, make: Prepare) -> Prepared:
        """The sweep's Prepared: stored, or made by ``make`` (then stored) when this process is the
        one to prepare it. A stored one tracked elsewhere (another tracking URI) is made anew."""

    def close(self) -> None: ...


class FileStore:
    """<out>/sweep.json: one process serves the sweep; a re-run resumes what it stored."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / STATE_FILE

    def read(self) -> Prepared | None:
        if not self.path.exists():
            return None
        try:
            return Prepared.model_validate_json(self.path.read_bytes())  # bytes: not UTF-8 is a ValidationError
        except ValidationError:
            raise UserError(
                f"{self.path}: not the sweep state sweeper writes; remove it to start the sweep's MLflow record afresh"
            ) from None

    def prepare(self, spec: SweepSpec, role: Role, tracking_uri: str | None, make: Prepare) -> Prepared:
        previous = self.read()
        if previous is not None and previous.tracking_uri == tracking_uri:
            return previous
        prepared = make()
        files.write_atomic(self.path, prepared.stored())
        return prepared

    def close(self) -> None:
        pass
