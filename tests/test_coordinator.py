"""The Optuna coordinator without worker processes or MLflow: a real Optuna study and ledger
(sqlite), an executor that trains nothing (each epoch's metric is a function of the trial's
params), and a recording observer. Reproducible batches must give one trial table whatever the
slots and the order in which trials finish; pruning looks at earlier batches only."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from conftest import SPACES

from sweeper.search.backend import SearchContext
from sweeper.search.optuna.batches import EarlierBatches
from sweeper.search.optuna.coordinator import Coordinator
from sweeper.search.optuna.store import LedgerStore
from sweeper.search.optuna.study import make_sampler
from sweeper.search.state import Prepared
from sweeper.search.trial_runs import SweepInfo
from sweeper.spec import load
from sweeper.track.mlflow import Tracker
from sweeper.trial.build import TrialConfig
from sweeper.trial.execute import Outcome
from sweeper.trial.seeding import sampler_seed, trial_seed


def val_acc(params: dict, epoch: int) -> float:
    """Better near lr = 1e-2, growing with the epoch."""
    return epoch / 3 * (1 - abs(math.log10(params["optimizer.args.lr"]) + 2) / 3)


class Scripted:
    """An executor whose trials 'train' instantly; finishes them in submission order or reversed."""

    def __init__(self, coordinator: Coordinator, slots: int, reverse: bool) -> None:
        self.coordinator, self.capacity, self.reverse = coordinator, slots, reverse
        self.running: list[TrialConfig] = []
        self.tasks: list[list[int]] = []  # the trial numbers of each task, as submitted

    @property
    def slots(self) -> int:
        return self.capacity - len(self.running)

    def submit(self, task: list[TrialConfig]) -> None:
        self.tasks.append([config.number for config in task])
        self.running.extend(task)

    def results(self, timeout_s: float = 0.0):
        order, self.running = (self.running[::-1] if self.reverse else self.running), []
        for task in order:
            yield self._train(task)

    def _train(self, task: TrialConfig) -> Outcome:
        history = []
        for epoch in range(1, task.spec.train.epochs + 1):
            metrics = {"val_acc": val_acc(task.params, epoch)}
            history.append(metrics)
            prune = self.coordinator.decide(task.number, epoch, metrics)
            self.coordinator.record(task.number, epoch, metrics)
            if prune:
                return Outcome(task.number, "pruned", history, reason=f"pruned at epoch {epoch}")
        return Outcome(task.number, "complete", history, info={"seconds": 0.0})

    def close(self) -> None:
        pass


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def started(self, spec, out_dir) -> None:
        pass

    def event(self, event) -> None:
        self.seen.append((event.kind, event.number))

    def note(self, text: str) -> None:
        pass


def sweep(
    tmp_path: Path,
    *overrides: str,
    slots: int = 1,
    reverse: bool = False,
    budget: int | None = 10,
    enqueue: tuple[float, ...] = (),
):
    spec = load(
        SPACES / "smoke.yaml",
        [
            "search.pruner={type: median, min_epochs: 1, startup_trials: 2}",
            f"search.n_trials={budget}" if budget is not None else "search.n_trials=null",
            *overrides,
        ],
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = LedgerStore(spec, tmp_path)  # the study and ledger, in sqlite in tmp_path
    warm = [{"optimizer.args.lr": lr, "model.args.hidden": 16} for lr in enqueue]  # these trials first
    store.prepare(spec, "run", None, lambda: Prepared(enqueue=warm, fresh=True))
    events = Events()
    ctx = SearchContext(
        tmp_path, Tracker(None), SweepInfo(None, spec.seed, str(tmp_path), "test"), events, store, enqueue=warm
    )
    coordinator = Coordinator(spec, store.study, store.ledger, store.heartbeat, ctx)
    executor = Scripted(coordinator, slots, reverse)
    coordinator.run(executor)
    store.close()
    events.tasks = executor.tasks
    return coordinator, events


def table(coordinator: Coordinator) -> list:
    return [(r.number, r.state, r.params, r.value, r.seed, r.epochs) for r in coordinator.records()]


def test_reproducible_batches_ignore_slots_and_finishing_order(tmp_path: Path):
    one, _ = sweep(tmp_path / "a")
    first = table(one)
    assert [row[0] for row in first] == list(range(10))
    assert {row[1] for row in first} == {"complete", "pruned"}  # pruning decisions are covered
    assert [row[4] for row in first] == [trial_seed(0, n) for n in range(10)]
    for slots, reverse in ((4, False), (4, True), (3, True)):
        other, _ = sweep(tmp_path / f"{slots}{reverse}", slots=slots, reverse=reverse)
        assert table(other) == first, (slots, reverse)


def test_batches_are_sampled_from_their_own_seed(tmp_path: Path):
    coordinator, events = sweep(tmp_path, budget=6)  # batches of 4 and 2
    records = coordinator.records()
    # batch 2 (slots 4, 5): the sampler seeded from the "sampler" stream at 4, over batch 1's results
    view = optuna.create_study(direction="maximize", sampler=make_sampler(coordinator.spec, sampler_seed(0, 4)))
    view.add_trials(coordinator.study.get_trials()[:4])
    from sweeper.spec import space as sp

    expected = []
    for _ in range(2):
        trial = view.ask()
        sp.suggest(coordinator.spec.search.space, trial)
        expected.append(trial.params)
    assert [r.params for r in records[4:]] == expected
    assert sampler_seed(0, 4) != trial_seed(0, 4)  # named streams differ
    # every trial: start, one event per epoch it ran, end; one at a time with one slot
    for r in records:
        mine = [kind for kind, n in events.seen if n == r.number]
        assert mine == ["start", *["epoch"] * r.epochs, "end"]


def test_a_trial_is_pruned_against_earlier_batches_only(tmp_path: Path):
    lrs = (1e-2, 1e-2, 1e-4, 1e-4, 1e-4)  # two good trials, then three bad ones
    coordinator, _ = sweep(tmp_path, "search.batch_size=4", budget=5, enqueue=lrs)
    # trials 2 and 3 are worse than 0 and 1, but in the same batch: not pruned; trial 4 is
    assert [r.state for r in coordinator.records()] == ["complete"] * 4 + ["pruned"]
    eager, _ = sweep(tmp_path / "b", "search.reproducible=false", budget=5, enqueue=lrs)
    # without batches, every bad trial meets the finished good ones
    assert [r.state for r in eager.records()] == ["complete"] * 2 + ["pruned"] * 3


def test_with_staleness_a_batch_starts_before_the_last_one_ends_and_the_table_keeps(tmp_path: Path):
    """Issue #56 item 2: search.staleness 1: batch 4 is proposed while batch 0 runs (it knows no
    result), batch 8 only once batch 0 has ended (it knows batch 0's, not batch 4's); the table is
    one whatever the slots and the finishing order."""
    lrs = (1e-2, 1e-2, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4)  # two good trials, then bad ones
    stale = ("search.batch_size=4", "search.staleness=1")
    one, _ = sweep(tmp_path / "one", *stale, budget=9, enqueue=lrs)
    # trials 4-7 know nothing (none pruned); trial 8 knows batch 0's two good trials: pruned
    assert [r.state for r in one.records()] == ["complete"] * 8 + ["pruned"]
    for slots, reverse in ((8, False), (8, True), (3, True)):
        other, _ = sweep(tmp_path / f"{slots}{reverse}", *stale, budget=9, enqueue=lrs, slots=slots, reverse=reverse)
        assert table(other) == table(one), (slots, reverse)
    # with 8 slots: batches 0 and 4 start together; 8 waits for batch 0 (this executor ends
    # every running trial before the next start: that 8 need not wait for batch 4 is the process test's)
    _, events = sweep(tmp_path / "order", *stale, budget=12, slots=8)
    assert events.tasks[:8] == [[n] for n in range(8)]
    seen = events.seen
    assert seen.index(("start", 4)) < seen.index(("end", 0))
    assert seen.index(("start", 8)) > max(seen.index(("end", n)) for n in range(4))
    # without staleness, batch 4 waits for batch 0
    _, events = sweep(tmp_path / "barrier", "search.batch_size=4", budget=8, slots=8)
    assert events.seen.index(("start", 4)) > max(events.seen.index(("end", n)) for n in range(4))


def test_a_batchs_trials_share_one_pruning_view_and_are_pruned_as_with_a_view_each(tmp_path: Path, monkeypatch):
    builds: list[tuple[int, bool]] = []
    build = EarlierBatches.view

    def counted(self, batch, sampler=None, **more):
        builds.append((batch, sampler is None))
        return build(self, batch, sampler, **more)

    monkeypatch.setattr(EarlierBatches, "view", counted)
    shared, _ = sweep(tmp_path / "shared", slots=4)
    assert [batch for batch, for_shadows in builds if for_shadows] == [0, 4, 8]  # one per batch, not per trial
    monkeypatch.setattr(EarlierBatches, "shadow", lambda self, batch: build(self, batch).ask())  # a view each
    each, _ = sweep(tmp_path / "each", slots=4)
    assert table(shared) == table(each) and {row[1] for row in table(shared)} == {"complete", "pruned"}


def test_free_mode_reads_the_whole_study_a_fixed_number_of_times_and_no_point_twice(tmp_path: Path, monkeypatch):
    """reproducible: false: pruning decisions and proposals read this process's view of the
    finished trials (finished.py), not Optuna's cache, which reads every running trial again at
    each read: the cache's reads do not grow with the sweep. Each slot is sampled by its own seed."""
    from optuna.storages._cached_storage import _CachedStorage

    reads = {}
    for n in (6, 24):
        count = 0
        original = _CachedStorage._read_trials_from_remote_storage

        def counted(self, study_id, original=original):
            nonlocal count
            count += 1
            return original(self, study_id)

        monkeypatch.setattr(_CachedStorage, "_read_trials_from_remote_storage", counted)
        coordinator, _ = sweep(tmp_path / str(n), "search.reproducible=false", slots=3, budget=n)
        monkeypatch.undo()
        rows = table(coordinator)
        assert len(rows) == n and len({tuple(sorted(r[2].items())) for r in rows}) == n
        if n == 24:  # some slot ran 8 trials after each other, each pruned against those before it
            assert "pruned" in [r[1] for r in rows]
        reads[n] = count
    assert reads[24] == reads[6]


def test_grid_sampler_runs_each_point_once(tmp_path: Path):
    coordinator, _ = sweep(
        tmp_path,
        "search.sampler=grid",
        "search.space.optimizer.args.lr={type: categorical, choices: [1.0e-3, 1.0e-2]}",
        budget=None,
    )
    points = sorted((r.params["optimizer.args.lr"], r.params["model.args.hidden"]) for r in coordinator.records())
    assert points == [(1e-3, 16), (1e-3, 32), (1e-2, 16), (1e-2, 32)]


@pytest.mark.parametrize("budget", [1, 3])
def test_the_budget_is_kept(tmp_path: Path, budget: int):
    coordinator, _ = sweep(tmp_path, budget=budget)
    assert len(coordinator.records()) == budget


@pytest.mark.parametrize("keep", ["best", "all"])
def test_beaten_checkpoints_are_deleted_as_the_sweep_goes(tmp_path: Path, keep: str):
    from sweeper.search import checkpoints
    from sweeper.track.records import TrialRecord
    from sweeper.trial.checkpoint import trial_path

    spec = load(SPACES / "smoke.yaml", [f"export.keep_checkpoints={keep}"])
    kept: list[TrialRecord] = []
    for number, value in ((0, 0.5), (1, 0.7), (2, 0.6), (3, 0.7)):  # trial 3 ties trial 1: 1 stays best
        trial_path(tmp_path, number).parent.mkdir(exist_ok=True)
        trial_path(tmp_path, number).write_bytes(b"state")
        new = TrialRecord(number=number, state="complete", params={}, value=value)
        kept = checkpoints.keep_better(spec, kept, new, tmp_path)
    assert [r.number for r in kept] == ([1] if keep == "best" else [0, 1, 2, 3])
    on_disk = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir())
    assert on_disk == ([1] if keep == "best" else [0, 1, 2, 3])


def test_a_multi_objective_sweep_keeps_the_checkpoints_of_its_pareto_front(tmp_path: Path):
    from sweeper.search import checkpoints
    from sweeper.track.records import TrialRecord
    from sweeper.trial.checkpoint import trial_path

    spec = load(
        SPACES / "smoke.yaml",
        [
            "search.pruner.type=none",
            "objective=null",
            "objectives=[{metric: val_acc}, {metric: params, direction: minimize}]",
        ],
    )
    kept: list[TrialRecord] = []
    # (val_acc, params): 1 beats 0 on both; 2 is smaller; 3 is beaten by 1
    for number, (acc, size) in enumerate([(0.5, 900.0), (0.7, 800.0), (0.6, 100.0), (0.65, 850.0)]):
        trial_path(tmp_path, number).parent.mkdir(exist_ok=True)
        trial_path(tmp_path, number).write_bytes(b"state")
        new = TrialRecord(
            number=number, state="complete", params={}, value=acc, values={"val_acc": acc, "params": size}
        )
        kept = checkpoints.keep_better(spec, kept, new, tmp_path)
    assert [r.number for r in kept] == [1, 2]
    assert sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir()) == [1, 2]


def test_fused_tasks_are_chunks_of_each_batch_whatever_the_slots(tmp_path: Path):
    """search.fuse: the trials of a chunk of fuse slots go to one worker as one task (split by
    architecture: model.args.hidden is searched), the same tasks and table with any slot count."""
    runs = {
        slots: sweep(tmp_path / str(slots), "search.batch_size=4", "search.fuse=2", slots=slots, budget=8)
        for slots in (1, 3)
    }
    (one, one_events), (three, three_events) = runs[1], runs[3]
    assert table(one) == table(three)
    assert sorted(map(sorted, one_events.tasks)) == sorted(map(sorted, three_events.tasks))
    hidden = {r.number: r.params["model.args.hidden"] for r in one.records()}
    for task in one_events.tasks:
        assert len({n // 2 for n in task}) == 1  # never across chunks (slots 0-1, 2-3, ...)
        assert len({hidden[n] for n in task}) == 1  # one architecture per fused task
    assert sorted(n for task in one_events.tasks for n in task) == list(range(8))
    assert any(len(task) == 2 for task in one_events.tasks), one_events.tasks  # some chunk fused
