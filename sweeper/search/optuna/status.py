"""`sweeper status`, `sweeper stop` and `sweeper dashboard` for an Optuna sweep, by output
folder or storage URL: trials by state, which process holds which trial, throughput, the budget
and time left; optuna-dashboard on its study."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sweeper.errors import UserError
from sweeper.search.optuna.ledger import Ledger, Sweep, find
from sweeper.search.optuna.study import OWNER, earlier, interrupted, safe_url, state
from sweeper.states import TrialState

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

RECENT = 10  # throughput: over the last this many finished trials


def locate(folder: Path | None, study: str | None, name: str | None) -> tuple[str, str]:
    """(storage URL, sweep name) from an output folder (its spec.yaml and optuna.db) or a URL."""
    if (folder is None) == (study is None):
        raise UserError("give the sweep's output folder, or --study URL")
    if folder is not None:
        spec_file = folder / "spec.yaml"
        if not spec_file.exists():
            raise UserError(f"{folder}: no spec.yaml; not the output folder of a `sweeper run`")
        spec = yaml.safe_load(spec_file.read_text())
        study = spec["search"].get("storage") or f"sqlite:///{(folder / 'optuna.db').resolve()}"
        name = name or spec["name"]
    assert study is not None
    return study, find(study, name, safe_url)


def report(url: str, name: str) -> dict[str, Any]:
    """The sweep's state as plain data (``sweeper status --json`` prints it as is)."""
    import optuna

    sweep, members = _read_ledger(url, name)
    lease_s = sweep.spec["search"].get("lease_s", 60)
    # an earlier sweep's observations (search.warm_start) are not this sweep's trials
    trials = [t for t in optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False) if not earlier(t)]
    counts = _counts(trials)
    finished = sorted(t.datetime_complete for t in trials if t.datetime_complete is not None)
    per_min = _trials_per_min(finished)
    now = time.time()
    to_go = _trials_to_go(sweep, counts)
    deadline = sweep.deadline()
    return {
        "name": name,
        "storage": safe_url(url),
        "stop_requested": sweep.stop,
        "state": _sweep_state(sweep, counts, to_go, deadline, now),
        "budget": _budget(sweep, deadline, now),
        "counts": counts,
        "trials_per_min": per_min,
        "time_left_s": _time_left_s(to_go, per_min, deadline, now),
        "last_finished": finished[-1].isoformat(timespec="seconds") if finished else None,
        "processes": _processes(members, _held(trials), now, lease_s),
    }


def _read_ledger(url: str, name: str) -> tuple[Sweep, list[dict[str, Any]]]:
    """The sweep's ledger row and its member processes, read without joining the sweep."""
    ledger = Ledger(url, name, grace_s=0)
    try:
        sweep = ledger.read()
        members = ledger.members()
    finally:
        ledger.close()
    assert sweep is not None
    return sweep, members


def _counts(trials: list[FrozenTrial]) -> dict[str, int]:
    """How many trials are in each state (by its value); one lost with its process (and retried): interrupted."""
    counts: dict[str, int] = {}
    for t in trials:
        now_in = TrialState.INTERRUPTED if interrupted(t) else state(t)
        counts[now_in.value] = counts.get(now_in.value, 0) + 1
    return counts


def _held(trials: list[FrozenTrial]) -> dict[str, list[str]]:
    """By process (its member id; "?": unknown), the running trials it holds and the epochs each reported."""
    held: dict[str, list[str]] = {}
    for t in trials:
        if state(t) == TrialState.RUNNING:
            epochs = len(t.intermediate_values)
            held.setdefault(t.system_attrs.get(OWNER, "?"), []).append(f"#{t.number} (epoch {epochs})")
    return held


def _trials_per_min(finished: list[datetime]) -> float | None:
    """Trials finished per minute over the last RECENT of ``finished`` (completion times, sorted);
    None without two of them apart in time."""
    recent = finished[-RECENT:]
    if len(recent) >= 2 and recent[-1] > recent[0]:
        return (len(recent) - 1) / ((recent[-1] - recent[0]).total_seconds() / 60)
    return None


def _unfinished(counts: dict[str, int]) -> int:
    """The trials claimed and not finished: running, or waiting to run."""
    return counts.get(TrialState.RUNNING, 0) + counts.get(TrialState.WAITING, 0)


def _trials_to_go(sweep: Sweep, counts: dict[str, int]) -> int | None:
    """The trials still to train: the budget's unclaimed ones and the unfinished (None: no n_trials)."""
    cap = sweep.n_trials
    to_go = None if cap is None else max(0, cap - sweep.proposed) + _unfinished(counts)
    if sweep.device_budget_spent():  # no trial is claimed any more: only the running ones go on
        to_go = counts.get(TrialState.RUNNING, 0)
    return to_go


def _time_left_s(to_go: int | None, per_min: float | None, deadline: float | None, now: float) -> float | None:
    """Seconds left: the trials to go at the current throughput, at most until the deadline."""
    eta_s = to_go / per_min * 60 if per_min and to_go is not None else None
    if deadline is not None:
        eta_s = min(eta_s, max(0.0, deadline - now)) if eta_s is not None else max(0.0, deadline - now)
    return eta_s


def _sweep_state(sweep: Sweep, counts: dict[str, int], to_go: int | None, deadline: float | None, now: float) -> str:
    """stopping, stopped, done (its budget or timeout used up, nothing left running) or running."""
    if sweep.stop:
        return "stopping" if counts.get(TrialState.RUNNING) else "stopped"
    if (
        to_go == 0
        or (deadline is not None and now >= deadline and not _unfinished(counts))
        or (sweep.device_budget_spent() and not counts.get(TrialState.RUNNING))
    ):
        return "done"
    return "running"


def _budget(sweep: Sweep, deadline: float | None, now: float) -> dict[str, Any]:
    """The budget and what is spent of it: trials claimed, time left, device-hours spent."""
    return {
        "n_trials": sweep.n_trials,
        "claimed": sweep.proposed,
        "timeout_s": sweep.timeout_s,
        "timeout_left_s": None if deadline is None else max(0.0, deadline - now),
        # search.budget: device-hours spent by finished trials, of how many (None: no budget)
        "device_hours": None if (cap_s := sweep.device_budget_s()) is None else cap_s / 3600,
        "device_hours_spent": sweep.device_seconds / 3600,
    }


def _processes(
    members: list[dict[str, Any]], held: dict[str, list[str]], now: float, lease_s: float
) -> list[dict[str, Any]]:
    """Each process that joined the sweep: where it runs, its last heartbeat, whether it is alive
    (left not, and seen within its lease), and the trials it holds."""
    return [
        {
            "member": m["member"],
            "role": m["role"],
            "host": m["host"],
            "pid": m["pid"],
            "seen_s_ago": round(now - m["seen_at"], 1),
            "alive": m["left_at"] is None and now - m["seen_at"] < lease_s,
            "holds": held.get(m["member"], []),
        }
        for m in members
    ]


def chosen(folder: Path) -> dict[str, Any] | None:
    """The chosen trial of a finished sweep's folder (its summary.json): number, validation
    values and test score; None while the sweep has no summary or no best trial."""
    try:
        best = json.loads((folder / "summary.json").read_text(encoding="utf-8")).get("best")
    except (OSError, ValueError):
        return None
    if not best:
        return None
    kept = ("number", "values", "test_metrics", "test_samples", "test_error")
    return {k: best[k] for k in kept if k in best}


def stop(url: str, name: str) -> None:
    ledger = Ledger(url, name, grace_s=0)
    try:
        ledger.request_stop()
    finally:
        ledger.close()


def since(iso: str | None) -> str:
    if iso is None:
        return "-"
    return f"{(datetime.now() - datetime.fromisoformat(iso)).total_seconds():.0f} s ago"


def dashboard(url: str, name: str, host: str, port: int, say: Callable[[str], None]) -> None:
    """optuna-dashboard serving the sweep's study until interrupted (it names the objective and
    shows the search space: study.describe)."""
    import optuna

    try:
        import optuna_dashboard
    except ModuleNotFoundError:
        raise UserError(
            "sweeper dashboard needs optuna-dashboard: pip install 'optuna-dashboard>=0.17,<0.22' (or sweeper[deploy])"
        ) from None
    from sweeper.search.optuna import rdb

    study_id = rdb.study_id(optuna.load_study(study_name=name, storage=url))
    say(
        f"optuna-dashboard: sweep '{name}' ({safe_url(url)}) at http://{host}:{port}/dashboard/studies/{study_id} "
        "(Ctrl-C stops it)"
    )
    optuna_dashboard.run_server(url, host=host, port=port)


def show(info: dict[str, Any], out: Any) -> None:
    """``sweeper status``'s lines and table of ``report``'s ``info``, on a rich Console ``out``."""
    from rich.table import Table

    budget = info["budget"]
    counts = ", ".join(f"{n} {state}" for state, n in sorted(info["counts"].items())) or "no trials yet"
    rate = f"{info['trials_per_min']:.2f} trials/min" if info["trials_per_min"] else "-"
    left = f"{info['time_left_s'] / 60:.1f} min" if info["time_left_s"] is not None else "-"
    out.print(f"[bold]sweep '{info['name']}'[/] in {info['storage']}: {info['state']}")
    out.print(
        f"  budget     {budget['claimed']} of {budget['n_trials'] or 'unlimited'} trials claimed"
        + (f"; timeout {budget['timeout_left_s']:.0f} s left" if budget["timeout_s"] else "")
    )
    if budget.get("device_hours") is not None:
        out.print(f"  devices    {budget['device_hours_spent']:.4g} of {budget['device_hours']:.4g} device-hours spent")
    out.print(f"  trials     {counts}")
    out.print(f"  throughput {rate} (last finished {since(info['last_finished'])}); time left about {left}")
    table = Table("process", "role", "alive", "last heartbeat", "holds", box=None, padding=(0, 2))
    alive = [p for p in info["processes"] if p["alive"]]
    for p in alive:
        table.add_row(
            p["member"],
            p["role"],
            "yes" if p["alive"] else "no",
            f"{p['seen_s_ago']:.0f} s ago",
            ", ".join(p["holds"]) or "-",
        )
    if alive:
        out.print(table)
    gone = len(info["processes"]) - len(alive)
    out.print(f"  {len(alive)} process(es) serving it" + (f"; {gone} earlier one(s) gone" if gone else ""))
    if (best := info.get("chosen")) is not None:
        values = ", ".join(f"{m} {v:.4g}" for m, v in (best.get("values") or {}).items())
        test = ", ".join(f"{m} {v:.4g}" for m, v in (best.get("test_metrics") or {}).items())
        held = (
            f"; {test} on {best['test_samples']} held-out test samples"
            if test
            else f"; {best['test_error']}"
            if best.get("test_error")
            else "; no test split"
        )
        out.print(f"  chosen     trial {best['number']}: {values}{held}")
