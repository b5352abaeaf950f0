"""Many workers on one PostgreSQL study, by simulation (issue #56 item 1): N worker processes run
sweeper's real coordination (`sweeper worker`'s runner: resolve, ledger, proposer, batches,
leases, pruning, the Optuna storage adapter) on one real PostgreSQL database, with the trials
simulated: each trial replays the per-epoch curve and epoch durations of a trial of a recorded
real sweep (a `summary.json`: by default `runs/digits/summary.json`, which `./dev demo` writes),
chosen by the trial's seed, its epochs slept rather than trained, and sweeper's pruner asked after
each epoch as in a real trial. Time is compressed: the recorded epochs are scaled to
``--epoch-s`` seconds on average, so that N workers' coordination fits this machine's cores.
Start-ups are not compressed (N at once on these cores, where N machines would each start in a
few seconds): each worker waits after its own at a barrier, and the sweep's clock
(search.timeout, ``--seconds``) starts when every worker has started.

The workers are forked from this process after it imported sweeper (torch included, never run
before the fork), so their memory is shared until written: 64 workers fit 24 GiB where 64 fresh
processes (311 MB private each) would not. Tracking is off (the MLflow outbox is not simulated).

Each N runs in both modes: reproducible batches, and ``reproducible: false``.
Reproducible batches hold ``--batch-per-worker`` trials per worker (docs/many-machines.md
advises a few), and run once for each ``--staleness`` (search.staleness: batches proposed
before the earlier ones end). For each N and mode it reports:

- start-up: a worker's seconds from its fork to its first trial (resolve and dry build, N at
  once on these cores: not compressed, so reported apart);
- utilisation: the workers' seconds inside trials over their seconds held (from the first
  trial's start to the exit: the waits between trials and the last one count against it);
- clock utilisation: the same during the sweep's clock only (``--seconds`` from the barrier's
  release, after which no trial is claimed): the tail, trials in flight at the timeout while
  other workers have stopped, left out;
- CPU a trial: a worker's CPU seconds from its first trial to its exit, per trial it ended
  (decisions included): what N workers on these cores share;
- trials a minute (ended trials over the wall clock of the run);
- coordinator seconds a trial: a worker's seconds held outside trials, per trial it ended;
- database statements a trial (every statement of every engine of the worker, SQLAlchemy's
  cursor event);
- decision latency p50/p99 (the pruning decision after an epoch: storage write and pruner);
- connections: the most held at once (pg_stat_activity), and lock waits seen (pg_locks not
  granted), sampled every 0.25 s.

    python benchmarks/scale.py --workers 1 8 32 64 --seconds 120
    python benchmarks/scale.py --workers 8 --seconds 60 --modes reproducible
    python benchmarks/scale.py --workers 8 32 --seconds 60 --modes reproducible --staleness 0 1 2
    python benchmarks/scale.py --workers 8 --prefill 100 10000 --seconds 60
    python benchmarks/scale.py --workers 16 --queue 100 --queue-trials 8 --epoch-s 0.5

``--queue K`` runs, for each N, K sweeps of ``--queue-trials`` trials through a queue that N
`sweeper worker --queue --drain` processes serve (run_queue), instead of one sweep.

``--prefill K`` starts each run's study with K finished trials (issue #56 item 3: is a trial's
cost flat in the study's size?): each a random point of the space with a recorded curve, pruned
at a random epoch in two of five, written in one transaction per PREFILL_CHUNK trials before the
workers start; the first worker's ledger then counts their slots as taken (store._existing).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import random
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
import yaml
from machine import describe

ROOT = Path(__file__).resolve().parent.parent
SERVER = sa.engine.make_url(os.environ.get("SWEEPER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432"))
SAMPLE_S = 0.25  # between two reads of pg_stat_activity and pg_locks
MODES = {"reproducible": True, "free": False}  # search.reproducible
# The workers' start-ups (resolve and dry build, N at once on these few cores: 1-3 s each alone)
# end at a barrier, before their first trial; the benchmark then moves the sweep's start
# (search.timeout counts from it) to the barrier's release, so that --seconds are trials. Until
# then the timeout allows this much a worker, and the barrier waits at most BARRIER_S.
STARTUP_S = 10.0
BARRIER_S = 1800.0
PREFILL_CHUNK = 1000  # trials a transaction writes (--prefill)


def admin() -> psycopg.Connection:
    return psycopg.connect(
        host=SERVER.host, port=SERVER.port, user=SERVER.username, password=SERVER.password,
        dbname="postgres", autocommit=True,
    )  # fmt: skip


def recorded(path: Path, epoch_s: float) -> list[list[dict[str, float]]]:
    """The complete trials' histories of a recorded sweep, their epoch seconds scaled so that
    their mean is ``epoch_s`` (the pruned ones stop where their pruner stopped them: their curves
    do not go on)."""
    trials = [t["history"] for t in json.loads(path.read_text())["trials"] if t["state"] == "complete"]
    if not trials:
        raise SystemExit(f"{path}: no complete trial to replay")
    mean = statistics.mean(h["epoch_seconds"] for history in trials for h in history)
    return [[{**h, "epoch_seconds": h["epoch_seconds"] * epoch_s / mean} for h in history] for history in trials]


def prefill(spec: Any, folder: Path, curves: list[list[dict[str, float]]], k: int) -> None:
    """Write ``k`` finished trials into the spec's study (``--prefill``), in a forked child: the
    storage's pool is never shared with the workers forked later."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if status:
            raise SystemExit(f"--prefill {k}: the child writing the trials failed ({status})")
        return
    code = 1
    try:
        import optuna

        from sweeper.review.study_view import distribution
        from sweeper.search.optuna import rdb
        from sweeper.search.optuna.study import BATCH, SLOT, open_study
        from sweeper.spec import space as sp

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = open_study(spec, folder)
        draw = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=spec.seed))
        metric, size, rng = spec.objective.metric, spec.search.batch_size, random.Random(spec.seed)
        trials = []
        for slot in range(k):
            params = sp.suggest(spec.search.space, draw.ask())
            scale = 1 + 0.01 * rng.random()  # recorded curves, none equal to another (ties are rare in sweeps)
            curve = [h[metric] * scale for h in rng.choice(curves)]
            stop = rng.randint(spec.search.pruner.min_epochs, len(curve) - 1) if rng.random() < 0.4 else len(curve)
            state = optuna.trial.TrialState.COMPLETE if stop == len(curve) else optuna.trial.TrialState.PRUNED
            trials.append(
                optuna.trial.create_trial(
                    state=state,
                    value=curve[-1] if stop == len(curve) else None,
                    params=params,
                    distributions={path: distribution(spec.search.space[path]) for path in params},
                    intermediate_values={e: v for e, v in enumerate(curve[:stop], start=1)},
                    user_attrs={SLOT: slot, BATCH: slot - slot % size},
                )
            )
        for start in range(0, k, PREFILL_CHUNK):
            rdb.create(study, trials[start : start + PREFILL_CHUNK])
        code = 0
    finally:
        os._exit(code)


class Stats:
    """What one simulated worker measures of itself."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ready: float | None = None  # time.monotonic() when its start-up ended (its first trial claimed)
        self.first_trial: float | None = None  # time.monotonic() when its first trial started
        self.first_cpu = 0.0  # time.process_time() then (the start-up's CPU seconds, not counted)
        self.busy_s = 0.0  # inside simulated trials
        self.trials = 0
        self.statements = 0
        self.decisions: list[float] = []  # seconds each pruning decision took
        self.trial_spans: list[tuple[float, float]] = []  # (start, end) of each trial, time.monotonic()
        self.visits = 0  # a queue's worker: the sweeps it entered

    def dump(self, path: Path) -> None:
        now = time.monotonic()
        first = self.first_trial if self.first_trial is not None else now
        record = {
            "start_s": (self.ready or now) - self.started,
            "held_s": now - first,
            "busy_s": self.busy_s,
            "trials": self.trials,
            "statements": self.statements,
            "cpu_s": time.process_time() - self.first_cpu,  # a forked child's count starts at 0
            "decisions": self.decisions,
            "trial_spans": self.trial_spans,
            "visits": self.visits,
        }
        path.write_text(json.dumps(record))


def simulate(curves: list[list[dict[str, float]]], stats: Stats, barrier: threading.Barrier):
    """An ``execute`` (sweeper.trial.execute's signature) that replays a recorded trial per config;
    before the first, it waits at ``barrier`` for every worker's start-up."""
    from sweeper.states import TrialState
    from sweeper.trial.outcome import Outcome

    def execute(configs, decide, worker_index=0, cache=None, ranks=None):
        outcomes = []
        for config in configs:
            if stats.first_trial is None:
                stats.ready = time.monotonic()
                try:
                    barrier.wait(BARRIER_S)
                except threading.BrokenBarrierError:  # a worker failed to start: go on without it
                    pass
            started = time.monotonic()
            if stats.first_trial is None:
                stats.first_trial, stats.first_cpu = started, time.process_time()
            curve = random.Random(config.seed).choice(curves)
            out = Outcome(config.number, TrialState.COMPLETE)
            for epoch, metrics in enumerate(curve[: config.spec.train.epochs], start=1):
                time.sleep(metrics["epoch_seconds"])
                out.history.append(dict(metrics))
                asked = time.monotonic()
                stop = decide(config.number, epoch, dict(metrics))
                stats.decisions.append(time.monotonic() - asked)
                if stop:
                    out.state, out.reason = TrialState.PRUNED, f"pruned at epoch {epoch}"
                    break
            stats.trial_spans.append((started, time.monotonic()))
            seconds = time.monotonic() - started
            out.info = {"device": "cpu", "threads": 1, "seconds": seconds, "device_seconds": seconds}
            stats.busy_s += seconds
            stats.trials += 1
            outcomes.append(out)
        return outcomes

    return execute


def worker(run: Any, curves: list[list[dict[str, float]]], stats_path: Path, profile: bool, barrier: Any) -> None:
    """A forked child: ``run()`` (a `sweeper worker`'s runner, or a queue's worker) with simulated
    trials; never returns. With ``profile``, its cProfile statistics go beside its measurements
    (``w<i>.prof``)."""
    code = 1
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler:
            profiler.enable()
        from sweeper.search import pool

        stats = Stats()

        def counted(*_: object) -> None:
            stats.statements += 1

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", counted)
        pool.execute = simulate(curves, stats, barrier)
        devnull = os.open(os.devnull, os.O_WRONLY)  # the workers' warnings, N times over: not shown
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        stats.visits = run()
        stats.dump(stats_path)
        if profiler:
            profiler.disable()
            profiler.dump_stats(stats_path.with_suffix(".prof"))
        code = 0
    finally:
        os._exit(code)


def sweep_worker(spec: Any, out: Path) -> Any:
    """`sweeper worker SPEC`'s runner (one sweep), as ``worker``'s ``run``."""

    def run() -> int:
        from sweeper.search import runner
        from sweeper.search.state import Role
        from sweeper.track.progress import QuietObserver

        runner.run_sweep(spec, out, QuietObserver(), role=Role.WORKER)
        return 1

    return run


def queue_worker(url: str, out: Path) -> Any:
    """`sweeper worker --queue URL --drain` (a CPU of 24 GB on offer), as ``worker``'s ``run``:
    the sweeps it entered."""

    def run() -> int:
        from sweeper.queue.table import Offer
        from sweeper.queue.worker import QueueWorker

        served = QueueWorker(url, out, Offer("cpu", 24.0), lambda line: None, drain=True)
        served.run()
        return served.served

    return run


def database() -> tuple[str, str]:
    """A new database on the server: its name and URL."""
    name = f"sweeper_scale_{uuid.uuid4().hex[:8]}"
    with admin() as db:
        db.execute(f'CREATE DATABASE "{name}"')
    return name, SERVER.set(database=name).render_as_string(hide_password=False)


def scale_tree(name: str, url: str, reproducible: bool, n_trials: int, timeout: float | None, batch_size: int) -> Any:
    """search_spaces/digits.yaml for the simulation: its space, pruner and curves; tracking and export off."""
    tree = yaml.safe_load((ROOT / "search_spaces" / "digits.yaml").read_text())
    tree["name"] = name
    tree["search"].update(
        storage=url, reproducible=reproducible, n_trials=n_trials, timeout=timeout, parallel=1,
        sampler="tpe", batch_size=batch_size,
    )  # fmt: skip
    tree["tracking"] = {"enabled": False}
    tree["export"] = {"formats": []}
    return tree


def fork_workers(runs: list[Any], curves, folder: Path, profile: bool, barrier: Any) -> dict[int, Path]:
    """A forked ``worker`` for each of ``runs``: pid -> where its measurements go."""
    children = {}
    for i, run in enumerate(runs):
        stats_path = folder / f"w{i}.json"
        pid = os.fork()
        if pid == 0:
            worker(run, curves, stats_path, profile, barrier)
        children[pid] = stats_path
    return children


def watch(name: str, children: dict[int, Path], before_drop: Any = None) -> tuple[int, float]:
    """Until every child exits: the most connections to database ``name`` at once and the lock
    waits a sample (pg_stat_activity, pg_locks: every SAMPLE_S); then ``before_drop()``, and the
    database is dropped."""
    peak_connections, lock_waits, samples = 0, 0, 0
    with admin() as db:
        while children:
            row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()
            waits = db.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            peak_connections = max(peak_connections, row[0] if row else 0)
            lock_waits += waits[0] if waits else 0
            samples += 1
            while children:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.pop(pid, None)
            time.sleep(SAMPLE_S)
        if before_drop is not None:
            before_drop()
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return peak_connections, lock_waits / max(1, samples)


def measured(stats: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """The columns every run reports, from its workers' measurements."""
    trials = sum(s["trials"] for s in stats)
    decisions = sorted(d for s in stats for d in s["decisions"])
    return {
        "workers_ok": len(stats),
        "wall_s": wall,
        "trials": trials,
        "start_s_median": statistics.median(s["start_s"] for s in stats) if stats else None,
        "utilisation": sum(s["busy_s"] for s in stats) / max(1e-9, sum(s["held_s"] for s in stats)),
        "trials_per_min": 60 * trials / wall,
        "coordinator_s_per_trial": sum(s["held_s"] - s["busy_s"] for s in stats) / max(1, trials),
        # CPU each trial costs its worker (decisions included): what N workers on these cores share
        "cpu_ms_per_trial": 1000 * sum(s["cpu_s"] for s in stats) / max(1, trials),
        "statements_per_trial": sum(s["statements"] for s in stats) / max(1, trials),
        "decision_p50_ms": 1000 * decisions[len(decisions) // 2] if decisions else None,
        "decision_p99_ms": 1000 * decisions[int(len(decisions) * 0.99)] if decisions else None,
    }


def merge_profiles(args: argparse.Namespace, folder: Path, name: str) -> None:
    if args.profile:
        profiles = [str(p) for p in folder.glob("w*.prof")]
        if profiles:
            pstats.Stats(*profiles).dump_stats(args.profile / f"{name}.prof")


def run_one(
    n: int, reproducible: bool, staleness: int, filled: int, args: argparse.Namespace, curves, work: Path
) -> dict[str, Any]:
    from sweeper.spec import validate

    name, url = database()
    tree = scale_tree(
        f"scale{n}", url, reproducible, 100_000, args.seconds + n * STARTUP_S, max(4, args.batch_per_worker * n)
    )
    tree["search"]["staleness"] = staleness
    spec = validate(tree, "scale")
    mode = label(reproducible, staleness)
    folder = Path(tempfile.mkdtemp(prefix=f"n{n}-{mode.replace(' ', '')}-", dir=work))  # a run may repeat
    if filled:
        prefill(spec, folder, curves, filled)
    started = time.monotonic()
    barrier = multiprocessing.Barrier(n + 1)  # the workers', and this process's
    runs = [sweep_worker(spec, folder / f"w{i}") for i in range(n)]
    children = fork_workers(runs, curves, folder, args.profile is not None, barrier)
    released: list[float] = []
    allowance_s = n * STARTUP_S  # search.timeout less --seconds
    threading.Thread(target=release, args=(barrier, url, spec.name, allowance_s, released), daemon=True).start()
    peak_connections, lock_waits = watch(name, children)
    wall = time.monotonic() - started
    merge_profiles(args, folder, f"n{n}-{mode.replace(' ', '')}-k{filled}")
    stats = [json.loads(p.read_text()) for p in sorted(folder.glob("w*.json"))]
    return {
        "workers": n,
        "mode": mode,
        "prefilled": filled,
        "batch_size": spec.search.batch_size,
        "staleness": spec.search.staleness,
        **measured(stats, wall),
        "clock_utilisation": clock_utilisation(stats, released[0] if released else None, args.seconds),
        "peak_connections": peak_connections,
        "lock_waits_per_sample": lock_waits,
    }


def run_queue(n: int, args: argparse.Namespace, curves, work: Path) -> dict[str, Any]:
    """``--queue K``: K sweeps of ``--queue-trials`` trials each (reproducible batches of 4, three
    owners of equal share) in a queue that N `sweeper worker --queue --drain` processes serve
    until every sweep is finished (each worker's finishing process summarises those it ends)."""
    from sweeper.queue.table import Queue
    from sweeper.spec import validate

    name, url = database()
    queue = Queue(url)
    for i in range(args.queue):
        spec = validate(scale_tree(f"q{i:03d}", url, True, args.queue_trials, None, 4), "scale")
        queue.add(spec.name, f"team{i % 3}", 0, spec.model_dump(mode="json"), "cpu", 0.0)
    queue.close()
    folder = Path(tempfile.mkdtemp(prefix=f"n{n}-queue-", dir=work))
    started = time.monotonic()
    barrier = multiprocessing.Barrier(n + 1)
    children = fork_workers(
        [queue_worker(url, folder / "runs") for _ in range(n)], curves, folder, args.profile is not None, barrier
    )
    released: list[float] = []
    threading.Thread(target=lambda: (barrier.wait(BARRIER_S), released.append(time.monotonic())), daemon=True).start()
    states: dict[str, int] = {}

    def ended() -> None:  # the sweeps' states, read before watch drops the database
        queue = Queue(url)
        for entry in queue.entries():
            states[entry.state] = states.get(entry.state, 0) + 1
        queue.close()

    peak_connections, lock_waits = watch(name, children, before_drop=ended)
    wall = time.monotonic() - started
    merge_profiles(args, folder, f"n{n}-queue{args.queue}")
    stats = [json.loads(p.read_text()) for p in sorted(folder.glob("w*.json"))]
    return {
        "workers": n,
        "mode": f"queue of {args.queue}",
        "prefilled": 0,
        "batch_size": 4,
        "staleness": 0,
        **measured(stats, wall),
        # from the last worker's start-up to the last exit: the queue's drain
        "drain_s": time.monotonic() - released[0] if released else None,
        "sweeps": states,
        "visits_per_sweep": sum(s.get("visits", 0) for s in stats) / max(1, args.queue),
        "peak_connections": peak_connections,
        "lock_waits_per_sample": lock_waits,
    }


def release(barrier: Any, url: str, study: str, allowance_s: float, released: list[float]) -> None:
    """Wait with the workers at their barrier; once every one has started, the sweep's start
    moved to now (the ledger's started_at: search.timeout's seconds are then all trials)."""
    try:
        barrier.wait(BARRIER_S)
    except threading.BrokenBarrierError:
        return
    released.append(time.monotonic())
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as db:
        db.execute(
            sa.text("UPDATE sweeper_sweeps SET started_at = :t WHERE study = :s"),
            {"t": time.time() - allowance_s, "s": study},
        )
    engine.dispose()


def clock_utilisation(stats: list[dict[str, Any]], released: float | None, seconds: float) -> float | None:
    """Utilisation during the sweep's clock: the workers' trial seconds between the barrier's
    release and the timeout (``seconds`` later: no trial is claimed after it), over N times that
    (time.monotonic() is one clock for the forked workers); None without a release."""
    if released is None or not stats:
        return None
    end = released + seconds
    busy = sum(max(0.0, min(b, end) - max(a, released)) for s in stats for a, b in s["trial_spans"])
    return busy / (len(stats) * seconds)


def label(reproducible: bool, staleness: int) -> str:
    """A run's mode as the tables name it."""
    if not reproducible:
        return "free"
    return "reproducible" if staleness == 0 else f"reproducible, staleness {staleness}"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Utilisation against the number of workers, a line per mode (matplotlib, which MLflow brings);
    the runs of the smallest --prefill only."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    rows = [r for r in rows if r["prefilled"] == min(r["prefilled"] for r in rows)]
    for mode in dict.fromkeys(r["mode"] for r in rows):
        points = [(r["workers"], 100 * r["utilisation"]) for r in rows if r["mode"] == mode]
        if points:
            axes.plot(*zip(*points), marker="o", label=mode)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("workers on one PostgreSQL study")
    axes.set_ylabel("utilisation (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--seconds", type=float, default=120.0, help="search.timeout of each run")
    parser.add_argument("--batch-per-worker", type=int, default=2, help="reproducible batches: trials per worker")
    parser.add_argument(
        "--staleness", type=int, nargs="+", default=[0], help="reproducible: search.staleness, a run for each"
    )
    parser.add_argument("--epoch-s", type=float, default=1.0, help="the replayed epochs' mean seconds")
    parser.add_argument(
        "--prefill", type=int, nargs="+", default=[0], help="finished trials in the study at the start, a run each"
    )
    parser.add_argument("--queue", type=int, help="instead of one sweep: a queue of this many sweeps (run_queue)")
    parser.add_argument("--queue-trials", type=int, default=8, help="--queue: each sweep's search.n_trials")
    parser.add_argument("--recorded", type=Path, default=ROOT / "runs" / "digits" / "summary.json")
    parser.add_argument("--results", type=Path, help="write the rows as JSON here too")
    parser.add_argument("--profile", type=Path, help="write each run's workers' cProfile statistics, merged, here")
    parser.add_argument("--plot", type=Path, help="write a PNG of utilisation against N here (matplotlib)")
    args = parser.parse_args()
    curves = recorded(args.recorded, args.epoch_s)
    import sweeper.search.pool  # noqa: F401 (imported before the forks: shared by the workers)
    import sweeper.search.runner  # noqa: F401

    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            if args.queue:
                rows.append(run_queue(n, args, curves, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
                continue
            for mode in args.modes:
                for staleness in args.staleness if MODES[mode] else [0]:
                    for filled in args.prefill:
                        rows.append(run_one(n, MODES[mode], staleness, filled, args, curves, Path(tmp)))
                        print(json.dumps(rows[-1]), flush=True)
    print(describe())
    print(f"search.timeout {args.seconds:.0f} s a run, epochs of {args.epoch_s} s on average, {args.recorded}")
    columns = [c for c in rows[0] if c not in ("workers", "mode", "prefilled")]
    print("| workers | mode | prefilled | " + " | ".join(columns) + " |")
    print("|---|---|---|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:.3g}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        print(f"| {row['workers']} | {row['mode']} | {row['prefilled']} | " + " | ".join(cells) + " |")
    if args.queue:
        print(f"a queue of {args.queue} sweeps of {args.queue_trials} trials each (reproducible batches of 4)")
    if args.plot:
        plot(rows, args.plot)
    if args.results:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.results.write_text(json.dumps({"machine": describe(), "args": settings, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
