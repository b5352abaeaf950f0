"""The line a benchmark prints about where and when it ran (its figures mean little without it)."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path


def describe() -> str:
    """'<date> UTC, <n> CPUs (<model>)'."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), platform.processor())
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs ({cpu})"
