"""Which CPU this is, and which commit of ours: every benchmark result and tuning comparison
names both.

Timings and tuning records compare only within one CPU: the machines we run on change
between an AVX2-only EPYC and AVX-512 VNNI Xeons / Zen 4s, and an int8 conv is 4x faster
with the dot-product instructions than without.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512vbmi",
    "avx_vnni",
    "amx_int8",
    "neon",
    "asimd",
    "asimddp",
)
"""The instruction-set flags that decide which kernels a conv can use."""


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """{"cpu": model name, "isa": the ISA_FLAGS it has, "logical_cpus": n}."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "hardware", "cpu model") and name in ("", platform.machine(), "x86_64"):
                name = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": name, "isa": [f for f in ISA_FLAGS if f in flags], "logical_cpus": os.cpu_count() or 1}


def source_commit() -> str:
    """The source commit of this package (git, when it runs from a checkout), else its version."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import version

    return f"vta-pipeline {version('vta-pipeline')}"
