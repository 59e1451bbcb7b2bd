"""What every task wrapper shares: store-backed cache keys and the board-fault retry rule.

Prefect's cache key for a step is the store's content key plus the id of the verified
artifact it points at. When the store has no valid artifact (never computed, deleted or
edited behind our back), the key function returns None: Prefect does not reuse a stale
result and the task runs, recomputing through the store. Results are refs (paths and
ids), never TVM objects or arrays.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

from vta_pipeline.errors import ArtifactError, BoardError
from vta_pipeline.store.artifacts import Artifact, ArtifactStore, CachePolicy

KeyFn = Callable[[dict[str, Any]], tuple[ArtifactStore, str, str]]


def open_store(root: str, policy: str = "on") -> ArtifactStore:
    return ArtifactStore(Path(root), CachePolicy(policy))


def store_cache_key(key_fn: KeyFn):
    """Build a Prefect cache_key_fn from a function of the task's parameters.

    The key is the store's content key (scoped to the store's root). Prefect keeps its
    cache record for a key as a file of that name in the store's result storage; when the
    store has no verified artifact for the key (never computed, deleted or edited behind
    our back) that record is stale and is deleted, so Prefect runs the task and the store
    recomputes the artifact.
    """

    def cache_key(context, parameters: dict[str, Any]) -> str | None:
        store, step, key = key_fn(parameters)
        if store.policy not in (CachePolicy.ON, CachePolicy.READONLY):
            return None
        where = hashlib.sha256(str(store.root).encode()).hexdigest()[:8]
        prefect_key = f"{step}-{key}-{where}"
        record = results_dir(str(store.root)) / prefect_key
        if store.lookup(step, key) is None:
            record.unlink(missing_ok=True)
        else:
            vet_record(record)
        return prefect_key

    return cache_key


def current_id(store: ArtifactStore, ref: dict[str, str]) -> str:
    """The artifact id of an upstream ref as the store has it now (it may have been
    recomputed since the ref was cached)."""
    art = store.lookup(ref["step"], ref["key"])
    return art.id if art else ref["artifact_id"]


def artifact(store: ArtifactStore, ref: dict[str, str]) -> Artifact:
    """Re-open an upstream artifact from its ref, verifying it is still intact."""
    art = store.lookup(ref["step"], ref["key"])
    if art is None:
        raise ArtifactError(
            f"artifact {ref['step']}/{ref['key']} in {store.root} is missing or corrupted; "
            "rerun the flow: the step that produced it will recompute it"
        )
    return art


def is_board_fault(task, task_run, state) -> bool:
    """Retry only when the board or the tracker failed, never for bad input or bugs."""
    try:
        state.result()
    except BoardError:
        return True
    except Exception:
        return False
    return False


def retry_settings() -> dict[str, Any]:
    """Board-fault retries: VTA_PIPELINE_BOARD_RETRIES (default 2) and
    VTA_PIPELINE_RETRY_DELAYS (seconds, comma separated, default "30,120")."""
    retries = int(os.environ.get("VTA_PIPELINE_BOARD_RETRIES", "2"))
    delays = [float(x) for x in os.environ.get("VTA_PIPELINE_RETRY_DELAYS", "30,120").split(",") if x.strip()]
    return {"retries": retries, "retry_delay_seconds": delays or 0, "retry_condition_fn": is_board_fault}


RETRY = retry_settings()

# Results are small JSON refs; JSON (not pickle) so reading a result never runs code.
RESULTS = {"persist_result": True, "result_serializer": "json"}

_JSON_SERIALIZER = {
    "type": "json",
    "jsonlib": "json",
    "object_encoder": "prefect.serializers.prefect_json_object_encoder",
    "object_decoder": "prefect.serializers.prefect_json_object_decoder",
}
_TYPED = ("__class__", "__exc_type__")


def _typed(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in value for k in _TYPED) or any(_typed(v) for v in value.values())
    if isinstance(value, list):
        return any(_typed(v) for v in value)
    return False


def vet_record(record: Path) -> bool:
    """Whether Prefect may read this cached result record; one it may not is removed (the task
    then runs and takes its artifact from the store, verified).

    A record names its own serializer, and Prefect honours it: a record edited to say
    "pickle" runs code when read, and even the JSON decoder imports and constructs any class
    a `__class__` or `__exc_type__` key names. Ours are JSON refs (paths and ids, plain
    dicts): anything else in the store's result storage was not written by these tasks."""
    if not record.exists():
        return True
    import json
    import logging

    try:
        rec = json.loads(record.read_text())
        meta = rec["metadata"]
        ser = meta["serializer"]
        ok = (
            all(ser.get(k) == v for k, v in _JSON_SERIALIZER.items())
            and meta.get("storage_block_id") is None
            and isinstance(rec["result"], str)
            and not _typed(json.loads(rec["result"]))
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        logging.getLogger("vta_pipeline").warning(
            "cached result record %s is not a plain JSON ref as these tasks write them (a serializer or a typed "
            "value that would run code when read): removed unread; the step's artifact comes from the store",
            record,
        )
        record.unlink(missing_ok=True)
    return ok


def results_dir(store_root: str) -> Path:
    """Prefect result storage lives in the store it describes."""
    d = Path(store_root) / "prefect-results"
    d.mkdir(parents=True, exist_ok=True)
    return d
