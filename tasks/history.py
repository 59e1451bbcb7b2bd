"""Prefect tasks after the evaluation: the regression guard, and the history append.

Neither is cached by Prefect: both are cheap, and both must see the run that calls them
(the guard reads the history as it is now; the append is idempotent by itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from vta_pipeline import guard, steps
from vta_pipeline.report import RunResult
from vta_pipeline.store import history

from .common import artifact, open_store


@task(name="regression-guard")
def regression_guard(
    store_root: str,
    result: RunResult,
    guard_cfg: dict[str, Any],
    target: str,
    tracker: str,
    board_key: str,
    fetched: dict[str, str],
    min_repeat_ms: float,
) -> dict[str, Any]:
    """Compare with the best earlier night (and, if that says "regressed", time both builds in
    turn on the board) and update the current build; returns the verdict. Not retried: a board
    that fails the in-turn timing leaves the history's verdict, which says so."""
    from vta_pipeline.config import GuardConfig, parse_hostport
    from vta_pipeline.targets import resolve_target

    store = open_store(store_root)
    verdict = steps.regression_verdict(
        store,
        result,
        GuardConfig(**guard_cfg),
        resolve_target(target),
        parse_hostport(tracker),
        board_key,
        artifact(store, fetched),
        min_repeat_ms,
    )
    # an emulated run's build is checked, not timed: it becomes no key's current build
    current = guard.promote(store, result, verdict) if result.tuned.correct and not verdict.skipped else {}
    return dict(verdict.to_dict(), current=current)


@task(name="record-history")
def record_history(store_root: str, result: RunResult, tune_dirs: list[str]) -> dict[str, int]:
    """Append the run's measurements and evaluations to the Parquet history."""
    return history.record_run(Path(store_root), result, [Path(d) for d in tune_dirs])
