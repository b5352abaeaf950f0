"""One pool, many sweeps (issue #31): `sweeper submit --queue`, `sweeper queue`, `cancel`,
`priority`, `share` and `sweeper worker --queue` on a real PostgreSQL server (tests/pg.py), with
real worker processes, killed with real SIGKILLs. Tests synchronise on events (the gate plugin's
files, rows in the database), never on how fast trials run. The policy's rules are checked on
their own first (policy.choose is a function of the queue's rows)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import sweeper, wait_for, write_spec
from pg import pg_url  # noqa: F401 (a fixture: a fresh database per test)
from test_distributed import finish, gated, reference, start, trials  # noqa: F401 (reference: a fixture)

from sweeper.queue.policy import HALF_LIFE_S, Pool, ahead_by, choose
from sweeper.queue.table import Entry, Offer

CPU = Offer("cpu", 16.0)


def entry(name: str, owner: str = "alice", priority: int = 0, state: str = "queued", **kw) -> Entry:
    values = dict(spec={}, device="any", min_memory_gb=0.0, submitted_at=float(len(name)), started_at=None)
    values.update(ended_at=None, finisher=None, note=None)
    values.update(kw)
    return Entry(name=name, owner=owner, priority=priority, state=state, **values)


def test_the_policy_puts_priority_first_then_fair_share_then_the_order_submitted():
    a, b, c = entry("a", "alice"), entry("bb", "bob"), entry("ccc", "bob", priority=1)
    assert choose(Pool([a, b, c], {}, {}), CPU, "me").name == "ccc"  # priority first
    # equal priorities: the owner that used less device time, whatever the order submitted
    assert choose(Pool([a, b], {"a": 30.0, "bb": 10.0}, {}), CPU, "me").name == "bb"
    # ... per unit of weight: alice may use twice bob's time
    assert choose(Pool([a, b], {"a": 30.0, "bb": 20.0}, {"alice": {"weight": 2}}), CPU, "me").name == "a"
    # equal use: the owner fewer workers serve now, then the sweep submitted first
    assert choose(Pool([a, b], {}, {}, {"w1": "a"}), CPU, "me").name == "bb"
    assert choose(Pool([a, b], {}, {}), CPU, "me").name == "a"
    # only open sweeps are served; an ended sweep's device time still counts for its owner, halved
    # every HALF_LIFE_S since it ended (a day): just ended, bob is ahead; 10 half-lives on, not
    done = entry("d", "bob", state="finished", ended_at=1000.0)
    spent = {"a": 5.0, "d": 100.0}
    assert choose(Pool([a, b, done], spent, {}, now=1000.0), CPU, "me").name == "a"
    assert choose(Pool([a, b, done], spent, {}, now=1000.0 + 10 * HALF_LIFE_S), CPU, "me").name == "bb"
    assert choose(Pool([done], {}, {}), CPU, "me") is None
    assert choose(Pool([a, b], {}, {}), CPU, "me", resting={"a"}).name == "bb"
    # the gap a worker weighs before it leaves one owner's sweep for another's (per unit of weight)
    assert ahead_by(Pool([a, b], {"a": 30.0, "bb": 10.0}, {}), "alice", "bob") == 20.0
    assert ahead_by(Pool([a, b], {"a": 30.0, "bb": 10.0}, {"alice": {"weight": 3}}), "alice", "bob") == 0.0
    # a trial another worker trains for an owner now counts, as that worker's last trial cost: bob
    # used less, but with w1's running trial (20 s) he has more than alice
    running = Pool([a, b], {"a": 30.0, "bb": 20.0}, {}, {"w1": "bb"}, units={"w1": 20.0})
    assert choose(running, CPU, "me").name == "a" and ahead_by(running, "bob", "alice", "me") == 10.0
    assert ahead_by(running, "bob", "alice", "w1") == -10.0  # w1's own trial: not running while it decides


def test_a_sweep_whose_batches_have_no_room_left_comes_after_the_owners_next_one():
    """Within an owner, a reproducible sweep served by as many workers as its batches in flight
    hold (batch_size x (staleness + 1)) comes after the owner's next sweep: a worker joining it
    would find nothing to claim. Without a known bound (free mode), the order submitted."""
    batches = {"search": {"reproducible": True, "batch_size": 2, "staleness": 0}}
    a, b = entry("a", spec=batches), entry("bb", spec=batches)
    assert choose(Pool([a, b], {}, {}, {"w1": "a"}), CPU, "me").name == "a"  # room for one more
    assert choose(Pool([a, b], {}, {}, {"w1": "a", "w2": "a"}), CPU, "me").name == "bb"
    assert choose(Pool([a, b], {}, {}, {"w1": "a", "w2": "a", "w3": "bb", "w4": "bb"}), CPU, "me").name == "a"
    stale = {"search": {**batches["search"], "staleness": 1}}  # two batches in flight: room for 4
    a = entry("a", spec=stale)
    assert choose(Pool([a, b], {}, {}, {"w1": "a", "w2": "a"}), CPU, "me").name == "a"
    free = {"search": {"reproducible": False, "batch_size": 2}}
    a = entry("a", spec=free)
    assert choose(Pool([a, b], {}, {}, {"w1": "a", "w2": "a", "w3": "a"}), CPU, "me").name == "a"
    # the owner first: bob's sweep, with room or not, after alice's while bob has more workers
    c = entry("ccc", "bob", spec=batches)
    assert choose(Pool([a, b, c], {}, {}, {"w1": "ccc"}), CPU, "me").owner == "alice"


def test_the_policy_keeps_quotas_and_device_requirements():
    a, b = entry("a", "alice", priority=5), entry("bb", "bob")
    owners = {"alice": {"weight": 1, "max_devices": 1}}
    # alice's one device is in use by another worker: bob's sweep, though of lower priority
    assert choose(Pool([a, b], {}, owners, {"w1": "a"}), CPU, "me").name == "bb"
    # this worker's own device is not counted against the quota: it may go on serving alice
    assert choose(Pool([a, b], {}, owners, {"me": "a"}), CPU, "me").name == "a"
    big = entry("big", "bob", priority=9, min_memory_gb=64)
    gpu = entry("gpu", "bob", priority=8, device="cuda")
    assert choose(Pool([big, gpu, b], {}, {}), CPU, "me").name == "bb"
    assert choose(Pool([big, gpu, b], {}, {}), Offer("cpu", 64.0), "me").name == "big"
    assert choose(Pool([gpu, b], {}, {}), Offer("cuda", 80.0), "me").name == "gpu"


def smoke(workdir: Path, name: str, **search: object) -> Path:
    base = {"sampler": "random", "pruner": {"type": "none"}, "n_trials": 4, "batch_size": 4}
    return write_spec(
        workdir / f"{name}.yaml",
        name=name,
        tracking={"enabled": False},
        search={**base, "space": {"optimizer.args.lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}}}
        | search,
    )


def queue_rows(url: str) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(sweeper("queue", url, "--json", check=True).stdout)}


def test_priority_first_and_each_sweep_summarised_and_exported_once(workdir: Path, pg_url: str):
    low = sweeper("submit", str(smoke(workdir, "low")), "--queue", pg_url, "--owner", "alice", check=True)
    assert "queued sweep 'low' (owner alice, priority 0" in low.stdout
    sweeper("submit", str(smoke(workdir, "high")), "--queue", pg_url, "--owner", "bob", "--priority", "5", check=True)
    rows = queue_rows(pg_url)
    assert [rows["low"]["state"], rows["high"]["state"], rows["high"]["priority"]] == ["queued", "queued", 5]
    # a name taken, a spec with an error: exit 2, nothing queued
    again = sweeper("submit", str(smoke(workdir, "low")), "--queue", pg_url)
    assert again.returncode == 2 and "holds a sweep named 'low' already" in again.stderr
    bad = sweeper("submit", str(smoke(workdir, "bad")), "model.plugin=nope", "--queue", pg_url)
    assert bad.returncode == 2 and "nope" in bad.stderr and "bad" not in queue_rows(pg_url)

    workers = [start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log=f"w{i}") for i in (1, 2)]
    for i, w in enumerate(workers, 1):
        finish(w, workdir, f"w{i}")
    high, low_trials = trials(pg_url, "high"), trials(pg_url, "low")
    # every trial of the high-priority sweep was claimed before any of the other's
    assert max(t.datetime_start for t in high) <= min(t.datetime_start for t in low_trials)
    logs = (workdir / "w1.log").read_text() + (workdir / "w2.log").read_text()
    rows = queue_rows(pg_url)
    for name in ("low", "high"):
        assert logs.count(f"finishing sweep '{name}'") == 1  # one worker summarised and exported it
        assert rows[name]["state"] == "finished" and rows[name]["trials_done"] == 4
        summary = json.loads(Path(rows[name]["note"]).read_text())
        assert len(summary["trials"]) == 4 and "error" not in summary["export"]["formats"][0]


def _dead(pid: int) -> bool:
    """Whether process ``pid`` is gone (or a zombie nobody reaped: a container's init may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_worker_trains_on_while_its_ended_sweep_is_summarised_and_dies_with_it(
    workdir: Path, site: Path, pg_url: str
):
    from conftest import install_test_plugin

    install_test_plugin(site, "sweeper_test_held", {"sweeper.datasets": {"held": "sweeper_test_held:held"}})
    held = workdir / "held"
    first = write_spec(
        workdir / "first.yaml",
        name="first",
        tracking={"enabled": False},
        dataset={"plugin": "held", "args": {"folder": str(held)}},
        search={"sampler": "random", "pruner": {"type": "none"}, "n_trials": 1, "batch_size": 1},
    )
    sweeper("submit", str(first), "--queue", pg_url, "--priority", "1", check=True)
    sweeper("submit", str(smoke(workdir, "next", n_trials=2, batch_size=2)), "--queue", pg_url, check=True)
    w = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="w")
    # the first sweep's one trial ended: its summary's process holds at its data set, and the
    # worker trains the other sweep's trials meanwhile
    wait_for(lambda: (held / "blocked").exists(), w, what="the first sweep's summary holding")
    done = lambda: [t.state.name for t in trials(pg_url, "next")] == ["COMPLETE", "COMPLETE"]  # noqa: E731
    wait_for(done, w, what="the next sweep's trials, trained while the first is summarised")
    assert queue_rows(pg_url)["first"]["state"] == "finishing"
    # the worker killed: its summarising process dies with it (a successor finishes the sweep
    # once, after the worker's heartbeat is LIVE_S old), and writes nothing
    summarising = int((held / "blocked").read_text())
    assert summarising != w.pid
    os.kill(w.pid, signal.SIGKILL)
    w.wait()
    wait_for(lambda: _dead(summarising), what="the summarising process dying with its worker")
    assert not (workdir / "runs" / "first" / "summary.json").exists()
    assert queue_rows(pg_url)["first"]["state"] == "finishing"


def test_two_owners_share_one_worker_fairly(workdir: Path, pg_url: str):
    for name, owner in (("a", "alice"), ("b", "bob")):
        spec = smoke(workdir, name, n_trials=6, batch_size=2)
        sweeper("submit", str(spec), "--queue", pg_url, "--owner", owner, check=True)
    finish(start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="w"), workdir, "w")
    order = sorted((t.datetime_start, name) for name in "ab" for t in trials(pg_url, name))
    owners = [name for _, name in order]
    # first in, first out would run all of alice's 6 trials first (a gap of 6). Fair share leaves an
    # owner once it is ahead by more than half a batch's device time, so after alice's first batch
    # of 2 the worker always turns to bob. It evens device time, not trial counts: under load, bob's
    # 2 trials may cost as much as alice's 4 (seen in a loaded run), and the gap in trials reaches 4.
    gap = max(abs(owners[:k].count("a") - owners[:k].count("b")) for k in range(1, len(owners) + 1))
    assert owners[:3].count("b") >= 1 and gap <= 4, owners
    assert queue_rows(pg_url)["b"]["state"] == "finished"


def test_cancel_stops_new_claims_and_lets_the_running_trial_finish(workdir: Path, gate: Path, pg_url: str):
    spec = gated(workdir, gate, None)
    sweeper("submit", str(spec), "--queue", pg_url, check=True)
    w = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="w")
    wait_for(lambda: (gate / "blocked").exists(), w, what="trial 0 at its gate")
    assert "it was running" in sweeper("cancel", pg_url, "smoke", check=True).stdout
    assert queue_rows(pg_url)["smoke"]["state"] == "cancelled"
    (gate / "release").touch()
    finish(w, workdir, "w")
    assert [t.state.name for t in trials(pg_url)] == ["COMPLETE", "WAITING", "WAITING", "WAITING"]
    assert queue_rows(pg_url)["smoke"]["state"] == "cancelled"  # never summarised: nobody finished it
    again = sweeper("cancel", pg_url, "smoke")
    assert again.returncode == 2 and "cancelled: nothing to cancel" in again.stderr


def test_a_sweep_needing_more_memory_waits_for_a_worker_offering_it(workdir: Path, pg_url: str):
    sweeper("submit", str(smoke(workdir, "big")), "--queue", pg_url, "--min-memory-gb", "64", check=True)
    sweeper("submit", str(smoke(workdir, "small")), "--queue", pg_url, "--priority", "-1", check=True)
    small = start(workdir, "worker", "--queue", pg_url, "--drain", "--memory-gb", "8", "--out", "runs", log="s")
    finish(small, workdir, "s")  # served what it could, then left: the big sweep is not for it
    rows = queue_rows(pg_url)
    assert rows["small"]["state"] == "finished" and rows["big"]["state"] == "queued"
    assert rows["big"]["trials_done"] == 0 and rows["big"]["device"] == "cpu >= 64 GB"
    big = start(workdir, "worker", "--queue", pg_url, "--drain", "--memory-gb", "64", "--out", "runs", log="b")
    finish(big, workdir, "b")
    assert queue_rows(pg_url)["big"]["state"] == "finished"


def test_an_owners_quota_of_one_device_keeps_its_trials_apart(workdir: Path, gate: Path, pg_url: str):
    """Two workers up at once, alice allowed one device: worker a holds her trial 0 at its gate
    while b joins; a then leaves (SIGTERM, the trial released at its epoch's end) and b trains
    the rest. Both took part, and no two of her trials ever ran at the same time."""
    from sweeper.queue.table import LIVE_S, Queue
    from sweeper.search.optuna.study import OWNER

    assert "at most 1 device(s)" in sweeper("share", pg_url, "alice", "--max-devices", "1", check=True).stdout
    spec = gated(workdir, gate, None, sampler="random", pruner={"type": "none"})
    sweeper("submit", str(spec), "--queue", pg_url, "--owner", "alice", check=True)
    a = start(workdir, "worker", "--queue", pg_url, "--out", "runs", log="a")  # no --drain: serves until stopped
    wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 (alice's one device)")
    b = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="b")
    queue = Queue(pg_url)
    try:
        wait_for(lambda: len(queue.workers(LIVE_S)) == 2, b, what="worker b in the queue beside worker a")
    finally:
        queue.close()
    a.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping (SIGTERM)" in (workdir / "a.log").read_text(), a, what="worker a stopping")
    (gate / "release").touch()
    finish(a, workdir, "a")
    finish(b, workdir, "b")
    done = trials(pg_url)
    spans = sorted((t.datetime_start, t.datetime_complete) for t in done)
    assert len(spans) == 5 and all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # one at a time
    pids = [int(t.system_attrs[OWNER].split(":")[1]) for t in done]  # the member holding each: host:pid:tag
    assert pids[0] == a.pid and set(pids[1:]) == {b.pid}, pids  # both took part: trial 0 preempted, then b


def test_a_killed_worker_loses_nothing(workdir: Path, gate: Path, pg_url: str):
    spec = gated(workdir, gate, None, heartbeat_s=1, lease_s=3)
    sweeper("submit", str(spec), "--queue", pg_url, check=True)
    # another "machine": only its lease can tell that it stopped
    a = start(workdir, "worker", "--queue", pg_url, "--out", "a", env={"SWEEPER_HOST": "machine-a"}, log="a")
    wait_for(lambda: (gate / "blocked").exists(), a, what="worker a holding trial 0 at its gate")
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    b = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "b", log="b")  # the gate blocks once
    finish(b, workdir, "b")
    states = [t.state.name for t in trials(pg_url)]
    assert states[0] == "FAIL" and len(states) == 5 and set(states[1:]) <= {"COMPLETE", "PRUNED"}
    assert trials(pg_url)[4].user_attrs["sweeper_retry_of"] == 0
    summary = json.loads((workdir / "b" / "smoke" / "summary.json").read_text())
    assert "machine-a" in summary["trials"][0]["reason"] and queue_rows(pg_url)["smoke"]["state"] == "finished"


@pytest.mark.parametrize("args", [["queue"], ["cancel", "x"], ["priority", "x", "1"]])
def test_a_queue_that_cannot_be_opened_exits_2(args: list[str]):
    done = sweeper(args[0], "postgresql+psycopg://nobody@127.0.0.1:1/none", *args[1:])
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_a_preempted_trial_resumes_from_its_epoch_bitwise(workdir: Path, gate: Path, pg_url: str):
    import shutil

    from conftest import TIMING

    one = {"n_trials": 1, "batch_size": 1}
    # the uninterrupted trial: one process, its gate open from the start
    gate.mkdir()
    (gate / "release").touch()
    sweeper("run", str(gated(workdir, gate, None, **one)), "--out", "reference", "-q", check=True)
    reference = json.loads((workdir / "reference" / "summary.json").read_text())["trials"][0]
    shutil.rmtree(gate)  # the gate blocks again, once

    sweeper("submit", str(gated(workdir, gate, None, **one)), "--queue", pg_url, check=True)
    w = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="w")
    wait_for(lambda: (gate / "blocked").exists(), w, what="trial 0 at its gate (epoch 2)")
    sweeper("submit", str(smoke(workdir, "urgent", n_trials=1, batch_size=1)), "--queue", pg_url, "--priority", "5")
    (gate / "release").touch()  # epoch 2 ends: the worker stops the trial there for the urgent sweep
    finish(w, workdir, "w")
    first, retry = trials(pg_url)
    urgent = trials(pg_url, "urgent")[0]
    assert first.state.name == "FAIL" and retry.state.name == "COMPLETE"
    assert first.datetime_complete <= urgent.datetime_start <= urgent.datetime_complete <= retry.datetime_start
    assert retry.user_attrs["sweeper_retry_of"] == 0 and retry.user_attrs["sweeper_preemptions"] == 1
    summary = json.loads((workdir / "runs" / "smoke" / "summary.json").read_text())
    stopped, resumed = summary["trials"]
    assert stopped["reason"].startswith("interrupted: preempted after epoch 2 for sweep 'urgent' (priority 5); retried")
    assert len(stopped["history"]) == 2 and resumed["seed"] == reference["seed"]

    def bits(history: list[dict]) -> list[dict]:
        return [{k: v for k, v in h.items() if k not in TIMING} for h in history]

    # epochs 1-2 from the saved state, epoch 3 trained after the urgent sweep: the uninterrupted trial's
    assert bits(resumed["history"]) == bits(reference["history"]) and len(reference["history"]) == 3


def test_a_worker_stopped_with_sigterm_releases_its_trial_at_the_epoch_end(workdir: Path, gate: Path, pg_url: str):
    from sweeper.queue.table import LIVE_S, Queue

    sweeper("submit", str(gated(workdir, gate, None, n_trials=1, batch_size=1)), "--queue", pg_url, check=True)
    a = start(workdir, "worker", "--queue", pg_url, "--out", "runs", log="a")  # no --drain: serves until stopped
    wait_for(lambda: (gate / "blocked").exists(), a, what="trial 0 at its gate (epoch 2)")
    a.send_signal(signal.SIGTERM)  # as `docker compose stop` or a deleted pod does
    wait_for(lambda: "stopping (SIGTERM)" in (workdir / "a.log").read_text(), a, what="worker a stopping")
    (gate / "release").touch()  # epoch 2 ends: the trial stops there, its state saved, released
    finish(a, workdir, "a")
    assert "worker done: stopped on SIGTERM" in (workdir / "a.log").read_text()
    first, retry = trials(pg_url)
    # released at once (no lease to run out), not counted as a lost attempt, to continue from its state
    assert first.state.name == "FAIL" and retry.state.name == "WAITING"
    assert retry.user_attrs["sweeper_preemptions"] == 1 and Path(retry.user_attrs["sweeper_resume"]).exists()
    queue = Queue(pg_url)
    try:
        assert queue.workers(LIVE_S) == []  # its row and its device seat gone with it
    finally:
        queue.close()

    b = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="b")
    finish(b, workdir, "b")
    stopped, resumed = json.loads((workdir / "runs" / "smoke" / "summary.json").read_text())["trials"]
    assert stopped["reason"].startswith("interrupted: preempted after epoch 2 for worker ")
    assert "stopping (SIGTERM); retried" in stopped["reason"]
    assert len(stopped["history"]) == 2 and len(resumed["history"]) == 3 and resumed["state"] == "complete"
    assert queue_rows(pg_url)["smoke"]["state"] == "finished"


def test_database_roles_let_a_submitter_change_only_its_own_sweeps(
    workdir: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
):
    import uuid

    import psycopg
    from pg import _admin
    from sqlalchemy.engine import make_url

    tag = uuid.uuid4().hex[:8]
    role = {who: f"sweeper_{who}_{tag}" for who in ("pool", "ana", "bo")}
    with _admin() as conn:  # roles are the server's, not the database's: unique names, dropped below
        for name in role.values():
            conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw-{tag}'")

    monkeypatch.setenv("PGPASSWORD", f"pw-{tag}")  # never in a URL: sweeper refuses a spec that records one

    def url(who: str) -> str:
        return make_url(pg_url).set(username=role[who], password=None).render_as_string(hide_password=False)

    try:
        setup = sweeper(
            "queue-access", pg_url, "--workers", role["pool"], "--submitters", f"{role['ana']},{role['bo']}"
        )
        assert setup.returncode == 0 and "ENABLE ROW LEVEL SECURITY" in setup.stdout, setup.stderr
        sweeper("submit", str(smoke(workdir, "a")), "--queue", url("ana"), "--owner", role["ana"], check=True)
        b = smoke(workdir, "b", n_trials=2, batch_size=2)
        sweeper("submit", str(b), "--queue", url("bo"), "--owner", role["bo"], check=True)
        # bo may neither cancel nor reprioritise ana's sweep, nor queue one in her name
        for args in (["cancel", url("bo"), "a"], ["priority", url("bo"), "a", "9"]):
            refused = sweeper(*args)
            assert refused.returncode == 2 and f"belongs to {role['ana']}" in refused.stderr, refused.stderr
        forged = sweeper("submit", str(smoke(workdir, "c")), "--queue", url("bo"), "--owner", role["ana"])
        assert forged.returncode == 2 and f"--owner {role['bo']}" in forged.stderr, forged.stderr
        assert "it was queued" in sweeper("cancel", url("ana"), "a", check=True).stdout
        # the workers' role serves every sweep: bo's
        finish(start(workdir, "worker", "--queue", url("pool"), "--drain", "--out", "runs", log="w"), workdir, "w")
        rows = queue_rows(pg_url)
        assert [rows["a"]["state"], rows["b"]["state"], rows["a"]["priority"]] == ["cancelled", "finished", 0]
        assert "c" not in rows
    finally:
        target = make_url(pg_url)
        with psycopg.connect(
            host=target.host, port=target.port, user=target.username, password=target.password,
            dbname=target.database, autocommit=True,
        ) as conn:  # fmt: skip
            for name in role.values():
                conn.execute(f"DROP OWNED BY {name}")  # its grants in this database
        with _admin() as conn:
            for name in role.values():
                conn.execute(f"DROP ROLE IF EXISTS {name}")


def test_the_policy_counts_the_devices_of_trials_on_several():
    # a sweep of train.devices 2: each of its trials holds 2 GPUs
    wide, narrow = entry("wide", "alice", devices=2), entry("nn", "alice")
    one_gpu, two_gpus = Offer("cuda", 80.0), Offer("cuda", 80.0, devices=2)
    assert choose(Pool([wide], {}, {}), one_gpu, "me") is None
    assert choose(Pool([wide], {}, {}), two_gpus, "me").name == "wide"
    assert choose(Pool([wide], {}, {}), CPU, "me").name == "wide"  # gloo ranks share a CPU worker's cores
    # alice's quota of 3 devices: 2 held by another worker's trial of `wide`, so 1 left
    owners = {"alice": {"weight": 1, "max_devices": 3}}
    assert choose(Pool([wide, narrow], {}, owners, {"w1": "wide"}), two_gpus, "me").name == "nn"
    assert choose(Pool([wide], {}, owners, {"w1": "wide"}), two_gpus, "me") is None


def test_a_queue_made_before_device_counts_gains_them(tmp_path: Path):
    import sqlalchemy as sa

    from sweeper.queue.table import Queue

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as db:  # the tables as the first release of the queue made them
        db.execute(
            sa.text(
                "CREATE TABLE sweeper_queue (name VARCHAR(512) PRIMARY KEY, owner VARCHAR(128) NOT NULL, "
                "priority INTEGER NOT NULL, state VARCHAR(16) NOT NULL, spec TEXT NOT NULL, device VARCHAR(8) "
                "NOT NULL, min_memory_gb FLOAT NOT NULL, submitted_at FLOAT NOT NULL, started_at FLOAT, "
                "ended_at FLOAT, finisher VARCHAR(128), note TEXT)"
            )
        )
        db.execute(
            sa.text(
                "CREATE TABLE sweeper_queue_workers (worker VARCHAR(128) PRIMARY KEY, device VARCHAR(8) NOT NULL, "
                "memory_gb FLOAT NOT NULL, serving VARCHAR(512), started_at FLOAT NOT NULL, seen_at FLOAT NOT NULL, "
                "left_at FLOAT)"
            )
        )
        db.execute(
            sa.text(
                "INSERT INTO sweeper_queue VALUES "
                "('old', 'ana', 0, 'queued', '{}', 'any', 0, 1, NULL, NULL, NULL, NULL)"
            )
        )
    engine.dispose()
    queue = Queue(url)
    try:
        assert [(e.name, e.devices) for e in queue.entries()] == [("old", 1)]
        queue.join("w", Offer("cuda", 80.0, devices=4))
        assert [(w["worker"], w["devices"]) for w in queue.workers(60)] == [("w", 4)]
    finally:
        queue.close()


def test_two_drain_workers_ride_out_two_database_restarts(workdir: Path, gate: Path, reference: dict):
    """Issue #56 item 4, as an operator saw it: two sweeps in the queue, two `sweeper worker
    --queue --drain`, and the server stopped while one worker trains (held at its gate), then
    restarted while both train. No worker exits early or prints a traceback, each sweep is
    summarised once with every trial, and the gated sweep's table is one process's. The cluster
    is the test's own (tests/pg.py), never the machine's shared server."""
    from pg import own_cluster
    from test_distributed import table

    with own_cluster() as cluster:
        gated_spec = gated(workdir, gate, None, n_trials=8)
        sweeper("submit", str(gated_spec), "--queue", cluster.url, "--priority", "5", check=True)
        sweeper("submit", str(smoke(workdir, "two", n_trials=8)), "--queue", cluster.url, check=True)
        workers = [
            start(workdir, "worker", "--queue", cluster.url, "--drain", "--out", "runs", log=f"w{i}") for i in (1, 2)
        ]
        wait_for(lambda: (gate / "blocked").exists(), workers[0], what="a worker holding trial 0 at its gate")

        cluster.stop()
        waiting = "does not answer"
        for i, w in enumerate(workers, 1):  # each notices at its next statement (a heartbeat at the latest)
            wait_for(lambda i=i: waiting in (workdir / f"w{i}.log").read_text(), w, what=f"worker {i} waiting")
        (gate / "release").touch()
        cluster.start()
        wait_for(lambda: queue_rows(cluster.url)["two"]["trials_done"] >= 2, what="sweep two training")
        cluster.restart()
        for i, w in enumerate(workers, 1):
            finish(w, workdir, f"w{i}")
        rows = queue_rows(cluster.url)
    for name in ("smoke", "two"):
        assert rows[name]["state"] == "finished" and rows[name]["trials_done"] == 8, rows[name]
        # none lost and trained again: an attempt that a cut left behind would be a ninth trial
        trials = json.loads(Path(rows[name]["note"]).read_text())["trials"]
        assert [t["number"] for t in trials] == list(range(8)), [(t["number"], t["reason"]) for t in trials]
    summary = json.loads(Path(rows["smoke"]["note"]).read_text())
    assert table(summary) == table(reference)


def test_a_queue_worker_holds_few_connections_each_named_for_its_process(workdir: Path, pg_url: str):
    """Issue #56 item 5: a queue worker's queue, its visits' ledgers and Optuna storages (two
    sweeps here, both kept open) and its heartbeats share one pool (engine.shared_engine): at most
    POOL_KEPT + POOL_OVERFLOW connections to the database at once (an engine each, with
    SQLAlchemy's defaults, held 10), and so does its finishing process; every connection is named
    for its process in pg_stat_activity (``sweeper worker PID``), none left to an engine of
    Optuna's own (a study loaded from its URL held a pool until collected)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from sweeper.search.optuna.engine import POOL_KEPT, POOL_OVERFLOW

    for name in ("one", "two"):
        sweeper("submit", str(smoke(workdir, name)), "--queue", pg_url, check=True)
    worker = start(workdir, "worker", "--queue", pg_url, "--drain", "--out", "runs", log="w")
    held: dict[str, int] = {}  # the most connections each process held at once, until the worker exits
    database = make_url(pg_url).database
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as db:
        while worker.poll() is None:
            rows = db.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity "
                # state is NULL while a connection starts, before its application_name is set
                "WHERE datname = %s AND backend_type = 'client backend' AND state IS NOT NULL GROUP BY 1",
                (database,),
            ).fetchall()
            for process, n in rows:
                held[process] = max(held.get(process, 0), n)
    finish(worker, workdir, "w")
    assert {r["state"] for r in queue_rows(pg_url).values()} == {"finished"}
    assert held.get(f"sweeper worker {worker.pid}", 0) >= 1, held
    assert all(process.startswith("sweeper ") and n <= POOL_KEPT + POOL_OVERFLOW for process, n in held.items()), held
