"""One study, many processes: throughput of 1 vs 2 `sweeper worker` processes on one PostgreSQL
study, and what orchestration costs per trial on PostgreSQL vs sqlite.

    python benchmarks/distributed.py [--pg URL] [--trials 12] [--epochs 10] [--runs LABEL ...]

Workload: search_spaces/digits.yaml (real data, its 10 epochs: ~3 s a trial here), no pruning (every trial trains the
same number of epochs, so throughput compares like with like), 1 torch thread per trial, one
trial at a time per process. Optuna and MLflow both on the named store: a fresh PostgreSQL
database each (created and dropped here), or sqlite files in the run's folder.

1. pg x1: one worker process on PostgreSQL.   2. pg x2: two worker processes on one study.
3. sqlite x1: one worker process on sqlite.   Also pg x2 with batches of 8 instead of 4, with
   search.staleness 1 (a batch proposed while the one before it runs), and with reproducible:
   false (no batches: a trial starts whenever a process is free). ``--runs`` picks some.

Throughput: finished trials per minute between the first trial's start and the last one's end
(the study's own timestamps: process start-up is not a trial's cost). Orchestration per trial:
that span, minus the time inside the trials (each trial's own clock: data, model, training,
checkpoint), over the number of trials: claiming, proposing, pruning answers, storage, MLflow runs
and metrics, checkpoint publishing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "search_spaces" / "digits.yaml"


def database(server: str, create: bool, name: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server)
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' if create else f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return url.set(database=name).render_as_string(hide_password=False)


def sweep(folder: Path, workers: int, trials: int, epochs: int, storage: str | None, mlflow: str, *extra: str) -> dict:
    """Run ``workers`` worker processes on one study; returns throughput and orchestration."""
    import optuna

    overrides = [
        f"search.n_trials={trials}",
        "search.pruner.type=none",
        f"train.epochs={epochs}",
        "train.cpu_threads=1",
        "search.parallel=1",
        "search.batch_size=4",
        "export.formats=[]",
        f"tracking.mlflow_uri={mlflow}",
        *([f"search.storage={storage}"] if storage else []),
        *extra,
    ]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sweeper", "worker", str(SPEC), *overrides, "--out", "out", "-q"],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(workers)
    ]
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"worker failed:\n{out}")
    wall = time.perf_counter() - start
    url = storage or f"sqlite:///{folder / 'out' / 'optuna.db'}"
    done = optuna.load_study(study_name="digits", storage=url).get_trials(deepcopy=False)
    assert len(done) == trials, f"{len(done)} trials, expected {trials}"
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    inside = sum(t.user_attrs["sweeper"]["seconds"] for t in done)
    return {
        "wall": wall,
        "span": span,
        "per_min": trials / span * 60,
        "orchestration_ms": (span * workers - inside) / trials * 1000,
        "utilisation": inside / (span * workers),  # the workers' seconds in trials over the span's
        "inside": inside,
    }


# label: (worker processes, on PostgreSQL (else sqlite), overrides)
RUNS = {
    "pg x1": (1, True, ()),
    "pg x2": (2, True, ()),
    "sqlite x1": (1, False, ()),
    "pg x2 (batch_size 8)": (2, True, ("search.batch_size=8",)),
    "pg x2 (staleness 1)": (2, True, ("search.staleness=1",)),
    "pg x2 (reproducible: false)": (2, True, ("search.reproducible=false",)),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="those runs only")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    rows = {}
    for label in args.runs:
        workers, on_pg, extra = RUNS[label]
        names = [f"bench_{tag}_{len(rows)}_{kind}" for kind in ("optuna", "mlflow")]
        with tempfile.TemporaryDirectory() as tmp:
            if on_pg:
                storage, mlflow = (database(args.pg, True, n) for n in names)
            else:
                storage, mlflow = None, f"sqlite:///{Path(tmp) / 'mlflow.db'}"
            try:
                rows[label] = sweep(Path(tmp), workers, args.trials, args.epochs, storage, mlflow, *extra)
            finally:
                if on_pg:
                    for n in names:
                        database(args.pg, False, n)
        r = rows[label]
        print(
            f"{label:>28}: {r['per_min']:5.1f} trials/min (trials span {r['span']:.1f} s, inside trials "
            f"{r['inside']:.1f} s, process wall {r['wall']:.1f} s); outside trials "
            f"{r['orchestration_ms']:.0f} ms/trial; utilisation {100 * r['utilisation']:.1f} %",
            flush=True,
        )
    if "pg x1" not in rows:
        return
    one = rows["pg x1"]
    for label, r in rows.items():
        if label.startswith("pg x2"):
            print(f"throughput, {label} / pg x1: {r['per_min'] / one['per_min']:.2f}x (goal >= 1.7x)")
    if "sqlite x1" in rows:
        print(
            f"orchestration per trial, one worker: PostgreSQL {one['orchestration_ms']:.0f} ms, sqlite "
            f"{rows['sqlite x1']['orchestration_ms']:.0f} ms (goal <= 50 ms)"
        )


if __name__ == "__main__":
    main()
