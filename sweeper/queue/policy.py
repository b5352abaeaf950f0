"""Which sweep a free worker serves next: a function of the queue's rows, nothing else.

1. Only sweeps open for trials (queued or running) whose device requirement the worker's offer
   meets, and not those the worker found with nothing to claim a moment ago (``resting``).
2. An owner at its quota (devices in use by its sweeps, this worker's own excluded; a trial of
   train.devices N holds N) gets none that would pass it.
3. The highest priority first.
4. Among equal priorities, fair share: the owner whose open sweeps have used the least device
   time per unit of weight (their ledgers' spent device-seconds, an ended sweep's decaying with a
   half-life of a day, plus the trials other workers
   train for them now, each counted as that worker's last trial: without them, every worker that
   sees one owner behind serves it at once, and the owners swing past each other by a trial
   per worker), then the one fewer workers serve now; within an owner, its sweeps that have room
   for another worker (a reproducible sweep: its batches in flight, ``_room``) before those
   that have not, each in the order submitted. A worker serving one owner
   leaves for another once its owner is ahead (``ahead_by``) by more than half the device time
   of the trials it just trained (a switch then narrows the gap): the owners stay within about
   one batch of trials, without a switch of sweeps after every trial.

Preemption (``preempted_for``): a sweep of higher priority that no worker serves, and no idle
worker could, takes the device of the worker serving the lowest priority among those that could
serve it (one worker, so one trial is preempted per waiting sweep), after that trial's epoch.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sweeper.queue.table import OPEN, Entry, Offer

# Fair share remembers an owner's ended sweeps (finished, failed, cancelled) with their device
# time halved every this many seconds since they ended (Slurm's PriorityDecayHalfLife, here a
# day): forgetting a sweep the moment it finished handed its owner every worker until the other
# owner's open sweeps had used as much again (benchmarks/sweep_queue.py: docs/queue.md#measured)
HALF_LIFE_S = 24 * 3600.0


@dataclass(frozen=True)
class Pool:
    """The queue as one worker sees it when it looks for work."""

    entries: list[Entry]
    spent: dict[str, float]  # device-seconds by sweep name
    owners: dict[str, dict[str, Any]]  # owner -> {weight, max_devices}
    serving: dict[str, str | None] = field(default_factory=dict)  # live worker -> the sweep it serves
    offers: dict[str, Offer] = field(default_factory=dict)  # live worker -> what it offers
    units: dict[str, float] = field(default_factory=dict)  # live worker -> device-seconds of its last trial
    now: float = field(default_factory=time.time)  # unix time: how long ago ended sweeps ended

    def used(self, me: str) -> dict[str, float]:
        """Device-seconds per unit of weight by owner: what its sweeps' trials used (an ended
        sweep's halved every HALF_LIFE_S since it ended), and the trials workers other than ``me``
        train for them now (each as that worker's last trial)."""
        by_name = {e.name: e for e in self.entries}
        used: dict[str, float] = {}
        for e in self.entries:
            ago = 0.0 if e.ended_at is None else max(0.0, self.now - e.ended_at)
            used[e.owner] = used.get(e.owner, 0.0) + self.spent.get(e.name, 0.0) * 0.5 ** (ago / HALF_LIFE_S)
        for w, s in self.serving.items():
            if w != me and s in by_name:
                owner = by_name[s].owner
                used[owner] = used.get(owner, 0.0) + self.units.get(w, 0.0)
        return {owner: seconds / self.weight(owner) for owner, seconds in used.items()}

    def weight(self, owner: str) -> float:
        return float(self.owners.get(owner, {}).get("weight") or 1.0)

    def quota(self, owner: str) -> int | None:
        return self.owners.get(owner, {}).get("max_devices")


def choose(pool: Pool, offer: Offer, me: str, resting: frozenset[str] | set[str] = frozenset()) -> Entry | None:
    """The sweep worker ``me`` (offering ``offer``) should serve now, or None."""
    by_name = {e.name: e for e in pool.entries}
    others = {w: s for w, s in pool.serving.items() if w != me and s in by_name}
    serving = Counter(s for s in others.values() if s is not None)
    candidates = _open(pool, offer, me, resting)
    if not candidates:
        return None
    top = max(e.priority for e in candidates)
    candidates = [e for e in candidates if e.priority == top]
    used = pool.used(me)
    owner_serving = Counter[str]()
    for name, n in serving.items():
        owner_serving[by_name[name].owner] += n

    def share(e: Entry) -> tuple[float, float, bool, float, str]:
        room = _room(e)
        full = room is not None and serving[e.name] >= room
        return (used.get(e.owner, 0.0), owner_serving[e.owner] / pool.weight(e.owner), full, e.submitted_at, e.name)

    return min(candidates, key=share)


def _room(entry: Entry) -> int | None:
    """How many workers the sweep's trials can keep busy at once: a reproducible sweep's batches
    in flight (search.batch_size x (search.staleness + 1)); None where no bound is known
    (``reproducible: false``, or no batch size). Past it, a worker that joins finds nothing to
    claim, rests there and leaves: in a queue of 100 sweeps of 8 trials, batches of 4, each sweep
    was entered 18.7 times by 16 workers (docs/many-machines.md#a-queue-of-100-sweeps)."""
    search = entry.spec.get("search", {})
    size = search.get("batch_size")
    if not search.get("reproducible", True) or not size:
        return None
    return int(size) * (1 + int(search.get("staleness") or 0))


def ahead_by(pool: Pool, owner: str, other: str, me: str = "") -> float:
    """How much more device time (seconds per unit of weight) ``owner``'s open sweeps have used
    than ``other``'s (trials running on workers other than ``me`` included): the fair-share gap
    a worker weighs before leaving one owner for the other."""
    used = pool.used(me)
    return used.get(owner, 0.0) - used.get(other, 0.0)


def _open(pool: Pool, offer: Offer, me: str, resting: frozenset[str] | set[str]) -> list[Entry]:
    """The sweeps open for trials that ``offer`` fits, not resting, whose owner has a device left
    in its quota (devices of live workers other than ``me``)."""
    by_name = {e.name: e for e in pool.entries}
    in_use = Counter[str]()  # devices each owner's trials hold on other workers (a DDP trial: several)
    for w, s in pool.serving.items():
        if w != me and s in by_name:
            in_use[by_name[s].owner] += by_name[s].devices

    def quota_left(e: Entry) -> bool:
        quota = pool.quota(e.owner)
        return quota is None or in_use[e.owner] + e.devices <= quota

    return [e for e in pool.entries if e.state in OPEN and offer.fits(e) and e.name not in resting and quota_left(e)]


def preempted_for(pool: Pool, me: str, mine: Entry, resting: frozenset[str] | set[str] = frozenset()) -> Entry | None:
    """The sweep that worker ``me`` (serving ``mine``) should give its device to now, or None."""
    if me not in pool.offers:
        return None
    by_name = {e.name: e for e in pool.entries}
    served = {s for w, s in pool.serving.items() if s is not None and w != me}
    waiting = [
        e for e in _open(pool, pool.offers[me], me, resting) if e.priority > mine.priority and e.name not in served
    ]
    for sweep in sorted(waiting, key=lambda e: (-e.priority, e.submitted_at, e.name)):
        if any(pool.serving.get(w) is None and offer.fits(sweep) for w, offer in pool.offers.items() if w != me):
            return None  # an idle worker takes it
        givers = [
            (by_name[s].priority, w)
            for w, s in pool.serving.items()
            if s in by_name and by_name[s].priority < sweep.priority and w in pool.offers and pool.offers[w].fits(sweep)
        ]
        return sweep if givers and min(givers) == (mine.priority, me) else None
    return None
