"""Which sweep a free worker serves next: a function of the queue's rows, nothing else.

1. Only sweeps open for trials (queued or running) whose device requirement the worker's offer
   meets, and not those the worker found with nothing to claim a moment ago (``resting``).
2. An owner at its quota (devices in use by its sweeps, this worker's own excluded) gets none.
3. The highest priority first.
4. Among equal priorities, fair share: the owner whose open sweeps have used the least device
   time per unit of weight (their ledgers' spent device-seconds), then the one fewer workers
   serve now; within an owner, its sweeps in the order submitted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sweeper.search.queue.table import OPEN, Entry, Offer


@dataclass(frozen=True)
class Pool:
    """The queue as one worker sees it when it looks for work."""

    entries: list[Entry]
    spent: dict[str, float]  # device-seconds by sweep name
    owners: dict[str, dict[str, Any]]  # owner -> {weight, max_devices}
    serving: dict[str, str | None] = field(default_factory=dict)  # live worker -> the sweep it serves

    def weight(self, owner: str) -> float:
        return float(self.owners.get(owner, {}).get("weight") or 1.0)

    def quota(self, owner: str) -> int | None:
        return self.owners.get(owner, {}).get("max_devices")


def choose(pool: Pool, offer: Offer, me: str, resting: frozenset[str] | set[str] = frozenset()) -> Entry | None:
    """The sweep worker ``me`` (offering ``offer``) should serve now, or None."""
    by_name = {e.name: e for e in pool.entries}
    others = {w: s for w, s in pool.serving.items() if w != me and s in by_name}
    in_use = Counter(by_name[s].owner for s in others.values() if s is not None)
    serving = Counter(s for s in others.values() if s is not None)
    candidates = [
        e
        for e in pool.entries
        if e.state in OPEN
        and offer.fits(e)
        and e.name not in resting
        and (pool.quota(e.owner) is None or in_use[e.owner] < (pool.quota(e.owner) or 0))
    ]
    if not candidates:
        return None
    top = max(e.priority for e in candidates)
    candidates = [e for e in candidates if e.priority == top]
    used: dict[str, float] = {}
    for e in pool.entries:
        if e.state in (*OPEN, "finishing"):
            used[e.owner] = used.get(e.owner, 0.0) + pool.spent.get(e.name, 0.0)
    owner_serving = Counter[str]()
    for name, n in serving.items():
        owner_serving[by_name[name].owner] += n

    def share(e: Entry) -> tuple[float, float, float, str]:
        w = pool.weight(e.owner)
        return (used.get(e.owner, 0.0) / w, owner_serving[e.owner] / w, e.submitted_at, e.name)

    return min(candidates, key=share)
