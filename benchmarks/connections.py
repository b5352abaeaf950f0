"""The PostgreSQL connections sweeper's processes hold (issue #56 item 5): queued digits sweeps
(3 epochs, MLflow on the same server, another database) drained by one `sweeper worker --queue
--drain`, with pg_stat_activity sampled every 50 ms; the peak per process (each named ``sweeper
<command> <pid>`` by sweeper; MLflow's own engine is unnamed) and per database, and how many
connections the whole worker (its finishing process included) held, sample by sample.

    python benchmarks/connections.py                   # 2 sweeps of 6 trials
    python benchmarks/connections.py --sweeps 3 --trials 4
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import yaml
from machine import describe
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
SERVER = make_url(os.environ.get("SWEEPER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432"))
SAMPLE_S = 0.05  # between two reads of pg_stat_activity


def admin() -> psycopg.Connection:
    return psycopg.connect(
        host=SERVER.host, port=SERVER.port, user=SERVER.username, password=SERVER.password,
        dbname="postgres", autocommit=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=2)
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    names = {role: f"sweeper_conn_{role}_{uuid.uuid4().hex[:8]}" for role in ("sweep", "mlflow")}
    with admin() as db:
        for name in names.values():
            db.execute(f'CREATE DATABASE "{name}"')
    url, mlflow_url = (SERVER.set(database=names[r]).render_as_string(hide_password=False) for r in names)
    try:
        with tempfile.TemporaryDirectory() as work:
            peak, totals, seconds = run(Path(work), url, mlflow_url, args, list(names.values()))
    finally:
        with admin() as db:
            for name in names.values():
                db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(describe())
    print(f"{args.sweeps} sweeps of {args.trials} trials, one queue worker, {seconds:.1f} s")
    role = {v: k for k, v in names.items()}
    for (process, database), n in sorted(peak.items()):
        print(f"  {process or '(unnamed: MLflow)':28s} {role[database]:7s} at most {n}")
    counts = sorted(collections.Counter(totals).items())
    print("  the worker's connections in all, samples by count:", ", ".join(f"{k}: {v}" for k, v in counts))


def run(work: Path, url: str, mlflow_url: str, args: argparse.Namespace, databases: list[str]):
    spec = yaml.safe_load((ROOT / "search_spaces" / "digits.yaml").read_text())
    spec["search"].update(n_trials=args.trials)
    spec["train"]["epochs"] = 3
    spec["tracking"] = {"experiment": "connections", "mlflow_uri": mlflow_url}
    spec["export"] = {"formats": []}
    command = [sys.executable, "-m", "sweeper"]
    for i in range(args.sweeps):
        spec["name"] = f"conn{i}"
        (work / f"conn{i}.yaml").write_text(yaml.safe_dump(spec))
        subprocess.run(command + ["submit", f"conn{i}.yaml", "--queue", url], cwd=work, check=True)
    peak: dict[tuple[str, str], int] = {}
    totals: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with admin() as db:
            while not done.is_set():
                rows = db.execute(
                    "SELECT application_name, datname, count(*) FROM pg_stat_activity "
                    "WHERE datname = ANY(%s) AND backend_type = 'client backend' GROUP BY 1, 2",
                    (databases,),
                ).fetchall()
                for process, database, n in rows:
                    peak[(process, database)] = max(peak.get((process, database), 0), n)
                totals.append(sum(n for _, _, n in rows))
                time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        subprocess.run(command + ["worker", "--queue", url, "--drain", "--out", "runs"], cwd=work, check=True)
    finally:
        done.set()
        sampler.join()
    return peak, totals, time.monotonic() - started


if __name__ == "__main__":
    main()
