"""Prefect tasks after the evaluation: the regression guard, and the history append.

Neither is cached by Prefect: both are cheap, and both must see the run that calls them
(the guard reads the history as it is now; the append is idempotent by itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from vta_pipeline import guard, history

from .common import open_store


@task(name="regression-guard")
def regression_guard(store_root: str, result: dict[str, Any], max_regression_pct: float) -> dict[str, Any]:
    """Compare with the best earlier night and update the current build; returns the verdict."""
    verdict = guard.check(Path(store_root), result, max_regression_pct)
    current = guard.promote(open_store(store_root), result, verdict) if result["tuned"]["correct"] else {}
    return dict(verdict.to_dict(), current=current)


@task(name="record-history")
def record_history(store_root: str, result: dict[str, Any], tune_dirs: list[str]) -> dict[str, int]:
    """Append the run's measurements and evaluations to the Parquet history."""
    return history.record_run(Path(store_root), result, [Path(d) for d in tune_dirs])
