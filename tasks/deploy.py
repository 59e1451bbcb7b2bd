"""Prefect tasks for the deployment-side steps: build, upload + evaluate on a board."""

from __future__ import annotations

from typing import Any

from prefect import task

from vta_pipeline import steps
from vta_pipeline.config import EvalConfig
from vta_pipeline.targets import resolve_target

from .common import RESULTS, RETRY, artifact, current_id, open_store, store_cache_key


def _build_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    best = p.get("best")
    vta_ids = [current_id(store, r) for r in p.get("vta_tuned") or []]
    return (
        store,
        "build",
        steps.build_key(
            store,
            current_id(store, p["extracted"]),
            current_id(store, best) if best else None,
            resolve_target(p["target"]),
            vta_ids,
        ),
    )


@task(name="build", task_run_name="build-{label}", cache_key_fn=store_cache_key(_build_key), **RESULTS)
def build(
    store_root: str,
    extracted: dict[str, str],
    best: dict[str, str] | None,
    target: str,
    label: str = "tuned",
    cache: str = "on",
    vta_tuned: list[dict[str, str]] | None = None,
) -> dict[str, str]:
    """`vta_tuned`: the tuned VTA tasks whose best knobs the offloaded convs are built with."""
    store = open_store(store_root, cache)
    best_art = artifact(store, best) if best else None
    vta_arts = [artifact(store, r) for r in vta_tuned] if vta_tuned else None
    return steps.build_step(store, artifact(store, extracted), best_art, resolve_target(target), vta_arts).ref()


def _eval_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    return (
        store,
        "evaluate",
        steps.evaluate_key(
            store,
            current_id(store, p["built"]),
            current_id(store, p["fetched"]),
            EvalConfig(**p["evaluate"]),
            p["board_key"],
        ),
    )


@task(
    name="upload-evaluate",
    task_run_name="evaluate-{label}",
    cache_key_fn=store_cache_key(_eval_key),
    **RESULTS,
    **RETRY,
)
def evaluate(
    store_root: str,
    built: dict[str, str],
    fetched: dict[str, str],
    target: str,
    tracker: str,
    board_key: str,
    evaluate: dict[str, Any],
    label: str = "tuned",
    cache: str = "on",
) -> dict[str, str]:
    from vta_pipeline.config import parse_hostport

    store = open_store(store_root, cache)
    art = steps.evaluate_step(
        store,
        artifact(store, built),
        artifact(store, fetched),
        resolve_target(target),
        parse_hostport(tracker),
        board_key,
        EvalConfig(**evaluate),
    )
    return art.ref()


@task(name="compare-runtime", **RETRY)
def compare_runtime(
    store_root: str,
    config: dict[str, Any],
    target: str,
    built: dict[str, str],
    fetched: dict[str, str],
    tracker: str,
    board_key: str,
    threads: int | None,
    cache: str = "on",
) -> dict[str, Any]:
    """The tuned build and ONNX Runtime in turn on the board's cores; not cached (a timing
    belongs to its minutes)."""
    from vta_pipeline.config import PipelineConfig, parse_hostport

    store = open_store(store_root, cache)
    return steps.compare_runtime(
        PipelineConfig.model_validate(config),
        resolve_target(target),
        artifact(store, built),
        artifact(store, fetched),
        parse_hostport(tracker),
        board_key,
        threads,
    )
