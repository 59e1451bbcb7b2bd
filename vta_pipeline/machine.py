"""Which CPU this is: every benchmark result and tuning comparison names it.

Timings and tuning records compare only within one CPU: the machines we run on change
between an AVX2-only EPYC and AVX-512 VNNI Xeons / Zen 4s, and an int8 conv is 4x faster
with the dot-product instructions than without.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "neon", "asimd", "asimddp")
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
