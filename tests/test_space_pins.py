"""What every store already holds, pinned: moving or renaming code must not change it.

A space's label and `space_versions()` are written into every tuning work dir's state and
every tune step's key; a task's workload hash names its work dir; a design space's traces
are what stored records replay onto. Any of them changing silently re-tunes (or fails to
replay) every store made before. This test recomputes them on a fixed set of networks and
targets (tinynet, fp32 and int8, with and without Winograd, AVX2 and AVX-512 VNNI, graph
pack) and compares them with `data/space_pins.json`, written at commit 19d9ab9 (before the
house was redrawn, issue 55).

A deliberate change of a space (a new version) updates the pins: rerun with
`VTA_PIPELINE_REPIN=1` and commit the file with the change that explains it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from vta_pipeline import steps
from vta_pipeline.config import build_config
from vta_pipeline.extract import load_tasks
from vta_pipeline.spaces import design_space
from vta_pipeline.spaces import label as space_label
from vta_pipeline.spaces import versions as space_versions
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target
from vta_pipeline.tir import intrin_registry

PINS = Path(__file__).resolve().parent / "data" / "space_pins.json"
ZNVER3 = '{"preset": "host", "target": {"mcpu": "znver3", "num-cores": 2}}'  # AVX2
VNNI = '{"preset": "host", "target": {"mcpu": "cascadelake", "num-cores": 2}}'  # AVX-512 VNNI: compiled, not run
CONFIGS = {
    "fp32-O1-avx2": {"target": ZNVER3, "opt": "O1"},
    "fp32-O2-avx2-winograd": {"target": ZNVER3, "opt": "O2"},
    "int8-O1-avx2": {"target": ZNVER3, "opt": "O1", "quantize.enabled": True},
    "int8-O1-vnni": {"target": VNNI, "opt": "O1", "quantize.enabled": True},
    "fp32-graph-pack-avx2": {"target": ZNVER3, "opt": "O1", "pack.enabled": True},
}
SEED = 20261207


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _observe(store: ArtifactStore, overrides: dict) -> dict:
    """{task name: {workload_hash, label, traces}} of tinynet's tasks under `overrides`."""
    cfg = build_config(None, {"model.source": "builtin", "model.name": "tinynet", **overrides})
    target = resolve_target(cfg.target)
    cfg = steps.with_defaults(cfg, target)
    model = steps.prepare_model(store, cfg, target=target)
    extracted = steps.extract_step(store, model, target, steps.offload_config(cfg, target))
    tvm_target = tvm.target.Target(target.full_json)
    out = {}
    for task in load_tasks(extracted.path):
        wl = tvm.ir.load_json((extracted.path / task.file).read_text())
        ctx = ms.TuneContext(
            mod=wl,
            target=tvm_target,
            space_generator=design_space(tvm_target, wl),
            task_name=task.name,
            rand_state=SEED,
        )
        traces = [_digest(str(sch.trace)) for sch in ctx.generate_design_space()]
        out[task.name] = {"workload_hash": task.workload_hash, "label": space_label(tvm_target, wl), "traces": traces}
    return out


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    intrin_registry.load()
    store = ArtifactStore(tmp_path_factory.mktemp("pins"))
    seen = {
        "space_versions": space_versions(),
        "configs": {name: _observe(store, overrides) for name, overrides in CONFIGS.items()},
    }
    if os.environ.get("VTA_PIPELINE_REPIN") == "1":
        PINS.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
    return seen


def test_every_space_version_is_what_stores_hold(observed):
    assert observed["space_versions"] == json.loads(PINS.read_text())["space_versions"]


@pytest.mark.parametrize("config", CONFIGS)
def test_each_task_keeps_its_workload_hash_space_label_and_design_space_traces(observed, config):
    pinned = json.loads(PINS.read_text())["configs"][config]
    seen = observed["configs"][config]
    assert sorted(seen) == sorted(pinned), "the network's tasks changed"
    for name, pin in pinned.items():
        assert seen[name]["workload_hash"] == pin["workload_hash"], (name, "workload hash")
        assert seen[name]["label"] == pin["label"], (name, "space label")
        assert seen[name]["traces"] == pin["traces"], (name, "design space traces")


def test_the_pins_cover_every_space_we_own():
    labels = {t["label"].split(":")[0] for c in json.loads(PINS.read_text())["configs"].values() for t in c.values()}
    assert {"packed-conv", "winograd", "dense", "pool", "injective"} <= labels, labels
