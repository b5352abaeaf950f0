"""The Optuna adapter (sweeper/search/optuna/rdb.py: every use of Optuna's private API) against
real storages, sqlite and PostgreSQL: each of its functions, as the coordinator, the leases and
recovery use it.

It runs on the venv's Optuna, and on both ends of pyproject.toml's range
(constraints/optuna-lowest.txt and -newest.txt): ``test_both_ends_of_the_declared_range``
installs each pinned Optuna (pure Python, no dependencies) into ~/.cache/sweeper/optuna-X once and
runs this file again in a subprocess with it first on PYTHONPATH. By hand:

    python -m pip install --no-deps --target ~/.cache/sweeper/optuna-4.6.0 optuna==4.6.0
    PYTHONPATH=~/.cache/sweeper/optuna-4.6.0 python -m pytest tests/test_optuna_adapter.py
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState
from pg import pg_database

from sweeper.search.optuna import rdb

REPO = Path(__file__).resolve().parents[1]
ENDS = {"lowest": REPO / "constraints" / "optuna-lowest.txt", "newest": REPO / "constraints" / "optuna-newest.txt"}
EXPECTED = "SWEEPER_OPTUNA_EXPECTED"  # set by the range test: the Optuna version the subprocess must import
GRACE_S = 60  # the storage's lease: no heartbeat written by a test gets this old while it runs

optuna.logging.set_verbosity(optuna.logging.ERROR)
# heartbeats outside study.optimize are sweeper's way (lease.py), not a mistake here
pytestmark = [
    pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
    pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning"),
]


def test_the_optuna_under_test_is_the_one_asked_for():
    """The range test's subprocess imports the pinned Optuna, not the venv's."""
    if EXPECTED in os.environ:
        assert optuna.__version__ == os.environ[EXPECTED], optuna.__file__


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One database of each kind for the module (Optuna's tables are made once: ~1 s each); each
    test has a study of its own in it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('optuna') / 'optuna.db'}"
        return
    with pg_database("adapter") as made:
        yield made


@pytest.fixture
def study(url: str, request: pytest.FixtureRequest) -> optuna.Study:
    """A study in a real RDB storage with heartbeats (sweeper's leases), as study.py opens it."""
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=GRACE_S)
    return optuna.create_study(study_name=request.node.name, storage=storage, directions=["maximize"])


def waiting(study: optuna.Study, n: int = 1, **user_attrs: object) -> list[FrozenTrial]:
    templates = [
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params={"lr": 0.01 * (i + 1)},
            distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)},
            user_attrs=dict(user_attrs),
            system_attrs={"nsga2:generation": 0},
        )
        for i in range(n)
    ]
    return rdb.create(study, templates)


def test_created_trials_are_waiting_with_their_params_attrs_ids_and_numbers(study: optuna.Study):
    made = waiting(study, 3, sweeper_slot=7)
    assert [t.number for t in made] == [0, 1, 2]
    stored = study.get_trials(deepcopy=False)
    assert [rdb.trial_id(t) for t in made] == [rdb.trial_id(t) for t in stored]
    for t in stored:
        assert t.state == TrialState.WAITING
        assert t.user_attrs == {"sweeper_slot": 7} and t.system_attrs == {"nsga2:generation": 0}
    assert [t.params["lr"] for t in stored] == pytest.approx([0.01, 0.02, 0.03])
    # a live trial made from the id suggests the param it holds
    live = optuna.Trial(study, rdb.trial_id(made[1]))
    assert live.suggest_float("lr", 1e-4, 1.0, log=True) == pytest.approx(0.02)


def test_created_trials_continue_the_numbers_and_keep_optunas_distribution_check(study: optuna.Study):
    waiting(study, 2)
    assert [t.number for t in waiting(study, 2)] == [2, 3]  # after the study's trials
    int_lr = optuna.trial.create_trial(
        state=TrialState.WAITING, params={"lr": 1}, distributions={"lr": optuna.distributions.IntDistribution(1, 5)}
    )
    with pytest.raises(ValueError, match="Cannot set different distribution kind"):
        rdb.create(study, [int_lr])  # lr was a float in the study: as Optuna refuses it
    assert len(study.get_trials(deepcopy=False)) == 4  # and nothing of the refused batch was written


def test_finished_trials_are_created_with_their_values_and_epochs(study: optuna.Study):
    """An earlier sweep's trials, seeded as lessons (search/optuna/earlier.py), as add_trial stores them."""
    lr = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}
    done = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        params={"lr": 0.1},
        distributions=lr,
        value=0.75,
        intermediate_values={1: 0.5, 2: 0.75},
    )
    pruned = optuna.trial.create_trial(
        state=TrialState.PRUNED, params={"lr": 0.2}, distributions=lr, value=float("-inf"), intermediate_values={1: 0.1}
    )
    rdb.create(study, [done, pruned])
    stored = study.get_trials(deepcopy=False)
    assert [(t.state, t.value, t.intermediate_values) for t in stored] == [
        (TrialState.COMPLETE, 0.75, {1: 0.5, 2: 0.75}),
        (TrialState.PRUNED, float("-inf"), {1: 0.1}),
    ]


def test_the_study_id_is_the_storages(study: optuna.Study, url: str):
    storage = optuna.storages.RDBStorage(url)
    assert rdb.study_id(study) == storage.get_study_id_from_name(study.study_name)
    storage.engine.dispose()


def test_a_waiting_trial_is_claimed_once_with_its_attrs_and_first_heartbeat(study: optuna.Study, url: str):
    (t,) = waiting(study)
    tid = rdb.trial_id(t)
    assert rdb.claim(study, tid, {"sweeper_owner": "host:1:a"}, {"sweeper": {"seed": 3}})
    assert not rdb.claim(study, tid, {"sweeper_owner": "host:2:b"}, {})  # another process: too late
    claimed = rdb.stored(study, tid)
    assert claimed.state == TrialState.RUNNING and claimed.datetime_start is not None
    assert claimed.system_attrs["sweeper_owner"] == "host:1:a" and claimed.user_attrs["sweeper"] == {"seed": 3}
    assert rdb.expired(study) == set()  # its heartbeat is fresh
    _age_heartbeat(url, tid)
    assert rdb.expired(study) == {tid}
    rdb.record_heartbeat(study, tid)  # renewed: the lease holds again
    assert rdb.expired(study) == set()


def _age_heartbeat(url: str, trial_id: int) -> None:
    """The trial's heartbeat set twice the grace period into the past (the database's clock), as
    if its process had stopped renewing it long ago: no test waits for a lease to run out."""
    engine = sa.create_engine(url)
    with engine.begin() as db:
        now = db.execute(sa.select(sa.func.now())).scalar_one().replace(tzinfo=None)  # naive, as Optuna's column
        update = sa.text("UPDATE trial_heartbeats SET heartbeat = :old WHERE trial_id = :id")
        db.execute(
            update.bindparams(sa.bindparam("old", type_=sa.DateTime())),
            {"old": now - timedelta(seconds=2 * GRACE_S), "id": trial_id},
        )
    engine.dispose()


def test_beats_write_epochs_and_renew_the_lease_until_the_trial_ends(study: optuna.Study, url: str):
    (t,) = waiting(study)
    tid = rdb.trial_id(t)
    assert rdb.claim(study, tid, {}, {})
    rdb.beat(study, tid, {1: 0.5, 2: 0.6}, renew=False)
    rdb.beat(study, tid, {2: 0.65, 3: float("nan")}, renew=False)  # replaced and added
    values = rdb.stored(study, tid).intermediate_values
    assert values[1] == 0.5 and values[2] == 0.65 and math.isnan(values[3])
    _age_heartbeat(url, tid)
    rdb.beat(study, tid, {}, renew=False)
    assert rdb.expired(study) == {tid}
    rdb.beat(study, tid, {}, renew=True)
    assert rdb.expired(study) == set()
    rdb.finish(study, tid, TrialState.COMPLETE, [0.7], {}, {})
    rdb.beat(study, tid, {4: 0.9})  # after its end: nothing
    assert 4 not in rdb.stored(study, tid).intermediate_values


def test_a_finish_writes_epochs_attrs_state_and_values_once(study: optuna.Study):
    first, second = waiting(study, 2)
    for t in (first, second):
        assert rdb.claim(study, rdb.trial_id(t), {}, {})
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING] * 2  # the study's cache holds them
    done = rdb.finish(study, rdb.trial_id(first), TrialState.COMPLETE, [0.8], {1: 0.4, 2: 0.8}, {"sweeper": {"a": 1}})
    assert done.state == TrialState.COMPLETE and done.values == [0.8] and done.datetime_complete is not None
    assert done.intermediate_values == {1: 0.4, 2: 0.8} and done.user_attrs["sweeper"] == {"a": 1}
    assert study.get_trials()[0].state == TrialState.COMPLETE  # the study's cache was cleared
    with pytest.raises(UpdateFinishedTrialError):  # another process finished it first
        rdb.finish(study, rdb.trial_id(first), TrialState.FAIL, None, {}, {})
    with pytest.raises(ValueError):  # as study.tell: a complete trial needs its values
        rdb.finish(study, rdb.trial_id(second), TrialState.COMPLETE, None, {}, {})
    pruned = rdb.finish(study, rdb.trial_id(second), TrialState.PRUNED, None, {1: 0.1, 2: 0.2}, {})
    assert pruned.state == TrialState.PRUNED and pruned.values == [0.2]  # its last epoch's, as study.tell
    assert study.best_trial.number == 0


def test_a_stale_trial_is_failed_once(study: optuna.Study):
    (t,) = waiting(study)
    tid = rdb.trial_id(t)
    assert rdb.claim(study, tid, {}, {})
    assert rdb.fail(study, tid)
    assert rdb.stored(study, tid).state == TrialState.FAIL
    assert not rdb.fail(study, tid)  # failed already (by another process)


def test_a_trial_created_running_is_claimed_at_birth(study: optuna.Study, url: str):
    """reproducible: false's trials (proposer.py): made RUNNING with their owner and a first
    heartbeat in one transaction, so no other process claims them before their maker."""
    template = optuna.trial.create_trial(
        state=TrialState.RUNNING,
        params={"lr": 0.1},
        distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)},
        user_attrs={"sweeper_slot": 0},
        system_attrs={"sweeper_owner": "host:1:a"},
    )
    (made,) = rdb.create(study, [template])
    tid = rdb.trial_id(made)
    assert rdb.stored(study, tid).state == TrialState.RUNNING and rdb.stored(study, tid).datetime_start is not None
    assert rdb.running(study, "sweeper_owner") == [(tid, "host:1:a")] and rdb.waiting(study) == []
    assert not rdb.claim(study, tid, {"sweeper_owner": "host:2:b"}, {})
    engine = sa.create_engine(url)
    with engine.connect() as db:
        beats = db.execute(sa.text("SELECT count(*) FROM trial_heartbeats WHERE trial_id = :t"), {"t": tid}).scalar()
    engine.dispose()
    assert beats == 1  # its lease runs from its birth: a process that dies holding it is recovered


def test_light_reads_of_waiting_running_and_finished_trials(study: optuna.Study):
    """The reads that replace Optuna's cache where it would read every running trial again
    (finished.py, lease.py, the proposer): ids and states, owners, then only the trials asked for."""
    made = waiting(study, 5, sweeper_slot=1)
    ids = [rdb.trial_id(t) for t in made]
    assert [rdb.trial_id(t) for t in rdb.waiting(study)] == ids and rdb.waiting(study)[0].params["lr"] == 0.01
    for tid in ids[:4]:
        assert rdb.claim(study, tid, {}, {})
    rdb.set_system_attr(study, ids[1], "sweeper_owner", "host:1:a")
    assert sorted(rdb.running(study, "sweeper_owner")) == [
        (ids[0], None),
        (ids[1], "host:1:a"),
        (ids[2], None),
        (ids[3], None),
    ]
    rdb.finish(study, ids[1], TrialState.COMPLETE, [0.8], {1: 0.8}, {})
    rdb.finish(study, ids[3], TrialState.PRUNED, None, {1: 0.1}, {})
    assert [rdb.trial_id(t) for t in rdb.waiting(study)] == [ids[4]]
    assert sorted(rdb.unfinished(study, "sweeper_slot")) == [(ids[0], 1), (ids[2], 1), (ids[4], 1)]
    assert rdb.states_after(study, -1) == [
        (ids[0], False),
        (ids[1], True),
        (ids[2], False),
        (ids[3], True),
        (ids[4], False),
    ]
    assert rdb.states_after(study, ids[2]) == [(ids[3], True), (ids[4], False)]
    done = rdb.finished_trials(study, {ids[1]})  # and any finished above it: trial 3
    assert [(rdb.trial_id(t), t.state, t.intermediate_values) for t in done] == [
        (ids[1], TrialState.COMPLETE, {1: 0.8}),
        (ids[3], TrialState.PRUNED, {1: 0.1}),
    ]
    assert [rdb.trial_id(t) for t in rdb.whole(study, {ids[0], ids[2]})] == [ids[0], ids[2]]
    assert rdb.whole(study, set()) == [] and rdb.finished_trials(study, set()) == []
    # the trials a study held before it had a ledger, less those lost (store.py): one light read
    assert rdb.count_without(study, "sweeper_interrupted") == 5
    rdb.set_system_attr(study, ids[0], "sweeper_interrupted", "its process died")
    assert rdb.count_without(study, "sweeper_interrupted") == 4


def test_attrs_of_live_and_lost_trials(study: optuna.Study):
    """study.ask's trials (reproducible: false): their lease taken, their system attrs read and
    carried (an Optuna 5 Trial has none), a lost trial's attrs written by another process."""
    trial = study.ask()
    tid = rdb.trial_id(trial)
    rdb.set_system_attr(study, tid, "sweeper_owner", "host:1:a")
    rdb.record_heartbeat(study, tid)
    assert rdb.system_attrs(trial) == {"sweeper_owner": "host:1:a"}
    rdb.set_user_attr(study, tid, "sweeper", {"reason": "lost"})
    assert rdb.stored(study, tid).user_attrs == {"sweeper": {"reason": "lost"}}
    assert rdb.expired(study) == set()
    # an in-memory study (a shadow in a view of earlier batches) works the same
    view = optuna.create_study(direction="maximize")
    shadow = view.ask()
    rdb.set_system_attr(view, rdb.trial_id(shadow), "rung", 1)
    assert rdb.system_attrs(shadow) == {"rung": 1} and rdb.stored(view, rdb.trial_id(shadow)).number == 0
    assert rdb.fail(study, tid)
    with pytest.raises(UpdateFinishedTrialError):
        rdb.set_system_attr(study, tid, "sweeper_interrupted", "late")


def test_a_view_shares_finished_trials_as_add_trials_would_copy_them():
    """add_shared (batches.py, finished.py): the view holds the trials as ``add_trials`` makes
    them (numbers, ids, states, values, epochs, the best trial), sharing their contents instead of
    deep-copying each; the view's own new trials leave the shared trials as they were (and a
    finished trial takes no writes)."""
    source = optuna.create_study(direction="maximize")
    for i, value in enumerate([0.2, 0.9, 0.5]):
        source.enqueue_trial({"lr": 0.01 * (i + 1)})
        trial = source.ask()
        trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        trial.report(value / 2, 1)
        source.tell(trial, value if i != 2 else None, state=TrialState.PRUNED if i == 2 else None)
    trials = source.get_trials(deepcopy=False)
    copied, shared = optuna.create_study(direction="maximize"), optuna.create_study(direction="maximize")
    copied.add_trials(trials)
    rdb.add_shared(shared, trials)
    seen = [(t.number, rdb.trial_id(t), t.state, t.values, t.params, t.intermediate_values) for t in shared.trials]
    assert seen == [
        (t.number, rdb.trial_id(t), t.state, t.values, t.params, t.intermediate_values) for t in copied.trials
    ]
    assert shared.best_trial.number == copied.best_trial.number == 1
    assert shared.get_trials(deepcopy=False)[0].params is trials[0].params  # shared, not copied
    shadow = shared.ask()  # the view's own trial: written, finished, never shared
    shadow.suggest_float("lr", 1e-3, 1e-1, log=True)
    shadow.report(0.95, 1)
    shared.tell(shadow, 0.95)
    with pytest.raises(UpdateFinishedTrialError):  # a finished trial takes no writes
        rdb.set_user_attr(shared, rdb.trial_id(shared.trials[0]), "seen", True)
    assert [(t.number, t.values, t.user_attrs) for t in source.trials] == [
        (0, [0.2], {}),
        (1, [0.9], {}),
        (2, [0.25], {}),  # pruned: its last epoch value, as Optuna tells it
    ]
    assert shared.best_trial.number == 3 and source.best_trial.number == 1


# --- both ends of the declared range -------------------------------------------------------------


def pinned(end: str) -> str:
    """The Optuna version a constraints file pins (optuna==X)."""
    found = re.search(r"^optuna==(\S+)$", ENDS[end].read_text(), re.MULTILINE)
    assert found, f"{ENDS[end]} pins no optuna==X"
    return found.group(1)


def test_the_constraints_are_the_ends_of_pyprojects_range():
    declared = next(
        d
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("optuna")
    )
    floor, ceiling = re.fullmatch(r"optuna>=([\d.]+),<([\d.]+)", declared.replace(" ", "")).groups()
    parts = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert parts(pinned("lowest"))[: len(parts(floor))] == parts(floor), (declared, pinned("lowest"))
    assert parts(pinned("newest")) < parts(ceiling), (declared, pinned("newest"))


def installed(version: str) -> Path:
    """Optuna ``version`` (pure Python; its dependencies are the venv's) in ~/.cache/sweeper, once."""
    target = Path.home() / ".cache" / "sweeper" / f"optuna-{version}"
    if not (target / "optuna" / "version.py").exists():
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        pip = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(partial),
            f"optuna=={version}",
        ]
        done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(pip)} failed:\n{done.stdout}{done.stderr}"
        try:
            partial.rename(target)  # whole or absent: a concurrent install of the same version wins
        except OSError:
            subprocess.run(["rm", "-rf", str(partial)], check=False)
    return target


@pytest.mark.skipif(EXPECTED in os.environ, reason="inside the range test's own subprocess")
@pytest.mark.parametrize("end", sorted(ENDS))
def test_both_ends_of_the_declared_range(end: str):
    version = pinned(end)
    if version == optuna.__version__:  # the venv's Optuna: the tests above, in this process, are that end's run
        pytest.skip(f"optuna {version} ({end} end) is the venv's: this file's own tests ran on it")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(installed(version)), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        EXPECTED: version,
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--noconftest",  # none of its fixtures is needed, and its collection hook imports torch (seconds)
            str(Path(__file__)),
            "-k",
            "not declared_range",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (
        f"the adapter's tests on optuna {version} ({end} end):\n{done.stdout[-6000:]}{done.stderr[-3000:]}"
    )
