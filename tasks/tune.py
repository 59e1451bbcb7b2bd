"""Prefect tasks for tuning: one run per tuning task (mapped), then pick best."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.logging import get_run_logger

from vta_pipeline import steps
from vta_pipeline.boards import BoardSpec
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.extract import TaskInfo
from vta_pipeline.targets import resolve_target
from vta_pipeline.vta.config import VTAConfig

from .common import RESULTS, RETRY, artifact, current_id, open_store, store_cache_key


def _tune_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    key = steps.tune_key(
        store,
        TaskInfo(**p["task"]),
        resolve_target(p["target"]),
        TuneConfig(**p["tune"]),
        MeasureConfig(**p["measure"]),
        p["board"]["key"],
    )
    return store, "tune", key


@task(
    name="tune-task",
    task_run_name="tune-{task[name]}",
    cache_key_fn=store_cache_key(_tune_key),
    **RESULTS,
    **RETRY,
)
def tune_task(
    store_root: str,
    extracted: dict[str, str],
    task: dict[str, Any],
    target: str,
    board: dict[str, Any],
    tune: dict[str, Any],
    measure: dict[str, Any],
    cache: str = "on",
) -> dict[str, str]:
    store = open_store(store_root, cache)
    info = TaskInfo(**task)
    cfg = TuneConfig(**tune)
    logger = get_run_logger()
    progress_id = create_progress_artifact(progress=0.0, description=f"trials of {info.name}")

    def on_progress(p: dict[str, Any]) -> None:
        ok = [r["latency_ms"] for r in p["batch"] if r["latency_ms"] is not None]
        logger.info(
            "%s: %d/%d trials, batch best %s ms, %d errors",
            info.name,
            p["trials"],
            cfg.trials_per_task,
            f"{min(ok):.4f}" if ok else "-",
            sum(r["error"] is not None for r in p["batch"]),
        )
        update_progress_artifact(progress_id, min(100.0, 100.0 * p["trials"] / cfg.trials_per_task))

    art = steps.tune_step(
        store,
        artifact(store, extracted),
        info,
        resolve_target(target),
        BoardSpec(**board),
        cfg,
        MeasureConfig(**measure),
        on_progress,
    )
    update_progress_artifact(progress_id, 100.0)
    return art.ref()


def _best_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    return (
        store,
        "pick_best",
        steps.pick_best_key(store, [current_id(store, r) for r in p["tuned"]], resolve_target(p["target"])),
    )


@task(name="pick-best", cache_key_fn=store_cache_key(_best_key), **RESULTS)
def pick_best(store_root: str, tuned: list[dict[str, str]], target: str, cache: str = "on") -> dict[str, str]:
    store = open_store(store_root, cache)
    return steps.pick_best_step(store, [artifact(store, r) for r in tuned], resolve_target(target)).ref()


def _vta_tune_key(p):
    from vta_pipeline.vta.tasks import VtaTask

    store = open_store(p["store_root"], p.get("cache", "on"))
    task = VtaTask.from_dict(p["task"])
    return (
        store,
        steps.VTA_TUNE_STEP,
        steps.vta_tune_key(store, task, VTAConfig(**p["vta"]), p["board_key"], TuneConfig(**p["tune"])),
    )


@task(
    name="tune-vta-task",
    task_run_name="tune-{task[name]}",
    cache_key_fn=store_cache_key(_vta_tune_key),
    **RESULTS,
    **RETRY,
)
def tune_vta_task(
    store_root: str,
    task: dict[str, Any],
    vta: dict[str, Any],
    tracker: str,
    board_key: str,
    tune: dict[str, Any],
    cache: str = "on",
) -> dict[str, str]:
    """One VTA conv task's knobs, tuned on the VTA boards under `board_key`."""
    from vta_pipeline.vta.tasks import VtaTask

    store = open_store(store_root, cache)
    info = VtaTask.from_dict(task)
    cfg = TuneConfig(**tune)
    logger = get_run_logger()
    progress_id = create_progress_artifact(progress=0.0, description=f"knob trials of {info.name}")

    def on_progress(done: int, total: int, best_ms: float | None) -> None:
        logger.info(
            "%s: %d/%d knob configs, best %s ms (simulated)",
            info.name,
            done,
            total,
            f"{best_ms:.3f}" if best_ms is not None else "-",
        )
        update_progress_artifact(progress_id, min(100.0, 100.0 * done / total))

    art = steps.vta_tune_step(store, info, VTAConfig(**vta), tracker, board_key, cfg, on_progress)
    update_progress_artifact(progress_id, 100.0)
    return art.ref()
