"""An Optuna sweep's shared state: the study and its ledger, opened once per process.

Every process serving the sweep (``sweeper run`` or ``sweeper worker``, on any machine) joins
through ``prepare``: the first creates the ledger row and prepares the sweep; the others check
that their spec defines the same trials, wait until it is prepared, and read what it found.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.phases import launched_at
from sweeper.plan import budget_clock
from sweeper.search.optuna import rdb
from sweeper.search.optuna import study as studies
from sweeper.search.optuna.lease import Heartbeat
from sweeper.search.optuna.ledger import Ledger, Sweep, find
from sweeper.search.state import Prepare, Prepared, Role
from sweeper.spec import SweepSpec

WAIT_S = 0.5  # how often a joining process looks whether the sweep is prepared
# Spec fields each process may set for itself: they change where or how fast it trains, or the
# budget (which `sweeper run` sets for everyone), not which trials the sweep runs.
PER_PROCESS = {
    ("search", "parallel"),
    ("search", "n_trials"),
    ("search", "timeout"),
    ("search", "budget"),
    ("search", "storage"),
    ("search", "heartbeat_s"),
    ("search", "lease_s"),
    ("search", "artifact_root"),
    ("train", "device"),
    ("train", "cpu_threads"),
    ("export",),
    ("tracking",),
}


def trial_defining(spec: dict[str, Any]) -> dict[str, Any]:
    """The parts of a spec (as JSON) that decide the sweep's trials."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
    for path in PER_PROCESS:
        node = out
        for part in path[:-1]:
            node = node.get(part, {})
        node.pop(path[-1], None)
    return out


def differences(stored: dict[str, Any], mine: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths where two specs' trial-defining parts differ."""
    out = []
    for key in sorted(set(stored) | set(mine)):
        a, b = stored.get(key), mine.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} (the sweep's: {a!r}, yours: {b!r})")
    return out


def stored_spec(url: str, name: str | None) -> dict[str, Any]:
    """The spec of sweep ``name`` (or of the only sweep) in the database at ``url``, with
    search.storage set to ``url`` (how this machine reaches it)."""
    name = find(url, name, studies.safe_url)
    ledger = Ledger(url, name, grace_s=1)
    try:
        sweep = ledger.read()
    finally:
        ledger.close()
    assert sweep is not None
    spec = dict(sweep.spec)
    spec["search"] = {**spec["search"], "storage": url}
    return spec


def _spaceless(spec: dict[str, Any]) -> dict[str, Any]:
    """The trial-defining parts of a spec but its search space."""
    out = trial_defining(spec)
    out["search"] = {k: v for k, v in out.get("search", {}).items() if k != "space"}
    return out


def _incompatible(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why a parameter declared ``old`` cannot become ``new`` in the same study (Optuna's storage
    refuses another kind, log scale or set of choices under one name), or None."""
    if old["type"] != new["type"]:
        return f"its type changed from {old['type']} to {new['type']}"
    if old.get("log", False) != new.get("log", False):
        return "its log scale changed"
    if old["type"] == "categorical" and old["choices"] != new["choices"]:
        return f"its choices changed from {old['choices']} to {new['choices']}"
    return None


class LedgerStore:
    def __init__(self, spec: SweepSpec, out_dir: Path) -> None:
        self.url = studies.storage_url(spec, out_dir)
        self.study = studies.open_study(spec, out_dir)
        self.ledger = Ledger(self.url, spec.name, grace_s=spec.search.lease_s)
        # renews this process's member row (and, once it trains, its trials' leases) from joining on:
        # preparing (the LR warm start) can outlast a lease
        self.heartbeat = Heartbeat(self.study, self.ledger, spec.search.heartbeat_s)
        self.joined = False

    def prepare(self, spec: SweepSpec, role: Role, tracking_uri: str | None, make: Prepare) -> Prepared:
        mine = spec.model_dump(mode="json")
        if not self.joined:  # a queue's worker visiting again keeps its store, joined (runner.Visit)
            self.ledger.join(role)
            self.joined = True
            self.heartbeat.start()
        if self.ledger.create(mine, spec.search.n_trials, _timeout(spec, role, 0.0), self._existing()):
            return self._make(spec, make)
        while True:
            sweep = self._read()
            changed = differences(trial_defining(sweep.spec), trial_defining(mine))
            if changed and role == Role.RUN and not differences(_spaceless(sweep.spec), _spaceless(mine)):
                self._new_space(sweep, mine)  # `sweeper run` resumes the sweep in a changed space
                changed = []
            if changed:
                raise UserError(
                    f"search.storage {studies.safe_url(self.url)} holds sweep '{spec.name}' with other "
                    f"trials than this spec defines: {'; '.join(changed[:5])}. Use the sweep's spec "
                    f"(`sweeper worker --study URL` reads it from the database), or another name"
                )
            if sweep.state == "ready":
                prepared = Prepared.model_validate(sweep.prepared)
                if role == Role.RUN:  # `sweeper run` sets the budget and restarts the timeout for everyone
                    self.ledger.restart(mine, spec.search.n_trials, _timeout(spec, role, sweep.device_seconds))
                if prepared.tracking_uri != tracking_uri and role == Role.RUN and self.ledger.take_preparation(None):
                    return self._make(spec, make, prepared.warm_start)
                return prepared
            if not self.ledger.alive(sweep.preparer) and self.ledger.take_preparation(sweep.preparer):
                return self._make(spec, make)
            time.sleep(WAIT_S)  # another process prepares it (its LR warm start): wait

    def _make(self, spec: SweepSpec, make: Prepare, learned: dict[str, Any] | None = None) -> Prepared:
        """Prepare the sweep (``make``: its MLflow run, the LR warm start), then learn from the
        earlier sweeps of search.warm_start; ``learned``: what an earlier preparation learned
        (the study holds those observations already)."""
        prepared = make()
        if learned is not None:  # the same first trials: the slots' params do not depend on who prepared
            measured = learned.get("measured_already", [])
            round_, own = _round_first(spec, prepared.enqueue)
            enqueue = [*round_, *learned.get("re_evaluated", []), *(p for p in own if p not in measured)]
            prepared = prepared.model_copy(update={"warm_start": learned, "enqueue": enqueue})
        elif spec.search.warm_start:
            prepared = self._learn(prepared.apply(spec), prepared)
        self.ledger.publish(prepared.model_dump(mode="json", exclude={"fresh"}))
        return prepared

    def _learn(self, spec: SweepSpec, prepared: Prepared) -> Prepared:
        """The earlier sweeps' finished trials, fitted to ``spec``'s space (the LR finder's
        narrowed range included), added as observations; a few of the best enqueued first, then
        the sweep's own first trials (its base point, LR suggestions) that no earlier one measured."""
        from sweeper.search.optuna import earlier

        found, learned = earlier.lessons(spec)
        earlier.seed(spec, self.study, found)
        first = earlier.best(spec, found)
        round_, rest = _round_first(spec, prepared.enqueue)
        own = earlier.unmeasured(found, rest)
        measured = [point for point in rest if point not in own]
        learned.update(observations=len(found), re_evaluated=first)
        if measured:
            learned.update(measured_already=measured)
        return prepared.model_copy(update={"enqueue": [*round_, *first, *own], "warm_start": learned})

    def _new_space(self, sweep: Sweep, mine: dict[str, Any]) -> None:
        """Record ``mine``'s search.space as the sweep's next space version (once), after checking
        that the study can hold its parameters beside the earlier ones."""
        old, new = sweep.spec["search"]["space"], mine["search"]["space"]
        versions = self.ledger.spaces()
        if versions and versions[-1]["space"] == new:
            return  # recorded by an earlier attempt at this resume
        for path in sorted(set(old) & set(new)):
            problem = _incompatible(old[path], new[path])
            if problem:
                raise UserError(
                    f"search.space.{path}: {problem} since the sweep began; a resumed sweep keeps its "
                    f"trials in one Optuna study, where a parameter keeps its type, log scale and "
                    f"choices. Keep them, rename the parameter, or start a new sweep (another name or "
                    f"--out) with search.warm_start: [<this sweep's folder>]"
                )
        if not versions:
            self.ledger.add_space(old, 0)
        self.ledger.add_space(new, sweep.proposed)
        # what optuna-dashboard shows of the space (study.describe): the current one
        self.study.set_user_attr(
            "search_space", {path: {k: v for k, v in p.items() if v is not None} for path, p in new.items()}
        )

    def space_versions(self) -> list[dict[str, Any]]:
        """The sweep's space versions ([] while it kept the space it started with)."""
        return self.ledger.spaces()

    def _read(self) -> Sweep:
        sweep = self.ledger.read()
        assert sweep is not None, "the ledger row exists once created"
        return sweep

    def _existing(self) -> int:
        """Trials of a study made before it had a ledger (an older sweeper): their slots are taken."""
        return rdb.count_without(self.study, studies.INTERRUPTED)

    def close(self) -> None:
        if self.joined:
            self.heartbeat.stop()
            try:
                self.ledger.leave()
            except Exception:  # the database is gone: the member's heartbeat simply stops
                pass
        self.ledger.close()


def _round_first(spec: SweepSpec, enqueue: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The family round's trials (the first of ``enqueue``, search.family_round) and the rest:
    the round keeps slots 0 to families - 1 whatever earlier sweeps add, and is run even where
    an earlier sweep measured a family's base point (the round compares this sweep's trials)."""
    n = len(spec.search.family_round.families) if spec.search.family_round is not None else 0
    return enqueue[:n], enqueue[n:]


def _timeout(spec: SweepSpec, role: Role, spent_s: float) -> float | None:
    """The seconds from now after which no trial is claimed: search.timeout, and for `sweeper
    run` search.budget's clock (plan/budget_clock.py: counted from the command's launch, less
    ``spent_s`` device-seconds spent before, its reserve for the finish scaled by how busy the
    machine was while this process started), whichever ends first. Workers that start a sweep
    without `sweeper run` share its budget in device-seconds only: no launch to count from."""
    budget = budget_clock.clock(spec, spent_s, budget_clock.contention()) if role == Role.RUN else None
    if budget is None:
        return spec.search.timeout
    left = max(1e-3, budget.trials_s() - (time.time() - launched_at()))  # the ledger takes > 0
    return left if spec.search.timeout is None else min(spec.search.timeout, left)
