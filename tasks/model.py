"""Prefect tasks for the network-level steps: fetch, quantize, pack the model, extract its tasks."""

from __future__ import annotations

from typing import Any

from prefect import task

from vta_pipeline import steps
from vta_pipeline.config import ModelConfig, PackConfig, QuantizeConfig
from vta_pipeline.targets import resolve_target
from vta_pipeline.vta.config import VTAConfig

from .common import RESULTS, artifact, current_id, open_store, store_cache_key


def _fetch_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    return store, "fetch", steps.fetch_key(store, ModelConfig(**p["model"]))


@task(name="fetch-model", cache_key_fn=store_cache_key(_fetch_key), **RESULTS)
def fetch_model(store_root: str, model: dict[str, Any], cache: str = "on") -> dict[str, str]:
    store = open_store(store_root, cache)
    return steps.fetch_step(store, ModelConfig(**model)).ref()


def _quantize_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    cfg = QuantizeConfig(**p["quantize"])
    return store, "quantize", steps.quantize_key(store, current_id(store, p["model"]), cfg, p.get("seed", 0))


@task(name="quantize", cache_key_fn=store_cache_key(_quantize_key), **RESULTS)
def quantize_model(
    store_root: str, model: dict[str, str], quantize: dict[str, Any], seed: int = 0, cache: str = "on"
) -> dict[str, str]:
    store = open_store(store_root, cache)
    return steps.quantize_step(store, artifact(store, model), QuantizeConfig(**quantize), seed).ref()


def _pack_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    return (
        store,
        "pack",
        steps.pack_key(store, current_id(store, p["model"]), PackConfig(**p["pack"]), VTAConfig(**p["vta"])),
    )


@task(name="graph-pack", cache_key_fn=store_cache_key(_pack_key), **RESULTS)
def pack_model(
    store_root: str, model: dict[str, str], pack: dict[str, Any], vta: dict[str, Any], cache: str = "on"
) -> dict[str, str]:
    store = open_store(store_root, cache)
    return steps.pack_step(store, artifact(store, model), PackConfig(**pack), VTAConfig(**vta)).ref()


def _layout_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    return store, "cpu_layout", steps.layout_key(store, current_id(store, p["model"]), p["config"])


@task(name="cpu-layout", cache_key_fn=store_cache_key(_layout_key), **RESULTS)
def layout_model(store_root: str, model: dict[str, str], config: dict[str, Any], cache: str = "on") -> dict[str, str]:
    store = open_store(store_root, cache)
    return steps.layout_step(store, artifact(store, model), config).ref()


def _extract_key(p):
    store = open_store(p["store_root"], p.get("cache", "on"))
    vta = VTAConfig(**p["vta"]) if p.get("vta") else None
    return store, "extract", steps.extract_key(store, current_id(store, p["fetched"]), resolve_target(p["target"]), vta)


@task(name="extract-tasks", cache_key_fn=store_cache_key(_extract_key), **RESULTS)
def extract_tasks(
    store_root: str, fetched: dict[str, str], target: str, cache: str = "on", vta: dict[str, Any] | None = None
) -> dict[str, str]:
    """`vta`: the VTA config whose board runs the packed convs (target vta-sim)."""
    store = open_store(store_root, cache)
    return steps.extract_step(
        store, artifact(store, fetched), resolve_target(target), VTAConfig(**vta) if vta else None
    ).ref()
