"""Workload keys: what makes two tuning tasks "the same workload", and the migration to them.

A task is keyed by the structural hash of its TIR module, the identity MetaSchedule's own
database matches records on. Until extract VERSION 3 the key was a hash of the module's
JSON text, which also depends on how the graph around the task was built: resnet18's stem
conv had two keys in its fp32 and its int8 graph although its TIR is identical, so it was
tuned twice, and history and warm starts missed it across models.

`migrate(store_work)` moves work dirs written under the old keys to the new ones, once, so
an upgraded store keeps every record it has: a dir is renamed to its structural key (read
from its own database: MetaSchedule writes the workload's structural hash there), and
dirs that turn out to hold the same workload are merged into one (records appended, trial
rows renumbered and marked with the key and trial they were measured under, so the
history, which identifies a measurement by them, does not count them twice). Each move
is logged in `work/tune/workload_keys.jsonl`; `aliases()` reads it so history queries by
the new key find rows recorded under the old ones.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from ..search.trial_log import read_trials
from ..search.work_dir import WorkDir
from .artifacts import atomic_write_text

log = logging.getLogger(__name__)

HASH_MASK = 0xFFFFFFFFFFFFFFFF
LOG = "workload_keys.jsonl"
MERGED = ".merged"  # under work/tune/: dirs whose records were merged into another, kept

_migrated: set[str] = set()
_lock = threading.Lock()


def workload_key(mod) -> str:
    """The key of a task's TIR module: its structural hash, as 16 hex digits."""
    from tvm_ffi import structural_hash

    return f"{structural_hash(mod) & HASH_MASK:016x}"


def key_of_work_dir(work_dir: Path) -> str | None:
    """The structural key of the workload a work dir tuned, read from its database, or None
    (no workload committed yet)."""
    p = Path(work_dir) / WorkDir.WORKLOADS
    if not p.exists():
        return None
    with open(p) as f:
        first = f.readline()
    try:
        shash = json.loads(first)[0]
        return f"{int(shash) & HASH_MASK:016x}"
    except (ValueError, IndexError, TypeError):
        return None


def _split(name: str) -> tuple[str, str | None]:
    key, _, session = name.partition("@")
    return key, (session or None)


def migrate(store_work: Path) -> list[dict[str, Any]]:
    """Move every work dir under `store_work/tune/` to its structural key; return the moves.

    Idempotent and cheap once done (one readline per work dir). Dirs locked by a tuning
    run are left for a later call."""
    from filelock import FileLock, Timeout

    tune = Path(store_work) / "tune"
    tag = str(tune.resolve())
    with _lock:
        if tag in _migrated or not tune.is_dir():
            return []
        moves: list[dict[str, Any]] = []
        with FileLock(str(tune / ".workload_keys.lock")):
            for scope in sorted(p for p in tune.iterdir() if p.is_dir() and not p.name.startswith(".")):
                for d in sorted(p for p in scope.iterdir() if p.is_dir()):
                    old, session = _split(d.name)
                    new = key_of_work_dir(d)
                    if new is None or new == old:
                        continue
                    target = scope / (new if session is None else f"{new}@{session}")
                    try:
                        with FileLock(str(d / "lock"), timeout=0):
                            move = _move(d, target, tune)
                    except Timeout:
                        log.warning("work dir %s is being tuned: its key is migrated on a later run", d)
                        continue
                    move.update(scope=scope.name, old=old, new=new, session=session, at=time.time())
                    moves.append(move)
                    with open(tune / LOG, "a") as f:
                        f.write(json.dumps(move) + "\n")
                    log.info("work dir %s: workload key %s -> %s (%s)", d, old, new, move["how"])
        _migrated.add(tag)
        return moves


def _move(src: Path, dst: Path, tune: Path) -> dict[str, Any]:
    rows = read_trials(src)
    old, _ = _split(src.name)
    if not dst.exists():
        _write_rows(src / WorkDir.TRIALS, [_mark(r, old, r.get("trial")) for r in rows], rows)
        os.replace(src, dst)
        return {"how": "renamed", "trials": len(rows)}
    # Two old keys, one workload: append src's records and trials to dst, keep src aside.
    dst_rows = read_trials(dst)
    _merge_database(src, dst)
    start = len(dst_rows)
    merged = [_mark(dict(r, trial=start + i), old, r.get("trial")) for i, r in enumerate(rows)]
    _write_rows(dst / WorkDir.TRIALS, dst_rows + merged, None)
    for name in (WorkDir.DEFAULT, WorkDir.STATE, WorkDir.WARM_START):
        if (src / name).exists() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)
    aside = tune / MERGED / src.parent.name / src.name
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, aside)
    return {"how": f"merged (the old dir is kept in {aside})", "trials": len(rows)}


def _mark(row: dict[str, Any], key: str, trial: Any) -> dict[str, Any]:
    """A trial row remembers the key and trial it was measured under (the history's identity)."""
    if "measured_key" in row:  # already migrated once
        return row
    return dict(row, measured_key=key, measured_trial=trial)


def _write_rows(p: Path, rows: list[dict[str, Any]], unchanged: list[dict[str, Any]] | None) -> None:
    if unchanged is not None and rows == unchanged or (not rows and not p.exists()):
        return
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in rows))


def _merge_database(src: Path, dst: Path) -> None:
    """Append src's tuning records to dst's MetaSchedule JSON database, workload indices remapped."""

    def workloads(d: Path) -> list[str]:
        p = d / WorkDir.WORKLOADS
        return [ln for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []

    src_wl, dst_wl = workloads(src), workloads(dst)
    dst_index = {json.loads(ln)[0]: i for i, ln in enumerate(dst_wl)}
    remap = {}
    for i, ln in enumerate(src_wl):
        shash = json.loads(ln)[0]
        if shash not in dst_index:
            dst_index[shash] = len(dst_wl)
            dst_wl.append(ln)
        remap[i] = dst_index[shash]
    atomic_write_text(dst / WorkDir.WORKLOADS, "".join(ln + "\n" for ln in dst_wl))
    rec = src / WorkDir.RECORDS
    lines = []
    for ln in rec.read_text().splitlines() if rec.exists() else []:
        try:
            idx, _ = json.loads(ln)
            lines.append(f"[{remap[idx]},{ln.split(',', 1)[1]}")  # the record's own text, not re-encoded
        except (ValueError, KeyError, TypeError, IndexError):
            continue  # corrupted: search.database.repair_database had set such lines aside already
    if lines:
        with open(dst / WorkDir.RECORDS, "a") as f:
            f.write("".join(ln + "\n" for ln in lines))


def aliases(store_root: Path) -> dict[str, str]:
    """Old workload key -> structural key, for every work dir migrated in this store."""
    p = Path(store_root) / "work" / "tune" / LOG
    out: dict[str, str] = {}
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                m = json.loads(line)
                out[m["old"]] = m["new"]
            except (ValueError, KeyError):
                continue
    return out


def keys_of(store_root: Path, key: str) -> list[str]:
    """`key` and every old key that was migrated to it."""
    return [key, *sorted(old for old, new in aliases(store_root).items() if new == key)]
