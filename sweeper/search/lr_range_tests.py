"""Warm-start a sweep from LR range tests: one per distinct (dataset, model, optimizer, batch
size) configuration the space can produce, cached in the output folder. A configuration is a
choice of plugin or batch size; plugin args (widths, depths) share one test: on digits the good
LR range of widths 8, 16 and 32 is the same (0.004-0.06), and each test costs about half a trial.

Policies: ``enqueue`` puts a first trial at each suggestion (other searched params at their
base values), ``narrow`` shrinks optimizer.args.lr's range to [s/factor, s*factor] (the
envelope over configurations, clipped to the declared range); ``both`` does both.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sweeper import files
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.track.mlflow import Tracker
from sweeper.trial.lr_finder import RangeTest, plot, range_test
from sweeper.trial.seeding import derive

if TYPE_CHECKING:
    from sweeper.trial.build import ProcessCache

LR = "optimizer.args.lr"
CONFIG_PATHS = ("dataset.plugin", "model.plugin", "optimizer.plugin", "train.batch_size")
MAX_CONFIGS = 8  # more distinct configurations than this: one test of the base config instead
CACHE = "lr_finder.json"
DEFAULT_MIN_LR, DEFAULT_MAX_LR = 1e-6, 1.0  # range-test bounds unless the declared range is wider


@dataclass(frozen=True)
class Finding:
    config: dict[str, Any]  # the categorical values that define this configuration
    result: RangeTest
    plot: Path


@dataclass(frozen=True)
class WarmStart:
    spec: SweepSpec  # with the narrowed LR range, when narrowed
    enqueue: list[dict[str, Any]]  # params of trials to run first
    findings: list[Finding]
    note: str  # one line for the user

    def summary(self) -> dict[str, Any]:
        """The summary.json entry."""
        return {
            "note": self.note,
            "policy": self.spec.search.lr_finder.policy,
            "findings": [
                {
                    "config": f.config,
                    "suggestion": f.result.suggestion,
                    "steps": f.result.steps,
                    "seconds": f.result.seconds,
                    "plot": str(f.plot),
                }
                for f in self.findings
            ],
        }


def configurations(spec: SweepSpec) -> list[dict[str, Any]]:
    """Each combination of the unconditional categorical choices of plugin and batch size."""
    dims = {
        path: p.choices
        for path, p in spec.search.space.items()
        if isinstance(p, sp.CategoricalParam) and not p.when and path in CONFIG_PATHS
    }
    if math.prod(len(choices) for choices in dims.values()) > MAX_CONFIGS:  # counted, never listed
        return [{}]
    return [dict(zip(dims, values)) for values in itertools.product(*dims.values())]


def find(spec: SweepSpec, config: dict[str, Any], device: Any, cache: ProcessCache | None = None) -> RangeTest:
    """One range test of ``spec`` with ``config`` applied, seeded by the sweep's "sweep" stream
    (its data set from ``cache`` when it holds it)."""
    from sweeper.trial.build import TrialConfig, build

    settings = spec.search.lr_finder
    low, high = bounds(spec)
    configured = spec.with_values(config)
    seed = derive(spec.seed, "sweep")
    parts = build(TrialConfig(-1, seed, config, configured), device, cache)
    return range_test(
        parts.model,
        parts.optimizer,
        parts.data,
        configured.train,
        min_lr=low,
        max_lr=high,
        steps=settings.steps,
        seed=seed,
        task=parts.task,
    )


def bounds(spec: SweepSpec) -> tuple[float, float]:
    """The LRs a range test of ``spec`` spans. From "too small to learn" to "diverges" even when
    the declared range is narrow: a curve that only falls has no informative steepest point.
    Suggestions are clipped to the declared range later."""
    lr = lr_param(spec) if LR in spec.search.space else None
    settings = spec.search.lr_finder
    low = settings.min_lr or min(lr.low if lr else DEFAULT_MIN_LR, DEFAULT_MIN_LR)
    high = settings.max_lr or max(lr.high if lr else DEFAULT_MAX_LR, DEFAULT_MAX_LR)
    return low, high


def _trial_device(spec: SweepSpec) -> Any:
    """The device and torch threads a trial of this spec gets."""
    from sweeper.trial.seeding import configure_torch, threads_per_trial
    from sweeper.trial.trainer import resolve_device

    configure_torch(threads=threads_per_trial(spec), deterministic=spec.train.deterministic)
    return resolve_device(spec.train.device)


def find_alone(spec: SweepSpec) -> RangeTest:
    """`sweeper lr-find`: one range test of the spec's base config."""
    return find(spec, {}, _trial_device(spec))


def prepare(spec: SweepSpec, out_dir: Path, cache: ProcessCache | None = None) -> WarmStart:
    """Run (or read from the cache) the range tests, on the device and threads a trial gets,
    and apply the policy. ``cache``: this process's, whose data set the range tests load (and
    the trials reuse when they train in this process)."""
    from sweeper.trial.build import ProcessCache

    device = _trial_device(spec)
    cache = cache if cache is not None else ProcessCache()
    cache_path = out_dir / CACHE
    # what a range test depends on (not the policy, nor the declared range inside the bounds):
    # a sweep warm-started from an earlier one reuses its tests though its LR range differs
    key = json.dumps(
        {
            "steps": spec.search.lr_finder.steps,
            "bounds": bounds(spec),
            "seed": spec.seed,
            "base": spec.model_dump(include={"dataset", "model", "optimizer", "train"}),
        },
        sort_keys=True,
        default=str,
    )
    cached = _read_cache(cache_path, key) or _earlier_cache(spec, key)
    findings = []
    for i, config in enumerate(configurations(spec)):
        entry = cached.get(json.dumps(config, sort_keys=True))
        result = _cached(entry) or find(spec, config, device, cache)
        label = ", ".join(f"{k}={v}" for k, v in config.items()) or "base config"
        findings.append(
            Finding(config, result, plot(result, out_dir / f"lr_finder_{i}.png", f"LR range test: {label}"))
        )
    _release(spec, cache)
    fresh = {json.dumps(f.config, sort_keys=True): f.result.to_dict() for f in findings}
    if fresh != cached:  # a resumed sweep reads the cache and leaves it as it was
        files.write_atomic(cache_path, json.dumps({key: fresh}, indent=1))
    return apply_policy(spec, findings)


def _release(spec: SweepSpec, cache: ProcessCache) -> None:
    """Give back what the range tests held on the device: their models and optimizers (gone by
    now) and, unless this process trains the trials too (optuna with parallel: 1), the data set."""
    from sweeper.trial.execute import release_device_memory

    if spec.search.backend != "optuna" or spec.search.parallel > 1:
        cache.data.forget()
    release_device_memory()


def _earlier_cache(spec: SweepSpec, key: str) -> dict[str, Any]:
    """The range tests an earlier sweep (a search.warm_start output folder) ran with the same
    key: the same data, model, optimizer, batch size, seed and range-test settings."""
    for source in spec.search.warm_start:
        if "://" not in source and (found := _read_cache(Path(source).expanduser() / CACHE, key)):
            return found
    return {}


def _read_cache(path: Path, key: str) -> dict[str, Any]:
    """The cached findings for ``key``; an unreadable cache (truncated, garbled) is rebuilt with
    a warning: it only saves the range tests' time."""
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get(key, {})
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise ValueError("not the findings sweeper writes")
        return entries
    except (OSError, ValueError, AttributeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        print(
            f"warning: {path}: unreadable LR finder cache ({type(exc).__name__}: {str(exc)[:120]}); running the "
            f"range tests again and rewriting it",
            file=sys.stderr,
        )
        return {}


def _cached(entry: dict[str, Any] | None) -> RangeTest | None:
    try:
        return RangeTest(**entry) if entry else None
    except TypeError:  # fields of another version: run the test again
        return None


def apply_policy(spec: SweepSpec, findings: list[Finding]) -> WarmStart:
    settings, declared = spec.search.lr_finder, lr_param(spec)
    useful = [f for f in findings if f.result.suggestion is not None]
    suggested = [f.result.suggestion for f in useful if f.result.suggestion is not None]  # useful's, typed
    if not useful:
        return WarmStart(spec, [], findings, "LR finder: no reliable suggestion; the declared LR range is kept")
    clip = lambda lr: min(max(lr, declared.low), declared.high)  # noqa: E731
    enqueue = []
    if settings.policy in ("enqueue", "both"):
        base = base_values(spec)
        enqueue = [{**base, **f.config, LR: clip(lr)} for f, lr in zip(useful, suggested)]
    narrowed = spec
    if settings.policy in ("narrow", "both"):
        low = clip(min(suggested) / settings.factor)
        high = clip(max(suggested) * settings.factor)
        narrowed = narrow(spec, low, high)
    suggestions = ", ".join(f"{lr:.3g}" for lr in suggested)
    range_note = (
        f"; LR range narrowed to [{lr_param(narrowed).low:.3g}, {lr_param(narrowed).high:.3g}]"
        if narrowed is not spec
        else ""
    )
    note = (
        f"LR finder: suggestion {suggestions} ({sum(f.result.steps for f in findings)} steps, "
        f"{sum(f.result.seconds for f in findings):.1f} s); {len(enqueue)} trial(s) enqueued{range_note}"
    )
    return WarmStart(narrowed, enqueue, findings, note)


def lr_param(spec: SweepSpec) -> sp.FloatParam:
    """The searched optimizer.args.lr: a float parameter (the spec's validation says so)."""
    return cast(sp.FloatParam, spec.search.space[LR])


def narrow(spec: SweepSpec, low: float, high: float) -> SweepSpec:
    """The spec with optimizer.args.lr searched in [low, high]."""
    space = {**spec.search.space, LR: spec.search.space[LR].model_copy(update={"low": low, "high": high})}
    return spec.model_copy(update={"search": spec.search.model_copy(update={"space": space})})


def base_values(spec: SweepSpec) -> dict[str, Any]:
    """The spec's own value for each searched param, where it has one inside the param's range."""
    tree = spec.model_dump()
    out = {}
    for path, param in spec.search.space.items():
        node: Any = tree
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or param.when:
            continue
        inside = node in param.choices if isinstance(param, sp.CategoricalParam) else param.low <= node <= param.high
        if inside:
            out[path] = node
    return out


def log(tracker: Tracker, run_id: str | None, warm: WarmStart, out_dir: Path) -> None:
    """The range tests on the sweep's run: curves as images, suggestions and policy as params."""
    params: dict[str, Any] = {"lr_finder.policy": warm.spec.search.lr_finder.policy}
    params.update({f"lr_finder.suggestion.{i}": f.result.suggestion for i, f in enumerate(warm.findings)})
    tracker.log_params(run_id, params)
    tracker.set_tags(run_id, {"lr_finder": warm.note})
    tracker.log_files(run_id, [f.plot for f in warm.findings] + [out_dir / CACHE], "lr_finder")
