"""Every GPU path of sweeper, checked on one GPU in a few minutes; one JSON report on stdout.

    python benchmarks/gpu_check.py          # on a machine with CUDA (the report goes in the issue's note)
    python benchmarks/gpu_check.py --cpu    # the same checks, tiny, on the CPU: this script's own smoke test
    python benchmarks/gpu_check.py throughput   # one check only (or several: throughput,compile)

The report is also written after each check to $GPU_CHECK_OUT (default ./gpu_check.json).

Each check records its numbers or its error; one failing check does not stop the others.
- device: torch, CUDA, the GPU, its memory, native bf16
- sweep: a 2-trial x 2-epoch cifar.yaml sweep through the CLI on CIFAR-format files written here
  (no download): each trial's device, samples/s and peak memory, export parity; the GPU's mean
  utilisation during the sweep (nvidia-smi) and the trials' share of its wall time
- two_workers: the same with search.parallel=2 on one GPU
- deterministic: train.deterministic twice: the same history, bitwise
- sync_audit: one epoch of sweeper's own loop under torch.cuda.set_sync_debug_mode("warn"): syncs counted, by line
- throughput: ResNet-18 on CIFAR-shaped batches (256/512/1024), bf16 autocast: NCHW vs
  channels_last, foreach vs fused AdamW, torch.compile off vs on (images/s; goal >= 60,000 on an H200)
- compile: train.compile's first (compiling) step against a pruned trial's length, and its gain
- resumed_adamw: step time of AdamW resumed from a checkpoint vs a fresh one (no per-step sync)
- export_on_cpu: a checkpoint trained on the GPU exported by a process that sees no GPU
- ray_fraction: a Ray sweep of 2 trials with search.resources.gpu 0.5 (both on the GPU at once;
  --cpu: `sweeper validate` of that spec only)
- ranks: the sweep with train.devices=2 (DDP over NCCL, SyncBatchNorm) against train.devices=1:
  each trial's samples/s and state (skipped, with the reason, where fewer than 2 GPUs are
  visible; --cpu: 2 gloo ranks on the CPU)
- fused: digits.yaml through the CLI, end to end (start-up, orchestration, MLflow on sqlite): N trials
  fused (search.fuse) at N = 256 and 1024 vs the same sweep solo, trials per hour (goals: >= 50x,
  >= 100,000 trials per H200-hour); and an airbench-sized CNN (cnn, 64 channels, 3 blocks) on
  CIFAR-shaped data, 8 trials fused vs one after another (the engine alone)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CIFAR = REPO / "search_spaces" / "cifar.yaml"
# --cpu: every check runs, at sizes that only prove the code works (tests/test_gpu_check.py runs it)
CPU_IMAGES = 1000  # CIFAR-format training images: 900 after the validation split, >= sync_audit's batch of 512
CPU_FUSED = (4, 8)  # the digits sweeps' trials, solo and fused (fixed cost and cost per trial from two sizes)


def cli(folder: Path, *args: str, env: dict[str, str] | None = None, spec: Path = CIFAR) -> dict[str, Any]:
    """``sweeper run SPEC ARGS`` in ``folder``; its summary.json, with the run's wall time
    and the GPU's mean utilisation meanwhile (nvidia-smi sampled every 200 ms, if present)."""
    sampler = None
    if shutil.which("nvidia-smi"):
        sampler = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0", "-lms", "200"],
            stdout=subprocess.PIPE,
            text=True,
        )
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sweeper", "run", str(spec), *args, "--out", "out", "-q"],
            cwd=folder,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        wall = time.perf_counter() - started
        samples = []
        if sampler is not None:
            sampler.terminate()
            samples = [float(line) for line in sampler.communicate()[0].split() if line.strip().isdigit()]
    if proc.returncode != 0:
        raise RuntimeError(f"sweeper run exited {proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads((folder / "out" / "summary.json").read_text())
    summary["wall_s"] = wall
    summary["gpu_busy_pct"] = round(sum(samples) / len(samples), 1) if samples else None
    return summary


def trials(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "number": t["number"],
            "state": t["state"],
            "device": t["device"],
            "samples_per_s": [round(h.get("samples_per_s", 0)) for h in t["history"]],
            "gpu_mem_peak_mb": max((h.get("gpu_mem_peak_mb", 0) for h in t["history"]), default=None),
        }
        for t in summary["trials"]
    ]


def timing(summary: dict[str, Any]) -> dict[str, Any]:
    """How much of the sweep's wall time trained: nvidia-smi's mean utilisation (the goal: >= 90%),
    and the trials' epoch seconds over the wall time (start-up, dry build, export included)."""
    trained = sum(h.get("epoch_seconds", 0) for t in summary["trials"] for h in t["history"])
    return {
        "wall_s": round(summary["wall_s"], 1),
        "gpu_busy_pct": summary["gpu_busy_pct"],
        "training_fraction": round(trained / summary["wall_s"], 3),
    }


def sweep_args(root: Path, small: bool) -> list[str]:
    size = (
        [
            f"dataset.args.limit={CPU_IMAGES}",
            "model.args.width=8",
            "search.space.train.batch_size={type: categorical, choices: [64, 128]}",
        ]
        if small
        else []
    )
    return [
        f"dataset.args.root={root}",
        "dataset.args.download=false",
        "search.n_trials=2",
        "train.epochs=2",
        "search.lr_finder.enabled=false",
        "search.pruner.type=none",
        "export.formats=[torchscript,onnx]",
        *size,
    ]


def check_sweep(root: Path, work: Path, small: bool) -> dict[str, Any]:
    """The sweep, tracked in MLflow (work/mlflow.db): export_on_cpu exports its best trial."""
    folder = work / "sweep"
    folder.mkdir(exist_ok=True)
    summary = cli(folder, *sweep_args(root, small), env={"MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"})
    exported = {
        f["format"]: f.get("max_abs_diff", f.get("error")) for f in summary.get("export", {}).get("formats", [])
    }
    return {"trials": trials(summary), "export_max_abs_diff": exported, **timing(summary)}


def check_two_workers(root: Path, small: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        summary = cli(
            Path(tmp), *sweep_args(root, small), "tracking.enabled=false", "search.parallel=2", "search.batch_size=2"
        )
        return {"trials": trials(summary), **timing(summary)}


def check_deterministic(root: Path, small: bool) -> dict[str, Any]:
    histories = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            summary = cli(
                Path(tmp),
                *sweep_args(root, small),
                "tracking.enabled=false",
                "search.n_trials=1",
                "train.deterministic=true",
                "export.formats=[]",
            )
            histories.append(
                [
                    {k: v for k, v in h.items() if k not in ("epoch_seconds", "samples_per_s")}
                    for h in summary["trials"][0]["history"]
                ]
            )
    return {"bitwise_equal": histories[0] == histories[1], "history": histories[0]}


def resnet_step(
    device: str, batch: int, small: bool, channels_last: bool, fused: bool, compile_model: bool
) -> tuple[Callable[[], None], Any]:
    """One bf16 training step of ResNet-18 on a CIFAR-shaped batch, as a closure; its optimizer."""
    import torch

    from sweeper_plugins.models import resnet18

    model = resnet18(input_shape=(3, 32, 32), num_classes=10, width=8 if small else 64).to(device)
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if fused else {"foreach": True}))
    return bf16_step(torch.compile(model) if compile_model else model, opt, x, y, device), opt


def bf16_step(run: Any, opt: Any, x: Any, y: Any, device: str) -> Callable[[], None]:
    """One bf16-autocast training step of ``run`` on (x, y), as a closure."""
    import torch

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(run(x), y)
        loss.backward()
        opt.step()

    return step


def images_per_s(step: Callable[[], None], batch: int, device: str, steps: int) -> float:
    import torch

    for _ in range(3 if device.startswith("cuda") else 1):  # warm-up: cuDNN autotuning, compilation
        step()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return round(batch * steps / (time.perf_counter() - started))


def check_throughput(device: str, small: bool) -> dict[str, Any]:
    batches, steps = ([8], 1) if small else ([256, 512, 1024], 30)
    out: dict[str, Any] = {}
    for batch in batches:
        for name, kw in {
            "nchw_foreach": {},
            "channels_last": {"channels_last": True},
            "fused": {"fused": True},
            "channels_last_fused": {"channels_last": True, "fused": True},
            "channels_last_fused_compiled": {"channels_last": True, "fused": True, "compile_model": True},
        }.items():
            if small and name.endswith("compiled"):
                continue  # compilation alone takes minutes on a CPU
            args = {"channels_last": False, "fused": False, "compile_model": False, **kw}
            try:
                out[f"{name}@{batch}"] = images_per_s(
                    resnet_step(device, batch, small, **args)[0], batch, device, steps
                )
            except Exception as exc:  # e.g. fused AdamW on a device without it
                out[f"{name}@{batch}"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def check_sync_audit(root: Path, device: str, small: bool) -> dict[str, Any]:
    """One epoch of sweeper's own training loop (cifar.yaml's model and optimizer) under
    torch.cuda.set_sync_debug_mode("warn"): every host-device sync counted, with where it was."""
    import torch

    from sweeper.spec import load
    from sweeper.trial.build import TrialConfig, run_trial

    cuda = device.startswith("cuda")
    # on the CPU (--cpu) the same loop runs with nothing to audit: this code is tested before a GPU run
    debug_mode = torch.cuda.set_sync_debug_mode if cuda else (lambda mode: None)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    spec = load(
        CIFAR,
        [
            f"dataset.args.root={root}",
            "dataset.args.download=false",
            "train.epochs=1",
            "train.batch_size=512",
            *(["model.args.width=8"] if small else []),
        ],
    )
    marks: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")

        def start(parts: Any) -> None:  # after building (loading the data syncs, on purpose)
            synchronize()
            marks["from"] = len(records)
            debug_mode("warn")

        def stop(epoch: int, metrics: dict[str, float]) -> None:  # after the epoch's evaluation
            debug_mode(0)
            marks["to"] = len(records)

        try:
            trained = run_trial(TrialConfig(0, 1, {}, spec), stop, torch.device(device), before_fit=start)
        finally:
            debug_mode(0)
    audited = records[marks["from"] : marks["to"]]
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in audited)
    return {
        "device": str(trained.data.train_x.device),
        "syncs_in_one_epoch": len(audited),
        "samples_per_s": round(trained.history[-1]["samples_per_s"]),
        "where": dict(where.most_common(8)),
    }


def check_compile(device: str, small: bool) -> dict[str, Any]:
    """train.compile's cost and gain, with sweeper's own compile path: the first compiled step
    (compilation) against a pruned trial's length (ASHA's first rung of cifar.yaml: 2 epochs of
    45,000 images), and steady images/s compiled vs eager. --cpu: the aot_eager backend."""
    import torch

    from sweeper.trial import speed
    from sweeper_plugins.models import cnn, resnet18

    if small:
        speed.COMPILE_BACKEND = "aot_eager"  # inductor's C++ build alone takes minutes on a CPU (and a tiny CNN)
    batch, steps = (8, 1) if small else (512, 30)
    out: dict[str, Any] = {"backend": speed.COMPILE_BACKEND}
    for kind in ("eager", "compiled"):
        built = (
            cnn(input_shape=(3, 32, 32), num_classes=10, channels=4, blocks=1)
            if small
            else resnet18(input_shape=(3, 32, 32), num_classes=10, width=64)
        )
        model = speed.to_memory_format(built.to(device), torch.device(device))
        net = speed.CompiledForwards().model(model) if kind == "compiled" else model
        opt = torch.optim.AdamW(
            model.parameters(), lr=1e-3, **speed.optimizer_args(torch.optim.AdamW, {}, torch.device(device))
        )
        x = speed.as_input(
            torch.randn(batch, 3, 32, 32, device=device), speed.channels_last(model, torch.device(device))
        )
        step = bf16_step(net, opt, x, torch.randint(0, 10, (batch,), device=device), device)
        started = time.perf_counter()
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out[f"{kind}_first_step_s"] = round(time.perf_counter() - started, 2)
        out[f"{kind}_images_per_s"] = images_per_s(step, batch, device, steps)
    pruned_trial_s = 2 * 45_000 / out["eager_images_per_s"]
    out["pruned_trial_s_eager"] = round(pruned_trial_s, 1)
    out["compile_s_vs_pruned_trial"] = round(
        (out["compiled_first_step_s"] - out["eager_first_step_s"]) / pruned_trial_s, 4
    )
    return out


def check_resumed_adamw(device: str, small: bool) -> dict[str, Any]:
    """A trial resumed from a checkpoint: its AdamW state loaded the way sweeper loads it."""
    from sweeper.trial import checkpoint

    times = {}
    for kind in ("fresh", "resumed"):
        step, opt = resnet_step(device, 32 if small else 512, small, False, False, False)
        step()
        if kind == "resumed":
            with tempfile.TemporaryDirectory() as tmp:
                path = checkpoint.save(Path(tmp) / "state.pt", {"optimizer": opt.state_dict()})
                opt.load_state_dict(
                    checkpoint.load(path)["optimizer"]
                )  # onto the CPU, then where the optimizer wants it
            times["step_counter_device"] = str(next(iter(opt.state.values()))["step"].device)
        times[f"{kind}_images_per_s"] = images_per_s(step, 32 if small else 512, device, 2 if small else 30)
    return times


def check_export_on_cpu(root: Path, work: Path, small: bool) -> dict[str, Any]:
    """`sweeper export` of the sweep check's best trial (trained on the GPU) by a process that
    sees no GPU."""
    if not (work / "sweep" / "out" / "summary.json").exists():  # `gpu_check.py export_on_cpu` alone
        check_sweep(root, work, small)
    summary = json.loads((work / "sweep" / "out" / "summary.json").read_text())
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeper",
            "export",
            summary["best"]["mlflow_run_id"],
            "--formats",
            "onnx",
            "--out",
            str(work / "export"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    )
    best = next(t for t in summary["trials"] if t["number"] == summary["best"]["number"])
    return {"exit": proc.returncode, "trained_on": best["device"], "stderr": proc.stderr[-500:]}


def check_ray_fraction(root: Path, small: bool) -> dict[str, Any]:
    args = [
        *sweep_args(root, small),
        "tracking.enabled=false",
        "search.backend=ray",
        "search.pruner.type=asha",
        "search.resources.gpu=0.5",
        "search.resources.cpu=2",
        "export.formats=[]",
    ]
    if small:
        # without a GPU a trial reserving half of one would wait forever, and a Ray sweep on the CPU
        # is tests/test_ray.py's subject: the CPU smoke test checks that the GPU run's spec validates
        proc = subprocess.run(
            [sys.executable, "-m", "sweeper", "validate", str(CIFAR), *args],
            capture_output=True,
            text=True,
        )
        return {"validate_exit": proc.returncode, "stderr": proc.stderr[-500:]}
    with tempfile.TemporaryDirectory() as tmp:
        return {"trials": trials(cli(Path(tmp), *args))}


def check_ranks(root: Path, small: bool) -> dict[str, Any]:
    """One trial of the sweep on 1 device and on 2 (train.devices: DDP, one process per device):
    samples/s per epoch of each, their states, the 2-device trial's best val_acc beside the 1's."""
    import torch

    visible = torch.cuda.device_count()
    if not small and visible < 2:
        return {"skipped": f"needs 2 CUDA devices; {visible} visible"}
    out: dict[str, Any] = {"visible_devices": visible}
    for n in (1, 2):
        args = [*sweep_args(root, small), "tracking.enabled=false", "search.n_trials=1", "export.formats=[]"]
        args += [f"train.devices={n}", *(["train.device=cpu"] if small else [])]
        args += ["train.sync_batchnorm=true"] if n > 1 and not small else []
        with tempfile.TemporaryDirectory() as tmp:
            summary = cli(Path(tmp), *args)
        (trial,) = summary["trials"]
        out[f"devices_{n}"] = {
            **trials(summary)[0],
            "val_acc": max(h["val_acc"] for h in trial["history"]),
            "wall_s": round(summary["wall_s"], 1),
        }
    one, two = out["devices_1"]["samples_per_s"][-1], out["devices_2"]["samples_per_s"][-1]
    out["speedup_last_epoch"] = round(two / one, 2) if one else None
    return out


def check_fused(root: Path, device: str, small: bool) -> dict[str, Any]:
    """Fused trials: digits sweeps through the CLI (solo vs fused, trials per hour end to end),
    then the airbench-sized CNN at N = 8 with the fused engine alone vs one trial after another."""
    import torch

    from sweeper.spec import load
    from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
    from sweeper.trial.fused import fit_fused

    digits = REPO / "search_spaces" / "digits.yaml"
    # MLflow on (sqlite in the sweep's folder): each trial's nested run and per-epoch metrics are part
    # of the end-to-end cost
    common = [
        "search.sampler=random",
        "search.pruner.type=none",
        "search.lr_finder.enabled=false",
        "export.formats=[]",
        "search.parallel=1",
        f"train.epochs={1 if small else 3}",
        f"train.device={'cpu' if small else 'auto'}",
    ]
    out: dict[str, Any] = {}
    walls = {}
    # solo at two sizes: its fixed cost and the cost of one more trial, for the same N as fused
    # (on the GPU, 1024 solo trials would take most of an hour)
    for solo_n in CPU_FUSED if small else (8, 32):
        with tempfile.TemporaryDirectory() as tmp:
            walls[solo_n] = cli(
                Path(tmp),
                *common,
                f"search.n_trials={solo_n}",
                f"search.batch_size={solo_n}",
                "search.fuse=off",
                spec=digits,
            )["wall_s"]
    (a, wall_a), (b, wall_b) = sorted(walls.items())
    per_trial = (wall_b - wall_a) / (b - a)
    fixed = wall_a - a * per_trial
    out["digits_solo"] = {
        "wall_s": {str(k): round(v, 1) for k, v in walls.items()},
        "fixed_s": round(fixed, 1),
        "per_trial_s": round(per_trial, 3),
    }
    for n in CPU_FUSED if small else (256, 1024):
        with tempfile.TemporaryDirectory() as tmp:
            fused = cli(
                Path(tmp), *common, f"search.n_trials={n}", f"search.batch_size={n}", f"search.fuse={n}", spec=digits
            )
        rate = n * 3600 / fused["wall_s"]
        solo_rate = n * 3600 / (fixed + n * per_trial)  # the same N trials solo, from the two solo sweeps
        out[f"digits_fused_{n}"] = {
            "wall_s": round(fused["wall_s"], 1),
            "trials_per_hour": round(rate),
            "solo_trials_per_hour": round(solo_rate),
            "ratio_to_solo": round(rate / solo_rate, 2),
            "gpu_busy_pct": fused["gpu_busy_pct"],
            "counts": fused["counts"],
            "fused_models": len({tuple(t["fused_with"]) for t in fused["trials"] if t["fused_with"]}),
            "best_val_acc": max((t["value"] or 0) for t in fused["trials"]),
        }
    # the airbench-sized net: the engine alone, one epoch of CIFAR-shaped data per trial
    limit, channels, blocks, n, batch = (200, 4, 1, 2, 64) if small else (10_000, 64, 3, 8, 512)
    configs = []
    for number in range(n):
        spec = load(
            CIFAR,
            [
                f"dataset.args.root={root}",
                "dataset.args.download=false",
                f"dataset.args.limit={limit}",
                f"model={{plugin: cnn, args: {{channels: {channels}, blocks: {blocks}}}}}",
                "train.epochs=1",
                f"train.batch_size={batch}",
                "search.space={}",
                f"train.device={device.split(':')[0]}",
                f"optimizer.args.lr={0.02 * (number + 1)}",
            ],
        )
        configs.append(TrialConfig(number, 1000 + number, {}, spec))
    dev = torch.device(device)
    cache = ProcessCache()
    cache.data.load(configs[0].spec, dev)
    run_trial(configs[0], lambda epoch, metrics: None, dev, cache=cache)  # warm: first calls out of the timing
    started = time.perf_counter()
    _ = [run_trial(config, lambda epoch, metrics: None, dev, cache=cache) for config in configs]
    solo_s = time.perf_counter() - started
    out["airbench_sized"] = {
        "members": n,
        "channels": channels,
        "blocks": blocks,
        "train_images": limit,
        "solo_s": round(solo_s, 1),
    }
    for layered in (True, False):  # the layered form (grouped kernels) and vmap: which is faster here?
        started = time.perf_counter()
        engine = fit_fused(configs, dev, lambda k, epoch, metrics: None, layered=layered, cache=cache)[0].engine
        seconds = time.perf_counter() - started
        out["airbench_sized"].update({f"{engine}_s": round(seconds, 1), f"{engine}_ratio": round(solo_s / seconds, 2)})
    return out


def main() -> None:
    small = "--cpu" in sys.argv
    import torch

    from sweeper_plugins.cifar import write_random

    device = "cpu" if small or not torch.cuda.is_available() else "cuda:0"
    report: dict[str, Any] = {
        "device": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "available": torch.cuda.is_available(),
            **(
                {
                    "name": torch.cuda.get_device_name(0),
                    "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
                    "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
                }
                if torch.cuda.is_available()
                else {}
            ),
        }
    }
    saved = Path(os.environ.get("GPU_CHECK_OUT", "gpu_check.json"))
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        write_random(data, per_batch=CPU_IMAGES // 5 if small else 10_000)  # 5 batches; full size: 50,000 images
        report["data_seconds"] = round(time.perf_counter() - started, 1)
        checks = {
            "sweep": lambda: check_sweep(Path(data), Path(work), small),
            "two_workers": lambda: check_two_workers(Path(data), small),
            "deterministic": lambda: check_deterministic(Path(data), small),
            "sync_audit": lambda: check_sync_audit(Path(data), device, small),
            "throughput": lambda: check_throughput(device, small),
            "compile": lambda: check_compile(device, small),
            "resumed_adamw": lambda: check_resumed_adamw(device, small),
            "export_on_cpu": lambda: check_export_on_cpu(Path(data), Path(work), small),
            "ray_fraction": lambda: check_ray_fraction(Path(data), small),
            "fused": lambda: check_fused(Path(data), device, small),
            "ranks": lambda: check_ranks(Path(data), small),
        }
        chosen = [a for a in sys.argv[1:] if a != "--cpu"]  # `gpu_check.py throughput,compile`: these only
        wanted = set(chosen[-1].split(",")) if chosen else set(checks)
        if wanted - set(checks):
            sys.exit(f"unknown check(s) {', '.join(sorted(wanted - set(checks)))}; the checks: {', '.join(checks)}")
        for name, check in checks.items():
            if name not in wanted:
                continue
            started = time.perf_counter()
            try:
                report[name] = check()
            except Exception as exc:
                report[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "where": traceback.format_exc()[-800:]}
            report[name + "_seconds"] = round(time.perf_counter() - started, 1)
            print(f"# {name}: {report[name + '_seconds']} s", file=sys.stderr, flush=True)
            saved.write_text(json.dumps(report, indent=1))  # what is done so far, should a later check hang
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
