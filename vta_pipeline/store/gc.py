"""Keeping a store's size bounded: `vta-pipeline store gc`, and the free-space check a night
starts with.

A nightly store grows by a build of tens of MB per model and night, board and run logs, and
whatever a crash left half-written. What gc may drop is what can be recomputed or was kept
only for inspection; what it never drops is what a night cannot get back:

* kept always: every tuning work dir (trial logs and records: hours of measurements), the
  history, runs/*.json, current/ and the builds it points at, the fastest correct tuned build
  of every (model, variant, target, board key) in the history (what the regression guard
  falls back to), every artifact that is not a build (fetch, extract, tune ...: small), and
  anything younger than `keep_days`;
* dropped when older than `keep_days`: other builds (a rerun rebuilds one from the records in
  seconds to minutes), quarantined artifacts and history parts, half-written step outputs
  (`steps/*/.tmp/`) and history staging dirs of crashed processes, board and run logs;
* compacted: a night's history parts (one per run and task batch) into one part per night.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

DAY_S = 86400.0


class StoreFull(ConfigError):
    """The store's filesystem has less free space than a night needs."""


@dataclass
class Removal:
    path: Path
    bytes: int
    why: str


@dataclass
class GcReport:
    removed: list[Removal] = field(default_factory=list)
    kept_builds: dict[str, str] = field(default_factory=dict)  # build id -> why it stays
    compacted_parts: int = 0  # history parts merged away
    dry_run: bool = False

    @property
    def freed_bytes(self) -> int:
        return sum(r.bytes for r in self.removed)


def _size(p: Path) -> int:
    if p.is_file() or p.is_symlink():
        return p.lstat().st_size
    return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def _age_s(p: Path, now: float) -> float:
    """Seconds since anything under `p` last changed (a live process's output is young)."""
    newest = p.lstat().st_mtime
    if p.is_dir():
        for f in p.rglob("*"):
            try:
                newest = max(newest, f.lstat().st_mtime)
            except FileNotFoundError:
                continue
    return now - newest


def protected_builds(store_root: Path) -> dict[str, str]:
    """Build artifact ids gc keeps whatever their age, each with why: the builds current/ points
    at, and the fastest correct tuned build of each (model, variant, target, board key)."""
    from . import history

    keep: dict[str, str] = {}
    for rec in sorted((Path(store_root) / "current").glob("*.json")):
        try:
            build_id = json.loads(rec.read_text()).get("build_id")
        except ValueError:
            continue  # a torn record: guard.read_current names it; the best builds below still stand
        if build_id:
            keep[build_id] = f"current ({rec.stem})"
    best: dict[tuple, dict[str, Any]] = {}
    for row in history.evaluations(store_root):
        if row.get("build") != "tuned" or not row.get("correct") or not row.get("build_id"):
            continue
        k = (row.get("model"), row.get("variant"), row.get("target"), row.get("board_key"))
        if k not in best or row["mean_ms"] < best[k]["mean_ms"]:
            best[k] = row
    for (model, var, target, key), row in best.items():
        keep.setdefault(row["build_id"], f"best {model} {var} on {target}/{key} ({row['night']})")
    return keep


def _candidates(root: Path, keep_builds: dict[str, str]) -> list[tuple[Path, str]]:
    """(path, why) of everything gc may remove once old enough."""
    out: list[tuple[Path, str]] = []
    steps = root / "steps"
    for tmp in sorted(steps.glob("*/.tmp/*")):
        out.append((tmp, "half-written step output of a stopped process"))
    for d in sorted((steps / "build").glob("*")) if (steps / "build").is_dir() else ():
        if d.name.startswith("."):
            continue
        try:
            build_id = json.loads((d / "manifest.json").read_text()).get("artifact_id")
        except (OSError, ValueError):
            build_id = None  # no whole manifest: a lookup would quarantine it anyway
        if build_id not in keep_builds:
            out.append((d, "build not current and not the best of its variant (a rerun rebuilds it)"))
    for q in sorted((root / "quarantine").glob("*")):
        out.append((q, "quarantined artifact"))
    hist = root / "history"
    for q in sorted((hist / "quarantine").rglob("*.parquet")) if (hist / "quarantine").is_dir() else ():
        out.append((q, "quarantined history part"))
    for s in sorted(hist.glob(".staging-*")):
        out.append((s, "history staging dir of a stopped process"))
    for lg in sorted((root / "logs").glob("*.log")):
        out.append((lg, "log"))
    return out


def compact_history(store_root: Path, dry_run: bool = False) -> int:
    """Merge each night's Parquet parts of each history dataset into one part; returns how many
    parts were merged away. Writers are held off by the dataset's append lock; the new part is
    renamed in before the old ones go, so a reader never misses a row (one that lists the
    directory in between may count a night's rows twice, until its next read)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from filelock import FileLock

    from . import history
    from .artifacts import durable_replace, fsync_dir

    merged = 0
    for name, schema in (
        (history.MEASUREMENTS, history.MEASUREMENT_SCHEMA),
        (history.EVALUATIONS, history.EVALUATION_SCHEMA),
    ):
        base = history.history_dir(store_root) / name
        if not base.is_dir():
            continue
        with FileLock(str(history.history_dir(store_root) / f".{name}.lock")):
            good = set(history._whole_parts(store_root, name))
            for night_dir in sorted(p for p in base.glob("night=*") if p.is_dir()):
                parts = sorted(p for p in night_dir.glob("*.parquet") if p in good)
                if len(parts) < 2:
                    continue
                merged += len(parts) - 1
                if dry_run:
                    continue
                file_schema = pa.schema([f for f in schema if f.name != "night"])
                # parts written before a column existed read it as null
                table = ds.dataset([str(p) for p in parts], format="parquet", schema=file_schema).to_table()
                tmp = night_dir / f".compact-{uuid.uuid4().hex}.tmp"
                pq.write_table(table, tmp)
                durable_replace(tmp, night_dir / f"part-{int(time.time())}-compact-{uuid.uuid4().hex[:8]}.parquet")
                for p in parts:
                    p.unlink()
                fsync_dir(night_dir)
    return merged


def collect(
    store_root: Path, keep_days: float = 14.0, dry_run: bool = False, now: float | None = None, compact: bool = True
) -> GcReport:
    """Remove what the module docstring lists as droppable and older than `keep_days`."""
    if keep_days < 0:
        raise ConfigError(f"--keep-days must be 0 or more, got {keep_days}")
    root = Path(store_root)
    if not (root / "steps").is_dir():
        raise ConfigError(f"{root} is not a vta-pipeline store (no steps/ in it): pass the store with --store")
    now = time.time() if now is None else now
    report = GcReport(dry_run=dry_run, kept_builds=protected_builds(root))
    for path, why in _candidates(root, report.kept_builds):
        try:
            if _age_s(path, now) < keep_days * DAY_S:
                continue
            size = _size(path)
        except FileNotFoundError:
            continue  # a concurrent run renamed or removed it
        report.removed.append(Removal(path, size, why))
        if dry_run:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if compact:
        report.compacted_parts = compact_history(root, dry_run=dry_run)
    return report


# ---- free space ----------------------------------------------------------------------------------
def check_free_space(store_root: Path, min_free_gib: float) -> float:
    """The free GiB on the store's filesystem; StoreFull, naming the fix, below `min_free_gib`.

    Checked before a night starts, so a nearly full disk fails in a second with what to do
    instead of hours later at a write (which is still handled: a full disk mid-night ends the
    run with one message, and every batch measured before it is kept)."""
    root = Path(store_root)
    probe = root if root.exists() else next((p for p in root.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free / 2**30
    if free < min_free_gib:
        raise StoreFull(
            f"the store {root} has {free:.2f} GiB free on its filesystem, and a night needs at least "
            f"{min_free_gib:g} GiB (min_free_gib in --config): run `vta-pipeline store gc --store {root}` "
            "or free space on that disk, then rerun"
        )
    return free


def disk_full(exc: BaseException) -> OSError | str | None:
    """The ENOSPC behind `exc` (itself, a cause or a context: Prefect and TVM re-raise what they
    caught), or TVM's message of one (its C++ writes report errno as text); None otherwise."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        if os.strerror(errno.ENOSPC) in str(e):
            return str(e).strip().splitlines()[-1]
        e = e.__cause__ or e.__context__
    return None


def disk_full_message(store_root: Path, err: OSError | str) -> str:
    """What a run that hit a full disk says: one line, naming the fix."""
    where = f"{err.filename or store_root}: {os.strerror(err.errno)}" if isinstance(err, OSError) else err
    return (
        f"the disk is full ({where}). Every batch measured before it is kept in the store {store_root}: "
        f"free space (`vta-pipeline store gc --store {store_root}` drops old builds, logs and leftovers) "
        "and rerun the same command to continue"
    )
