"""``search.budget`` true to the clock (Optuna backend). A sweep given B device-seconds holds its
devices (``parallel`` workers, each trial's GPUs on CUDA or torch threads on the CPU) from the
launch of `sweeper run` to its end: start-up, sampling, bookkeeping and the finish (summary,
test score, export, report) are spent on the budget as much as training is. So its trials are
claimed until the clock's end less a reserve for the finish, and a running trial stops after the
epoch whose successor would end past that point (coordinator); the sweep ends within B / devices
of wall clock, give or take the finish's misestimate (docs/strategy.md#a-budget-true-to-the-clock).

The trials' own device-seconds are still counted in the ledger (``search.budget`` also stops
claims once they reach B: workers on other machines add devices this clock does not know of).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sweeper.spec import SweepSpec
from sweeper.trial.outcome import devices_used
from sweeper.trial.seeding import threads_per_trial

# Wall seconds kept for the finish: the summary, the test score and the report (plots), measured
# at 3 s on a 2-core CPU for digits (`SWEEPER_PHASES=f sweeper run search_spaces/digits.yaml`:
# summary 0.05, test score 0.05, report 2.84, end 0.13), plus each export format's build and
# parity check in a fresh process (1.05 s for TorchScript there; torch.export and ONNX cost more:
# benchmarks/export_cost.py). On a machine busy with other work the finish is drawn out as the
# start-up was: the reserve is scaled by this process's contention (below). At most 40 % of the
# clock, so that a tiny budget keeps trials (4 runnable loops beside a 40 s budget on the 2-core VM
# drew its finish out to 13.8 s: a quarter of the clock ended at 44.5 s).
FINISH_S = 3.0
FORMAT_S = 1.5
RESERVE_SHARE = 0.4


@dataclass(frozen=True)
class Clock:
    """The sweep's budget as wall clock."""

    budget_s: float  # device-seconds (search.budget.device_hours x 3600)
    devices: int  # the devices the sweep holds while it runs
    reserve_s: float  # wall seconds kept for the finish

    @property
    def wall_s(self) -> float:
        """The wall seconds the budget buys: from launch to the sweep's end."""
        return self.budget_s / self.devices

    def trials_s(self) -> float:
        """Wall seconds from launch after which no trial trains."""
        return self.wall_s - self.reserve_s

    def describe(self) -> str:
        return (
            f"ends within {self.wall_s:.0f} s of wall clock from launch ({self.budget_s:.0f} device-s on "
            f"{self.devices} device(s)); trials until {self.trials_s():.0f} s, {self.reserve_s:.1f} s kept for "
            "the finish, more on a busy machine (docs/strategy.md#a-budget-true-to-the-clock)"
        )


def clock(spec: SweepSpec, spent_s: float = 0.0, slowdown: float = 1.0) -> Clock | None:
    """``spec``'s budget as wall clock, less ``spent_s`` device-seconds spent before (a resume),
    its finish ``slowdown`` times slower than on an idle machine (``contention()``); None without
    a budget, or on Ray Tune (whose trials its own scheduler places)."""
    budget = spec.search.budget
    if budget is None or spec.search.backend != "optuna":
        return None
    left = max(0.0, budget.device_hours * 3600 - spent_s)
    devices = spec.search.parallel * devices_held(spec)
    finish_s = (FINISH_S + FORMAT_S * len(spec.export.formats)) * max(1.0, slowdown)
    reserve = min(finish_s, RESERVE_SHARE * left / devices)
    return Clock(left, devices, reserve)


def contention() -> float:
    """How many times longer than its time on a CPU this process's main thread has taken so far:
    (time on a CPU + time runnable but waiting for one) / time on a CPU, from Linux's scheduler
    statistics (/proc/self/schedstat, nanoseconds); 1.0 where they are missing. Waits for disk or
    network are not counted: only other work competing for the cores. Measured on this 2-core VM
    at the sweep's storage step (tests/test_budgets.py's sweep): 1.0 to 1.3 idle, 2.3 beside two
    busy loops, 3.3 beside four, where its finish took 3.9, 4.4 and 6.7 s."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as stat:
            on_cpu_ns, waiting_ns = (int(field) for field in stat.read().split()[:2])
    except (OSError, ValueError):
        return 1.0
    return (on_cpu_ns + waiting_ns) / on_cpu_ns if on_cpu_ns > 0 else 1.0


def devices_held(spec: SweepSpec) -> int:
    """The devices one of the sweep's workers holds, as search.budget counts them."""
    cuda = spec.train.device != "cpu" and torch.cuda.is_available()
    return devices_used("cuda" if cuda else "cpu", threads_per_trial(spec), spec.train.devices)
