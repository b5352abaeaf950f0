"""What reproducible mode's decisions cost as a study grows (issue #55 item 4: sampling cost at
thousands of trials), timed directly, no training: a study in SQLite (the storage a one-machine
sweep uses) holding N finished trials of search_spaces/mnist1d.yaml's space, shaped like a
pruned sweep's (a third complete at 15 epochs, the rest pruned at epoch 1, 3 or 9), and the
three things the coordinator does with it:

- propose: the next batch's params (``EarlierBatches.params``: read the finished trials from the
  storage, build the in-memory view of the earlier batches, sample 4 trials with TPE), a
  process's first (which reads every finished trial from the storage) and its later ones;
- a trial's start (its shadow; timed for a batch's first trial, where the median pruner builds
  the view the batch's trials share, while the hyperband pruner builds a view for each trial) and
  one epoch's pruning decision, for each pruner;
- the database work of one propose (issue #56 item 3: flat in the study's size?): the statements
  it sends and the rows of Optuna's tables it loads (SQLAlchemy's cursor and ORM load events).

    python benchmarks/sampling_cost.py [--sizes 100 1000 3000] [--repeat 3]

Prints, for each N, the median milliseconds of each over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState as OptunaState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sweeper.review.study_view import distribution  # noqa: E402
from sweeper.search.optuna.batches import EarlierBatches  # noqa: E402
from sweeper.search.optuna.study import BATCH, SLOT  # noqa: E402
from sweeper.spec import load  # noqa: E402
from sweeper.spec import space as sp  # noqa: E402

EPOCHS = 15
BATCH_SIZE = 4
COUNTS = ("propose: statements", "propose: rows loaded")  # database work, not milliseconds


def trials(spec, n: int, seed: int = 0) -> list[optuna.trial.FrozenTrial]:
    """``n`` finished trials of the spec's space: params drawn at random, a learning curve each."""
    rng = random.Random(seed)
    draw = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for slot in range(n):
        trial = draw.ask()
        params = sp.suggest(spec.search.space, trial)
        quality = rng.random()
        stop = rng.choice([1, 3, 9, EPOCHS, EPOCHS])  # a third to two fifths complete
        curve = {e: quality * (1 - 0.5 ** (e / 3)) for e in range(1, stop + 1)}
        complete = stop == EPOCHS
        out.append(
            optuna.trial.create_trial(
                state=OptunaState.COMPLETE if complete else OptunaState.PRUNED,
                value=curve[stop] if complete else None,
                params=params,
                distributions={path: distribution(spec.search.space[path]) for path in params},
                intermediate_values=curve,
                user_attrs={SLOT: slot, BATCH: slot - slot % BATCH_SIZE},
            )
        )
    return out


def timed(fn, repeat: int) -> float:
    """The median milliseconds of ``fn()`` over ``repeat`` calls."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def database_work(storage: optuna.storages.RDBStorage, fn) -> dict[str, float]:
    """The statements ``fn()`` sends through ``storage``'s engine and the rows of Optuna's tables
    (trials, their params, values, intermediate values and attrs) it loads."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    counts: dict[str, float] = dict.fromkeys(COUNTS, 0.0)

    def statement(*_: object) -> None:
        counts[COUNTS[0]] += 1

    def row(*_: object) -> None:
        counts[COUNTS[1]] += 1

    tables = [m for m in vars(models).values() if isinstance(m, type) and issubclass(m, models.BaseModel)]
    tables = [m for m in tables if m is not models.BaseModel]
    sa.event.listen(storage.engine, "before_cursor_execute", statement)
    for table in tables:
        sa.event.listen(table, "load", row)
    try:
        fn()
    finally:
        sa.event.remove(storage.engine, "before_cursor_execute", statement)
        for table in tables:
            sa.event.remove(table, "load", row)
    return counts


def measure(n: int, repeat: int, folder: Path) -> dict[str, float]:
    def spec_with(pruner: str):
        overrides = [f"train.epochs={EPOCHS}", "search.sampler=tpe", f"search.n_trials={n + 100}"]
        return load(REPO / "search_spaces" / "mnist1d.yaml", [*overrides, f"search.pruner.type={pruner}"])

    spec = spec_with("median")
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / f'study{n}.db'}")
    study = optuna.create_study(study_name="cost", storage=storage, direction="maximize")
    study.add_trials(trials(spec, n))
    batch = n  # the batch after the n finished trials
    first = optuna.load_study(study_name="cost", storage=storage)
    result = {
        "propose, first in a process": timed(lambda: EarlierBatches(spec, first, []).params(batch, BATCH_SIZE), 1)
    }
    # every later propose: Optuna's cache of the finished trials warm (the line above read them)
    result["propose"] = timed(lambda: EarlierBatches(spec, first, []).params(batch, BATCH_SIZE), repeat)
    # with the process's cache of finished trials warm (Optuna's _CachedStorage: a coordinator's
    # every propose after its first), and cold (a process's first, which reads them all)
    result |= database_work(storage, lambda: EarlierBatches(spec, first, []).params(batch, BATCH_SIZE))
    cold = optuna.load_study(study_name="cost", storage=storage)
    work = database_work(storage, lambda: EarlierBatches(spec, cold, []).params(batch, BATCH_SIZE))
    result |= {f"{name}, first in a process": value for name, value in work.items()}
    for pruner in ("median", "hyperband"):
        shadows, decisions = [], []
        for _ in range(repeat):
            # a batch's first trial: the median pruner's shared view is built here (once a batch)
            batches = EarlierBatches(spec_with(pruner), study, [])
            batches.finished_before(batch)  # read from the storage once a batch, as the coordinator does
            started = time.perf_counter()
            shadow = batches.shadow(batch)  # a trial's start: its shadow (hyperband: a view of its own)
            shadows.append(time.perf_counter() - started)
            for epoch in range(1, 4):
                shadow.report(0.5, epoch)
            started = time.perf_counter()
            shadow.should_prune()
            decisions.append(time.perf_counter() - started)
        result[f"{pruner}: trial start"] = 1000 * statistics.median(shadows)
        result[f"{pruner}: one decision"] = 1000 * statistics.median(decisions)
    return result


def _counted(column: str) -> bool:
    return column.startswith(COUNTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {n: measure(n, args.repeat, Path(tmp)) for n in args.sizes}
    columns = list(next(iter(rows.values())))
    print("| finished trials | " + " | ".join(c if _counted(c) else f"{c} ms" for c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for n, row in rows.items():
        print(f"| {n} | " + " | ".join(f"{row[c]:.0f}" if _counted(c) else f"{row[c]:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
