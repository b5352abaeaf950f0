"""benchmarks/gpu_check.py --cpu: every check of the GPU script, tiny, on the CPU, so that the
script works the first time a GPU is at hand (GPU time is rare). It prints one JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

CPU_FUSED = (4, 8)  # benchmarks/gpu_check.py's CPU_FUSED: the digits sweeps' sizes with --cpu


# The checks in three processes, so that two test workers can share them (export_on_cpu exports
# the sweep check's best trial, so the two run together); each process pays ~10 s of imports.
GROUPS = (
    ("sweep", "export_on_cpu", "deterministic"),
    ("two_workers", "ray_fraction", "sync_audit", "throughput", "compile", "resumed_adamw"),
    ("fused", "ranks"),
)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: "+".join(g))
def test_the_gpu_check_runs_every_check_on_the_cpu(workdir, group):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--cpu", ",".join(group)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "GPU_CHECK_OUT": str(workdir / "report.json")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    print(json.dumps(report, indent=1))  # the report, in the test's output
    assert report == json.loads((workdir / "report.json").read_text())  # saved as it went
    assert set(group) <= set(report)
    for name in group:
        assert "error" not in report[name], (name, report[name])
    for name in {"sweep", "two_workers"} & set(group):
        assert [t["state"] for t in report[name]["trials"]] == ["complete", "complete"], report[name]
        assert all(t["device"] == "cpu" and min(t["samples_per_s"]) > 0 for t in report[name]["trials"])
    if "sweep" in group:
        sweep = report["sweep"]
        assert set(sweep["export_max_abs_diff"]) == {"torchscript", "onnx"}
        assert all(diff <= 1e-4 for diff in sweep["export_max_abs_diff"].values())
        assert 0 < sweep["training_fraction"] < 1 and sweep["gpu_busy_pct"] is None  # no nvidia-smi here
        assert report["deterministic"]["bitwise_equal"] is True
        assert report["export_on_cpu"]["exit"] == 0 and report["export_on_cpu"]["trained_on"] == "cpu"
    if "throughput" in group:
        assert report["sync_audit"]["device"] == "cpu" and report["sync_audit"]["samples_per_s"] > 0
        assert all(isinstance(v, int) and v > 0 for v in report["throughput"].values()), report["throughput"]
        assert report["compile"]["compiled_images_per_s"] > 0 and report["compile"]["backend"] == "aot_eager"
        assert report["resumed_adamw"]["step_counter_device"] == "cpu"
        assert report["ray_fraction"]["validate_exit"] == 0, report["ray_fraction"]  # the GPU run's Ray spec
    if "ranks" in group:  # 2 gloo ranks on the CPU, through the CLI
        ranks = report["ranks"]
        assert ranks["devices_1"]["state"] == ranks["devices_2"]["state"] == "complete", ranks
        assert ranks["devices_2"]["device"] == "cpu" and ranks["speedup_last_epoch"] > 0
    if "fused" in group:
        # digits through the CLI: every trial of each fused sweep trained, one model per architecture
        fused = report["fused"]
        assert sorted(k for k in fused if k.startswith("digits_fused_")) == [f"digits_fused_{n}" for n in CPU_FUSED]
        for n in CPU_FUSED:
            assert (
                fused[f"digits_fused_{n}"]["counts"] == {"complete": n}
                and fused[f"digits_fused_{n}"]["fused_models"] >= 1
            )
            assert fused[f"digits_fused_{n}"]["trials_per_hour"] > 0
        assert (
            fused["airbench_sized"]["members"] == 2
            and fused["airbench_sized"]["layered_s"] > 0 < fused["airbench_sized"]["vmap_s"]
        )
