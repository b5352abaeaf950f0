"""`sweeper worker --queue URL`: one process serving trials from every runnable sweep of a queue.

The worker asks the policy (policy.py) which sweep to serve and joins it as `sweeper worker
--study` would (search/runner.py, role "worker": the sweep's own batches, budget and leases).
Before each claim, and while that sweep has nothing to claim, it asks again: it leaves for a sweep
of higher priority or of an owner behind on fair share (the trial it holds finishes first), and for
any other runnable sweep rather than wait. A sweep it leaves with nothing to claim rests a moment
(REST_S) for this worker. After each epoch it asks whether a sweep of higher priority waits for
its device (policy.preempted_for): the trial then stops there, its training state saved, and is
retried from that state later (search/optuna/recovery.py: retry_preempted), bitwise the trial an
uninterrupted run trains (on the CPU).

Finishing: when a worker leaves a sweep whose budget is spent and whose every trial has ended, it
moves the sweep from running to finishing in one compare-and-set UPDATE; the one that succeeds
hands it to its finishing process, which summarises and exports it (finish.py: `sweeper run`'s
end, runner role "finish") and marks it finished; the worker goes on serving trials meanwhile.
An idle worker looks for such sweeps too (whose last workers were killed), and takes over the
finishing of a worker that stopped renewing its heartbeat.

Stopping: SIGTERM (`docker compose stop`, a deleted pod, a scale-down) stops the worker gracefully:
no new claim, its trial stopped at the end of its epoch and released as a preempted one (its state
saved, a retry queued at once for any worker), the sweeps handed to its finishing process
finished, its row removed; then it exits 0. A second SIGTERM, or SIGINT, stops it at once (its
trial then waits for its lease to run out, as after SIGKILL). Without a handler a container's
PID 1 ignores SIGTERM, and the platform's SIGKILL follows its grace period.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sweeper.errors import SweepStopped, UserError
from sweeper.queue import finish
from sweeper.queue.policy import Pool, ahead_by, choose, preempted_for
from sweeper.queue.table import LIVE_S, OPEN, Entry, Offer, Queue
from sweeper.search.optuna.engine import first_line, outage
from sweeper.search.optuna.ledger import Ledger, studies, this_member
from sweeper.search.optuna.study import safe_url
from sweeper.search.state import Role
from sweeper.spec import SweepSpec

HEARTBEAT_S = 5.0  # how often a worker renews its row
POLL_S = 1.0  # how often an idle worker looks at the queue again
REST_S = 5.0  # a sweep left with nothing to claim is not entered again by this worker for this long
FAULT_REST_S = 30.0  # a sweep whose visit failed unexpectedly is not visited again by this worker for this long
OUTAGE_REST_S = POLL_S  # one whose visit the database's going away cut: entered again once it answers
KEPT_DATA = 2  # the data sets (and compiled forwards) of this many sweeps last visited stay in memory


def detect_offer() -> Offer:
    """This machine's device: the first CUDA device and its memory (and how many GPUs this process
    sees: CUDA_VISIBLE_DEVICES), else the CPU and the RAM (GB)."""
    import torch

    if torch.cuda.is_available():
        return Offer("cuda", torch.cuda.get_device_properties(0).total_memory / 2**30, torch.cuda.device_count())
    return Offer("cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)


@dataclass
class _Left:
    """One visit to a sweep, as its claims go: why run_sweep returned early ("other": a sweep
    comes before it; "wait": nothing to claim there until other workers' trials end; None: it
    did not), the device-seconds its trials had spent at the last claim, and what the trials
    since added (the unit a fair-share switch is weighed in; kept while none ended)."""

    why: Literal["other", "wait"] | None = None
    spent: float = 0.0
    unit: float = 0.0


class QueueWorker:
    def __init__(self, url: str, out_root: Path, offer: Offer, say: Callable[[str], None], drain: bool) -> None:
        self.url, self.out_root, self.offer, self.say, self.drain = url, out_root, offer, say, drain
        self.queue = Queue(url)
        self.me = this_member()
        self.resting: dict[str, float] = {}  # sweep -> until when (unix time) this worker does not enter it
        self.served = 0  # sweeps entered
        # the sweeps visited, in the order last visited: dry build done, the last ones' data sets kept
        self.visits: dict[str, Any] = {}
        self.finisher = finish.Finisher(url, out_root, self.me, say)  # summarises the sweeps it ends
        self.stopping: str | None = None  # the signal that asked this worker to stop, once one did
        self._stop = threading.Event()

    def run(self) -> int:
        """Serve the queue until stopped (SIGTERM: gracefully, see the module's doc) or interrupted
        (or, with ``drain``, until no sweep it can serve is open, nor one finishing); the number of
        sweeps this worker finished."""
        self.queue.join(self.me, self.offer)
        beat = threading.Thread(target=self._beat, name="sweeper-queue-heartbeat", daemon=True)
        beat.start()
        try:
            with self._stops_on(signal.SIGTERM):
                return self._loop()
        finally:
            for visit in self.visits.values():
                visit.close()
            # interrupted (its finishing process was too: one process group): what it held stays
            # finishing, under a finisher that left, for another worker to take over
            self.finisher.close()
            self._stop.set()
            beat.join(timeout=HEARTBEAT_S)
            self.queue.leave(self.me)
            self.queue.close()

    @contextlib.contextmanager
    def _stops_on(self, signum: signal.Signals) -> Iterator[None]:
        """``signum`` stops this worker gracefully, a second one at once (the main thread only:
        Python runs signal handlers there)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(received: int, frame: object) -> None:
            if self.stopping is not None:
                raise KeyboardInterrupt
            self.stopping = signal.Signals(received).name
            # os.write, not print: the handler may run inside another write to the same stream
            line = f"stopping ({self.stopping}): no new trial; the one training stops at its epoch's end, released\n"
            os.write(sys.stderr.fileno(), line.encode())

        before = signal.signal(signum, handle)
        try:
            yield
        finally:
            signal.signal(signum, before)

    def _loop(self) -> int:
        while True:
            if self.stopping is not None:
                self.finisher.close()
                return self.finisher.finished(self.queue)
            with self._outage_passes("the queue"):
                self.finisher.check(self.queue)
                entry = self._next()
                if entry is not None:
                    self._serve(entry)
                    continue
                if self._finish_orphans():
                    continue
                if self.drain and not any(
                    e.state == "finishing" or (e.state in OPEN and self.offer.fits(e)) for e in self.queue.entries()
                ):
                    self.finisher.close()
                    return self.finisher.finished(self.queue)
            time.sleep(POLL_S)

    @contextlib.contextmanager
    def _outage_passes(self, what: str) -> Iterator[None]:
        """A statement about ``what`` cut by the database going away (a restart, a failover),
        beyond those that ride it out where they run (engine.riding_out): one line, and the worker
        goes on at its next turn, whose first statement waits for the server
        (engine.waiting_for_server). These are reads and checked writes: a turn may run again."""
        try:
            yield
        except Exception as exc:
            cause = outage(exc)
            if cause is None:
                raise
            self.say(f"warning: {what}: a statement cut by the database going away ({first_line(cause)}); going on")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.queue.heartbeat(self.me)
            except Exception as exc:  # the database away a moment: the next beat tries again
                print(f"warning: queue heartbeat failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _pool(self) -> Pool:
        workers = self.queue.workers(LIVE_S)
        serving = {w["worker"]: w["serving"] for w in workers}
        offers = {w["worker"]: Offer(w["device"], w["memory_gb"], w["devices"]) for w in workers}
        units = {w["worker"]: w["unit_s"] or 0.0 for w in workers}
        return Pool(self.queue.entries(), self.queue.spent(), self.queue.owners(), serving, offers, units)

    def _resting(self) -> set[str]:
        now = time.time()
        return {n for n, until in self.resting.items() if until > now}

    def _next(self, also_resting: str | None = None) -> Entry | None:
        resting = self._resting()
        if also_resting is not None:
            resting.add(also_resting)
        return choose(self._pool(), self.offer, self.me, resting)

    def _serve(self, entry: Entry) -> None:
        """Serve ``entry`` until it has nothing to claim or another sweep comes first; then
        finish it if its trials have all ended."""
        from sweeper.search import runner
        from sweeper.track.progress import QuietObserver

        try:
            spec = self._spec(entry)
        except UserError as exc:
            self._fail(entry, str(exc))
            return
        if not self.queue.take_seat(self.me, entry, LIVE_S):  # another worker took its owner's last device
            self.resting[entry.name] = time.time() + POLL_S
            return
        self.queue.move(entry.name, ("queued",), state="running", started_at=time.time())
        self.say(f"serving sweep '{entry.name}' (owner {entry.owner}, priority {entry.priority})")
        self.served += 1
        left = _Left()
        elsewhere = functools.partial(self._elsewhere, entry, left)
        preempt = functools.partial(self._preempt, entry)
        visit = self.visits.pop(entry.name, None) or runner.Visit(elsewhere, preempt)
        visit.elsewhere, visit.preempt = elsewhere, preempt
        self.visits[entry.name] = visit  # the most recent last
        for older in list(self.visits.values())[:-KEPT_DATA]:  # their stores and data sets let go
            older.close()
        try:
            runner.run_sweep(spec, self._out(entry), QuietObserver(), role=Role.WORKER, visit=visit)
        except (UserError, SweepStopped) as exc:
            self._fail(entry, str(exc))
            self.visits.pop(entry.name).close()
            return
        except Exception as exc:  # a fault of this visit: said; the queue goes on
            cause = outage(exc)
            if cause is None:
                traceback.print_exc()
            else:  # a statement the database's going away cut: entered again once the server answers
                self.say(
                    f"warning: sweep '{entry.name}': its visit cut by the database going away ({first_line(cause)})"
                )
            self.visits.pop(entry.name).close()
            self.resting[entry.name] = time.time() + (FAULT_REST_S if cause is None else OUTAGE_REST_S)
            return
        finally:
            self.queue.serve(self.me, None)
        if left.why != "other":  # nothing to claim there now
            self.resting[entry.name] = time.time() + REST_S
        if left.why is None:
            self._finish(entry, spec)

    def _elsewhere(self, entry: Entry, left: _Left, waiting: bool, spent: float) -> bool:
        """Asked before each claim in ``entry``'s sweep (SearchContext.elsewhere): leave it for
        another sweep? ``left`` keeps why, and the device-seconds the visit's trials spent."""
        if self.stopping is not None:  # no new claim: the trials held finish (or stop at an epoch's end)
            left.why = "other"
            return True
        if waiting:  # nothing to claim here until other workers' trials end: any other sweep now
            if self._next(also_resting=entry.name) is not None:
                left.why = "wait"
                return True
            return False
        if self._state(entry.name) not in OPEN:  # cancelled (or failed) meanwhile: no new claim
            left.why = "other"
            return True
        if spent > left.spent:
            left.unit = spent - left.spent
            self.queue.set_unit(self.me, left.unit)
        left.spent = spent
        pool = self._pool()
        pick = choose(pool, self.offer, self.me, self._resting())
        if pick is None or pick.name == entry.name:
            return False
        # another owner comes first on fair share: left once this owner is ahead by more than half
        # the trials just trained, where the switch narrows the gap (|ahead - unit| < ahead); so
        # the owners stay within about one such unit, without a switch after every trial
        if pick.priority > entry.priority or ahead_by(pool, entry.owner, pick.owner, self.me) > left.unit / 2:
            left.why = "other"
            return True
        return False  # another sweep of the same owner and priority: this one goes on (no switch)

    def _preempt(self, entry: Entry) -> str | None:
        """Asked after each epoch of a trial of ``entry``'s sweep: why its device is wanted, or None."""
        if self.stopping is not None:
            return f"for worker {self.me} stopping ({self.stopping})"
        wanted = preempted_for(self._pool(), self.me, entry, self._resting())
        return None if wanted is None else f"for sweep '{wanted.name}' (priority {wanted.priority})"

    def _state(self, name: str) -> str:
        return self.queue.entry(name).state

    def _spec(self, entry: Entry) -> SweepSpec:
        return finish.queued_spec(entry, self.url)

    def _out(self, entry: Entry) -> Path:
        return self.out_root / entry.name

    def _fail(self, entry: Entry, why: str) -> None:
        finish.fail(self.queue, entry.name, why, self.say)

    def _finish(self, entry: Entry, spec: SweepSpec) -> bool:
        """Start finishing the sweep if its trials have all ended and no other worker does; True if
        this worker does."""
        if not ended(self.url, spec):
            return False
        if not self.queue.move(entry.name, OPEN, state="finishing", finisher=self.me):
            return False
        self._summarise(entry)
        return True

    def _summarise(self, entry: Entry) -> None:
        """The sweep's summary and export handed to the finishing process (finish.py)."""
        if entry.name in self.visits:  # the sweep is done: what its visits kept goes
            self.visits.pop(entry.name).close()
        pid = self.finisher.hand(entry.name)
        self.say(f"finishing sweep '{entry.name}': summary and export (process {pid})")

    def _finish_orphans(self) -> bool:
        """Idle: finish the sweeps whose trials all ended while no worker left them (their last
        workers were killed), and those whose finisher stopped renewing its heartbeat; whether
        this worker began finishing any."""
        live = {w["worker"] for w in self.queue.workers(LIVE_S)}
        known = set(studies(self.url, safe_url))
        began = False
        for entry in self.queue.entries():
            if entry.state == "running" and entry.name in known and self.resting.get(entry.name, 0) <= time.time():
                spec = self._spec(entry)
                self.resting[entry.name] = time.time() + REST_S
                began |= self._finish(entry, spec)
            elif entry.state == "finishing" and entry.finisher not in live:
                if self.queue.move(entry.name, ("finishing",), finisher=self.me):
                    self._summarise(entry)
                    began = True
        return began


def ended(url: str, spec: SweepSpec) -> bool:
    """Whether the sweep has nothing left: its budget is spent (or a stop requested) and none of
    its trials runs or waits (`sweeper run`'s condition to summarise). Read again through a
    restart of the server (engine.riding_out)."""
    import sqlalchemy as sa

    from sweeper.search.optuna.engine import riding_out

    return riding_out(lambda _: _ended(url, spec), sa.engine.make_url(url), f"sweep '{spec.name}': has it ended?")


def _ended(url: str, spec: SweepSpec) -> bool:
    import optuna
    from optuna.trial import TrialState as OptunaState

    from sweeper.search.optuna.proposer import Budget
    from sweeper.search.optuna.study import make_storage

    ledger = Ledger(url, spec.name, grace_s=spec.search.lease_s)
    try:
        sweep = ledger.read()
    finally:
        ledger.close()
    if sweep is None:
        return False
    from sweeper.spec import validate

    # the process's pool (make_storage): a storage of its own per call held connections until collected
    study = optuna.load_study(study_name=spec.name, storage=make_storage(url, spec))
    if any(t.state == OptunaState.RUNNING for t in study.get_trials(deepcopy=False)):
        return False
    # the spec as the sweep's first process resolved it (search.sampler: auto chosen, a grid's size)
    return Budget(validate(sweep.spec, f"sweep '{spec.name}'"), study, Role.RUN).over(sweep)
