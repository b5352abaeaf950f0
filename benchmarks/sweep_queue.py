"""One pool, many sweeps (issue #31 item 5): queued smoke sweeps served by `sweeper worker --queue`
processes on a real PostgreSQL server, and what the queue costs and delivers:

- scheduling overhead: one policy decision (the queue's rows read, the sweep chosen) with every
  sweep active, timed in this process against the same database; and the gap on each worker
  between one trial's end and its next trial's start (everything between two trials: the
  decision, leaving and joining sweeps, recording the trial), from the study's timestamps;
- pool utilisation: the share of the workers' time spent in trials while runnable trials exist
  (from the first trial's start to the last trial's start);
- fair share: two owners with equal weights and as many sweeps each: the difference of their
  device time (the ledgers' figure) once both have finished N trials, relative to their mean;
- priority: a sweep of priority 10 submitted while every worker is busy: the time from its
  submission to its first trial's start, against the epoch time of the trials running then
  (preemption at the next epoch's end).

    python benchmarks/sweep_queue.py                      # 10 sweeps, 3 workers
    python benchmarks/sweep_queue.py --sweeps 4 --workers 2 --trials 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from machine import describe

from sweeper.search.optuna.study import INFO, OWNER

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("SWEEPER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")


def database(name: str, create: bool) -> str:
    import psycopg
    import sqlalchemy as sa

    server = sa.engine.make_url(SERVER)
    admin = server.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')
        else:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return server.set(database=name).render_as_string(hide_password=False)


def sweeper(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sweeper", *args], check=True, capture_output=True, text=True, **kw)


def spec_file(folder: Path, name: str, trials: int, epochs: int, samples: int) -> Path:
    """The smoke spec with ``samples`` training samples (its trials last seconds, not milliseconds)."""
    spec = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
    spec.update(name=name, tracking={"enabled": False}, export={"formats": []})
    spec["dataset"]["args"]["num_train"] = samples
    spec["train"].update(epochs=epochs, cpu_threads=1)
    # one batch: every trial of a sweep can be claimed from the start, so "runnable trials exist" until
    # the last trial starts (batches would make workers wait for earlier ones: not the queue's cost)
    spec["search"].update(sampler="random", pruner={"type": "none"}, n_trials=trials, batch_size=trials)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def trials_of(url: str, names: list[str]) -> list[dict]:
    import optuna
    from sqlalchemy.pool import NullPool

    storage = optuna.storages.RDBStorage(url, engine_kwargs={"poolclass": NullPool})
    rows = []
    for name in names:
        for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False):
            if t.datetime_start is None or t.datetime_complete is None:
                continue
            owner = t.system_attrs.get(OWNER, "?:?")
            info = t.user_attrs.get(INFO, {})
            rows.append(
                {
                    "sweep": name,
                    "worker": ":".join(owner.split(":")[:2]),  # host:pid (each join has its own tag)
                    "start": t.datetime_start.timestamp(),
                    "end": t.datetime_complete.timestamp(),
                    "epoch_s": [h.get("epoch_seconds", 0.0) for h in info.get("history", [])],
                    "device_s": info.get("device_seconds", 0.0),
                }
            )
    storage.engine.dispose()
    return rows


def decision_ms(url: str, repeats: int = 50) -> float:
    """The median time of one policy decision (QueueWorker._next: the rows read, the choice)."""
    from sweeper.queue.table import Offer
    from sweeper.queue.worker import QueueWorker

    worker = QueueWorker(url, Path(tempfile.mkdtemp()), Offer("cpu", 16.0), lambda _: None, drain=True)
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            worker._next()
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)
    finally:
        worker.queue.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", type=int, default=10, help="queued sweeps, half each owner's")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--trials", type=int, default=8, help="trials per sweep")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=65536, help="training samples of each smoke trial")
    parser.add_argument("--share-after", type=int, default=20, help="fair share: once both owners ran this many")
    parser.add_argument("--rows", type=Path, help="also write every trial's row (sweep, worker, times) here, JSON")
    args = parser.parse_args()
    print("$ python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]))
    print(describe())
    name = f"sweeper_bench_queue_{uuid.uuid4().hex[:8]}"
    url = database(name, create=True)
    work = Path(tempfile.mkdtemp(prefix="bench_queue_"))
    env = {**os.environ, "COLUMNS": "200"}
    try:
        sweeps = [f"s{i:02d}" for i in range(args.sweeps)]
        owners = {s: ("alice" if i % 2 == 0 else "bob") for i, s in enumerate(sweeps)}
        for s in sweeps:
            sweeper(
                "submit",
                str(spec_file(work, s, args.trials, args.epochs, args.samples)),
                "--queue",
                url,
                "--owner",
                owners[s],
            )
        print(
            f"{args.sweeps} smoke sweeps queued ({args.trials} trials of {args.epochs} epochs on {args.samples} "
            f"samples each; owners alice and bob), {args.workers} workers"
        )
        print(f"one policy decision with {args.sweeps} sweeps queued: {decision_ms(url):.1f} ms (median of 50)")
        logs = [open(work / f"w{i}.log", "w") for i in range(args.workers)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "sweeper", "worker", "--queue", url, "--drain", "--out", str(work / "runs")],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=work,
            )
            for log in logs
        ]
        # the urgent sweep: once every worker trains (a third of the trials done), submitted
        while _completed(url) < args.sweeps * args.trials // 3:
            time.sleep(0.5)
        active_ms = decision_ms(url, 20)
        urgent = spec_file(work, "urgent", 2, args.epochs, args.samples)
        sweeper("submit", str(urgent), "--queue", url, "--owner", "carol", "--priority", "10")
        submitted = _submitted_at(url, "urgent")  # the row's time: not the submit command's checks
        for proc in procs:
            if proc.wait() != 0:
                sys.exit(f"a worker failed: see {work}")
        rows = trials_of(url, [*sweeps, "urgent"])
        if args.rows is not None:
            args.rows.write_text(json.dumps([{**r, "owner": owners.get(r["sweep"], "carol")} for r in rows]))
        report(rows, owners, args, submitted, active_ms)
        listing = json.loads(sweeper("queue", url, "--json").stdout)
        states = {r["state"] for r in listing}
        print(f"states at the end: {', '.join(sorted(states))}")
    finally:
        database(name, create=False)


def _submitted_at(url: str, name: str) -> float:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as db:
            query = sa.text("select submitted_at from sweeper_queue where name = :n")
            return float(db.execute(query, {"n": name}).scalar())
    finally:
        engine.dispose()


def _completed(url: str) -> int:
    """Trials completed so far, every study's (Optuna's own table)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as db:
            if not sa.inspect(db).has_table("trials"):
                return 0
            return int(db.execute(sa.text("select count(*) from trials where state = 'COMPLETE'")).scalar() or 0)
    finally:
        engine.dispose()


def report(
    rows: list[dict], owners: dict[str, str], args: argparse.Namespace, submitted: float, active_ms: float
) -> None:
    pool = [r for r in rows if r["sweep"] != "urgent"]
    first, last = min(r["start"] for r in rows), max(r["start"] for r in rows)
    window = last - first
    by_worker: dict[str, list[dict]] = {}
    for r in rows:
        by_worker.setdefault(r["worker"], []).append(r)
    busy = sum(max(0.0, min(r["end"], last) - max(r["start"], first)) for r in rows)
    gaps = []
    for mine in by_worker.values():
        mine.sort(key=lambda r: r["start"])
        gaps += [(b["start"] - a["end"]) * 1000 for a, b in zip(mine, mine[1:]) if b["start"] <= last]
    trial_s = statistics.median(r["end"] - r["start"] for r in rows)
    print(f"\n{len(rows)} trials on {len(by_worker)} workers; median trial {trial_s:.2f} s")
    print(f"one policy decision, every sweep active: {active_ms:.1f} ms (median of 20; goal <= 20 ms)")
    print(
        f"gap between a worker's trials: median {statistics.median(gaps):.0f} ms, mean {statistics.mean(gaps):.0f} ms, "
        f"max {max(gaps):.0f} ms ({len(gaps)} gaps)"
    )
    print(f"pool utilisation while runnable trials exist: {busy / (window * len(by_worker)):.1%} (goal >= 95 %)")
    spent = {"alice": 0.0, "bob": 0.0}
    done = {"alice": 0, "bob": 0}
    error = None
    for r in sorted(pool, key=lambda r: r["end"]):
        owner = owners[r["sweep"]]
        spent[owner] += r["device_s"]
        done[owner] += 1
        if error is None and min(done.values()) >= args.share_after:
            error = abs(spent["alice"] - spent["bob"]) / max((spent["alice"] + spent["bob"]) / 2, 1e-9)
            print(
                f"fair share once both owners ran {args.share_after} trials: alice {spent['alice']:.1f} s, "
                f"bob {spent['bob']:.1f} s of device time: {error:.1%} apart (goal within 10 %)"
            )
    if error is None:
        print(f"fair share: the owners did not both reach {args.share_after} trials (more --sweeps or --trials)")
    urgent = [r for r in rows if r["sweep"] == "urgent"]
    if urgent:
        wait = min(r["start"] for r in urgent) - submitted
        running = [r for r in pool if r["start"] <= submitted <= r["end"]]
        epochs = [e for r in running for e in r["epoch_s"]] or [e for r in pool for e in r["epoch_s"]]
        print(
            f"priority 10 submitted with every worker busy: first trial after {wait:.2f} s; an epoch of the "
            f"trials running then: median {statistics.median(epochs):.2f} s (goal: within one epoch)"
        )


if __name__ == "__main__":
    main()
