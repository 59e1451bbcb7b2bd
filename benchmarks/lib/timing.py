"""Timing a callable: wall-clock samples after warm-up, and their summary."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


# ---- timing -------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any], runs: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def stats(ms: list[float]) -> dict[str, float]:
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "runs": len(ms)}
