"""`sweeper status`, `sweeper stop` and `sweeper dashboard` for an Optuna sweep, by output
folder or storage URL: trials by state, which process holds which trial, throughput, the budget
and time left; optuna-dashboard on its study."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import UserError
from sweeper.search.optuna.ledger import Ledger, find
from sweeper.search.optuna.study import OWNER, earlier, interrupted, safe_url, state
from sweeper.trial.states import TrialState

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

    ledger = Ledger(url, name, grace_s=0)
    try:
        sweep = ledger.read()
        members = ledger.members()
    finally:
        ledger.close()
    assert sweep is not None
    lease_s = sweep.spec["search"].get("lease_s", 60)
    # an earlier sweep's observations (search.warm_start) are not this sweep's trials
    trials = [t for t in optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False) if not earlier(t)]
    counts: dict[str, int] = {}
    for t in trials:
        now_in = TrialState.INTERRUPTED if interrupted(t) else state(t)
        counts[now_in.value] = counts.get(now_in.value, 0) + 1
    held: dict[str, list[str]] = {}
    for t in trials:
        if state(t) == TrialState.RUNNING:
            epochs = len(t.intermediate_values)
            held.setdefault(t.system_attrs.get(OWNER, "?"), []).append(f"#{t.number} (epoch {epochs})")
    finished = sorted(t.datetime_complete for t in trials if t.datetime_complete is not None)
    recent = finished[-RECENT:]
    per_min = None
    if len(recent) >= 2 and recent[-1] > recent[0]:
        per_min = (len(recent) - 1) / ((recent[-1] - recent[0]).total_seconds() / 60)
    now = time.time()
    cap = sweep.n_trials
    unfinished = counts.get(TrialState.RUNNING, 0) + counts.get(TrialState.WAITING, 0)
    to_go = None if cap is None else max(0, cap - sweep.proposed) + unfinished
    if sweep.device_budget_spent():  # no trial is claimed any more: only the running ones go on
        to_go = counts.get(TrialState.RUNNING, 0)
    deadline = sweep.deadline()
    eta_s = to_go / per_min * 60 if per_min and to_go is not None else None
    if deadline is not None:
        eta_s = min(eta_s, max(0.0, deadline - now)) if eta_s is not None else max(0.0, deadline - now)
    return {
        "name": name,
        "storage": safe_url(url),
        "stop_requested": sweep.stop,
        "state": "stopping"
        if sweep.stop and counts.get(TrialState.RUNNING)
        else "stopped"
        if sweep.stop
        else "done"
        if to_go == 0
        or (deadline is not None and now >= deadline and not unfinished)
        or (sweep.device_budget_spent() and not counts.get(TrialState.RUNNING))
        else "running",
        "budget": {
            "n_trials": cap,
            "claimed": sweep.proposed,
            "timeout_s": sweep.timeout_s,
            "timeout_left_s": None if deadline is None else max(0.0, deadline - now),
            # search.budget: device-hours spent by finished trials, of how many (None: no budget)
            "device_hours": None if (cap_s := sweep.device_budget_s()) is None else cap_s / 3600,
            "device_hours_spent": sweep.device_seconds / 3600,
        },
        "counts": counts,
        "trials_per_min": per_min,
        "time_left_s": eta_s,
        "last_finished": finished[-1].isoformat(timespec="seconds") if finished else None,
        "processes": [
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
        ],
    }


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
