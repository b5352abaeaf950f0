"""What a command costs before, around and after its trials, phase by phase, and a gate that keeps it.

    python benchmarks/startup.py                      # the phase table (~2 min on a 2-core CPU)
    python benchmarks/startup.py --gate               # ... and exit 1 where a phase grew (.ci/run)
    python benchmarks/startup.py --record             # write the ratios the gate compares with

Each command runs in a fresh process and a fresh folder, ``--repeat`` times (the median is kept):
``sweeper --help``; ``sweeper validate search_spaces/digits.yaml``; a one-trial sweep of that spec
(``search.n_trials=1 search.parallel=1``) without tracking and as shipped (MLflow, TorchScript
export checked in a fresh process, the model registered); and the demo (``./dev demo``: 20 trials,
2 workers), once. sweeper writes each phase's start and end to the file $SWEEPER_PHASES names
(sweeper/phases.py); this script sets them against the moment it launched the process:

- ``imports``: from the launch to the first phase (Python, the CLI, the command's imports);
- each phase's own seconds (a phase inside another is taken out of it): ``resolve`` (the spec
  loaded and resolved), ``dry build``, ``storage`` (the Optuna study), ``tracker`` (MLflow set up,
  the sweep's run), ``trials`` (the search: trials and their orchestration), ``summary``, ``test
  score`` (the chosen trial rebuilt and scored), ``export`` (files written and checked),
  ``registry`` (the model logged and registered), ``report``, ``end`` (the sweep's run ended);
  phases on other threads (``plots``, and any overlapped with the main thread's) in brackets;
- ``exit``: from the last phase to the process's end; ``total``: the command's wall time;
  ``fixed``: a sweep's wall time less its trials' own seconds (summary.json); ``cpu``: the
  core-seconds of the command and every helper process it started (on 2 cores, half of it is a
  floor for ``total`` whatever overlaps what).

Every figure is also given as a ratio to a reference timed in the same run, a fresh
``python -c "import torch"`` (the median of 5), so a slower or busier machine moves both.
``--gate`` fails when a ratio of the command's own thread (each phase, total, fixed) grew more
than 50 % over the one recorded in benchmarks/startup_reference.json, in the measurement and in
a second one of the commands that grew (each phase's lower figure counts: noise seldom repeats);
phases under 0.25 reference count as 0.25 (their noise is not a regression), and overlapped
work (in brackets) is not gated: it shows in the phase that waits for it (``registry wait``, ``report``). Update that
file only with a reason in the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "digits.yaml"
REFERENCE_FILE = Path(__file__).with_name("startup_reference.json")
GROWTH = 1.5  # the gate: a ratio may grow to 1.5x the recorded one
FLOOR = 0.25  # ratios below this count as this in the gate (0.25 x import torch: ~0.3-0.4 s here)
ONE = ["search.n_trials=1", "search.parallel=1"]
COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "validate": ["validate", str(SPEC)],
    "sweep, no tracking": ["run", str(SPEC), *ONE, "tracking.enabled=false", "--out", "out", "-q"],
    "sweep as shipped": ["run", str(SPEC), *ONE, "--out", "out", "-q"],
    "demo": ["run", str(SPEC), "--out", "out", "-q"],
}
MAIN_ORDER = ["imports", "resolve", "dry build", "storage", "tracker", "trials", "summary", "test score"]
MAIN_ORDER += ["export", "registry wait", "report", "end", "exit", "other"]


def sweeper_command() -> list[str]:
    """The `sweeper` console script beside this Python (the installed entry point users run)."""
    script = Path(sys.executable).with_name("sweeper")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sweeper"]


def reference(times: int = 5) -> float:
    """Median seconds of a fresh `python -c "import torch"`."""
    runs = []
    for _ in range(times):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def phases_of(lines: list[dict], pid: int, launched: float, ended: float) -> dict[str, float]:
    """Seconds by phase of process ``pid``: main-thread phases less the phases inside them;
    other threads' phases as they are, in brackets; imports and exit."""
    mine = [p for p in lines if p["pid"] == pid]
    main = [p for p in mine if p["thread"] == "MainThread"]
    out: dict[str, float] = {}
    for p in main:
        inner = sum(
            q["end"] - q["start"]
            for q in main
            if q is not p and q["start"] >= p["start"] and q["end"] <= p["end"] and not _inside_another(q, p, main)
        )
        out[p["phase"]] = out.get(p["phase"], 0.0) + (p["end"] - p["start"]) - inner
    for p in lines:
        if p["pid"] != pid or p["thread"] != "MainThread":  # other threads and processes: overlapped
            key = f"[{p['phase']}]"
            out[key] = out.get(key, 0.0) + p["end"] - p["start"]
    if main:
        out["imports"] = out.get("imports", 0.0) + min(p["start"] for p in main) - launched
        out["exit"] = ended - max(p["end"] for p in main)
        out["other"] = ended - launched - sum(v for k, v in out.items() if not k.startswith("["))
    else:
        out["imports"] = ended - launched
    return out


def _inside_another(q: dict, p: dict, main: list[dict]) -> bool:
    """``q`` lies inside some phase that itself lies inside ``p`` (counted there, not in ``p``)."""
    return any(
        r is not p and r is not q and p["start"] <= r["start"] <= q["start"] and q["end"] <= r["end"] <= p["end"]
        for r in main
    )


def run_once(args: list[str]) -> dict[str, float]:
    """One command in a fresh folder: its phases, total and (a sweep) fixed seconds."""
    with tempfile.TemporaryDirectory(prefix="sweeper-startup-") as folder:
        log = Path(folder) / "phases.jsonl"
        env = {**os.environ, "SWEEPER_PHASES": str(log)}
        used = _children_cpu()
        launched = time.time()
        proc = subprocess.run([*sweeper_command(), *args], cwd=folder, env=env, capture_output=True, text=True)
        ended = time.time()
        used = _children_cpu() - used
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        pids = {p["pid"] for p in lines if p["thread"] == "MainThread" and p["phase"] == "resolve"}
        pid = min(pids, key=lambda q: min(p["start"] for p in lines if p["pid"] == q)) if pids else -1
        result = phases_of(lines, pid, launched, ended)
        result["total"] = ended - launched
        result["cpu"] = used
        summary = Path(folder) / "out" / "summary.json"
        if summary.exists():
            trials = json.loads(summary.read_text())["trials"]
            result["trial seconds"] = sum(t["seconds"] or 0.0 for t in trials)
            result["fixed"] = result["total"] - result["trial seconds"]
    return result


def _children_cpu() -> float:
    """Core-seconds (user + system) of this process's children that have ended, theirs included:
    a command's own and its helpers' (the export check, the registrar, the pool's workers: each
    waited for by the process that started it)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def measure(repeat: int, names: list[str]) -> dict[str, dict[str, float]]:
    """Each command's median phase seconds over ``repeat`` runs (the demo: once)."""
    table = {}
    for name in names:
        runs = [run_once(COMMANDS[name]) for _ in range(1 if name == "demo" else repeat)]
        keys = {k for r in runs for k in r} - ({"fixed"} if name == "demo" else set())  # 2 workers: no one trial
        table[name] = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
    return table


def print_table(table: dict[str, dict[str, float]], ref: float) -> None:
    extra = sorted({k for row in table.values() for k in row if k.startswith("[")})
    columns = [c for c in MAIN_ORDER if any(c in row for row in table.values())] + extra
    columns += ["total", "trial seconds", "fixed", "cpu"]
    print(f"reference: python -c 'import torch' {ref:.2f} s (median of 5)\n")
    print("| seconds (ratio to the reference) | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, row in table.items():
        cells = [f"{row[c]:.2f} ({row[c] / ref:.2f})" if c in row else "" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")


def ratios(table: dict[str, dict[str, float]], ref: float) -> dict[str, dict[str, float]]:
    return {name: {k: round(v / ref, 3) for k, v in sorted(row.items())} for name, row in table.items()}


def gate(now: dict[str, dict[str, float]], recorded: dict[str, dict[str, float]]) -> list[str]:
    """The phases whose ratio grew more than GROWTH-fold over the recorded one."""
    grown = []
    for name, row in recorded.items():
        for phase, was in row.items():
            if phase in ("trial seconds", "cpu") or phase.startswith("[") or name not in now:
                continue  # training or all processes' CPU, not start-up; work overlapped off the command's own thread
            is_ = now[name].get(phase, 0.0)
            if max(is_, FLOOR) > GROWTH * max(was, FLOOR):
                grown.append(f"{name}: {phase} {is_:.2f} x import torch, recorded {was:.2f} (limit {GROWTH}x)")
    return grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command but the demo (median)")
    parser.add_argument("--commands", nargs="*", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--gate", action="store_true", help="exit 1 where a ratio grew 50%% over the recorded")
    parser.add_argument("--record", action="store_true", help=f"write the ratios to {REFERENCE_FILE.name}")
    parser.add_argument("--results", type=Path, help="also write the table (seconds and ratios) to this JSON file")
    args = parser.parse_args()
    ref = reference()
    table = measure(args.repeat, args.commands)
    print_table(table, ref)
    now = ratios(table, ref)
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps({"reference_s": ref, "seconds": table, "ratios": now}, indent=1))
    if args.record:
        REFERENCE_FILE.write_text(json.dumps({"reference": "python -c 'import torch'", "ratios": now}, indent=1) + "\n")
        print(f"\nrecorded in {REFERENCE_FILE}")
    if args.gate:
        recorded = json.loads(REFERENCE_FILE.read_text())["ratios"]
        grown = gate(now, recorded)
        if grown:  # a growth must show twice: a sub-second phase of one run moves by half on a busy VM
            again = measure(args.repeat, sorted({line.split(":")[0] for line in grown}))
            print(f"\nre-measured {', '.join(again)}: each phase's lower figure of the two measurements counts")
            least = {name: {k: min(v, again[name].get(k, v)) for k, v in table[name].items()} for name in again}
            grown = gate(ratios({**table, **least}, ref), recorded)
        for line in grown:
            print(f"grew: {line}", file=sys.stderr)
        if grown:
            sys.exit(1)
        print("\ngate: no phase grew more than 50 % over benchmarks/startup_reference.json")


if __name__ == "__main__":
    main()
