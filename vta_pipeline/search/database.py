"""A tuning task's MetaSchedule database: records in and out as JSON, warm-start seeds, repair
after a kill, and the schedules already measured.

MetaSchedule's JSON database (`database_workload.json`, `database_tuning_record.json` in the
task's work dir) is what the build replays. A kill can tear its last line; a TVM upgrade
can make an old trace unreplayable; a warm start commits earlier sessions' records into a
fresh one. Each of those is handled here, never by failing the night.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..store.artifacts import atomic_write_text, read_json
from ..store.workload_keys import (
    HASH_MASK,  # schedule hashes as unsigned 64-bit, as the trial log writes them
)
from ..tir import int8_dot
from .trial_log import read_trials
from .work_dir import WorkDir

log = logging.getLogger(__name__)


def open_database(work_dir: Path, allow_missing: bool = True):
    """The task's (or a merged) MetaSchedule JSON database, with our tensor intrinsics
    registered first and records that no longer replay set aside.

    Opening the database replays every record's trace, and a tensorized trace names its
    intrinsic (`vta_pipeline.dot_16x4_vnni`, `vta_pipeline.depthwise_dot_16x4_vnni`), which
    TVM looks up in its registry there and then: in a fresh process (a resumed night whose
    graph pack came from the cache) an unregistered name failed the task before it searched.
    One record that does not replay (TVM changed a primitive, or we changed an intrinsic
    under its name) fails the whole open; `set_aside_unreplayable` then keeps the rest.
    Every database of ours is opened here, never with `JSONDatabase` directly."""
    from tvm.s_tir import meta_schedule as ms

    int8_dot.register()
    try:
        return ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=allow_missing)
    except Exception as first_error:
        if not set_aside_unreplayable(Path(work_dir)):
            raise first_error
    return ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=allow_missing)


def set_aside_unreplayable(work_dir: Path) -> int:
    """Move the records of `work_dir`'s database that do not replay on their workload into
    `database_tuning_record.json.unreplayable` (appended: nothing is thrown away), keep the
    rest; returns how many were set aside (0: the database's trouble is elsewhere)."""
    from tvm.s_tir import meta_schedule as ms

    rec_path, wl_path = work_dir / WorkDir.RECORDS, work_dir / WorkDir.WORKLOADS
    if not rec_path.exists() or not wl_path.exists():
        return 0
    workloads = read_workloads(wl_path)
    good, bad = [], []
    for line in rec_path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            idx, rec = json.loads(line)
            ms.database.TuningRecord.from_json(rec, workloads[idx])
            good.append(line)
        except Exception as e:
            bad.append((line, str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__))
    if bad:
        with open(rec_path.with_name(rec_path.name + ".unreplayable"), "a") as f:
            f.writelines(line + "\n" for line, _ in bad)
        atomic_write_text(rec_path, "".join(line + "\n" for line in good))
        log.warning(
            "%s: set aside %d record(s) that no longer replay in %s.unreplayable (first: %s); kept %d",
            rec_path,
            len(bad),
            rec_path.name,
            bad[0][1],
            len(good),
        )
    return len(bad)


def read_workloads(wl_path: Path) -> list:
    """The workloads of a database's `database_workload.json`, by line (a record's index);
    None for a line that does not parse (a torn line: `repair_database` sets those aside)."""
    from tvm.s_tir import meta_schedule as ms

    workloads = []
    for line in Path(wl_path).read_text().splitlines():
        try:
            workloads.append(ms.database.Workload.from_json(json.loads(line)))
        except Exception:
            workloads.append(None)
    return workloads


def record_json(candidate, workload, run_secs, target) -> Any:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api

    try:
        rec = ms.database.TuningRecord(candidate.sch.trace, workload, run_secs, target, candidate.args_info)
        return plain_json(_ffi_api.TuningRecordAsJSON(rec))
    except Exception:  # never lose the measurement over its record; but say so (warm starts need it)
        log.warning(
            "could not serialize a tuning record: the history keeps its latency but no warm-start seed", exc_info=True
        )
        return None


def plain_json(obj) -> Any:
    """MetaSchedule's record JSON as plain Python values.

    `TuningRecord.as_json` cannot do this for traces with a layout rewrite (weights packed
    at build time): their `TransformLayout` steps carry an `IndexMap`, which we write the
    way MetaSchedule's own JSON database does (TVM's JSON graph as a string), so that
    `TuningRecord.from_json` replays it."""
    import tvm
    from tvm.tirx import FloatImm, IndexMap, IntImm
    from tvm_ffi import Array, Map

    if obj is None or isinstance(obj, int | float):
        return obj
    if isinstance(obj, IntImm | FloatImm):
        return obj.value
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, IndexMap):
        return tvm.ir.save_json(obj)
    if isinstance(obj, Array | list | tuple):
        return [plain_json(i) for i in obj]
    if isinstance(obj, Map | dict):
        return {plain_json(k): plain_json(v) for k, v in obj.items()}
    raise TypeError(f"a tuning record holds a {type(obj).__name__}, which has no JSON form here")


def seed_database(db, workload_mod, seeds: list[Any]) -> int:
    """Commit earlier sessions' records (TuningRecord JSON) of this workload into `db`.

    Records that no longer replay (a TVM upgrade changed the schedule primitives) are
    skipped: a warm start is an optimisation, never a reason to fail. Returns how many
    records were seeded."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    workload = db.commit_workload(workload_mod)
    n = 0
    for js in seeds:
        try:
            rec = ms.database.TuningRecord.from_json(js, workload)
            rec.trace.apply_to_schedule(Schedule(workload_mod), remove_postproc=False)
        except Exception as e:
            log.info("warm start: skipped a record that does not replay (%s)", str(e).splitlines()[0][:200])
            continue
        db.commit_tuning_record(rec)
        n += 1
    return n


# ---- corrupted records ---------------------------------------------------------------------------
def repair_database(work_dir: Path) -> list[str]:
    """Set aside lines of the task's database files that do not parse; keep the rest.

    Returns one message per file repaired (file name and line numbers); the bad lines are
    appended to `<file>.corrupt` so nothing is thrown away."""
    msgs = []
    wl_path = Path(work_dir) / WorkDir.WORKLOADS
    rec_path = Path(work_dir) / WorkDir.RECORDS
    n_workloads = 0
    for path, check in ((wl_path, _valid_workload_line), (rec_path, None)):
        if not path.exists():
            continue
        good, bad = [], []
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            ok = check(line) if check else _valid_record_line(line, n_workloads)
            (good if ok else bad).append((i, line))
        if path is wl_path:
            n_workloads = len(good)
        if bad:
            with open(path.with_name(path.name + ".corrupt"), "a") as f:
                for i, line in bad:
                    f.write(line + "\n")
            atomic_write_text(path, "".join(line + "\n" for _, line in good))
            msgs.append(
                f"{path}: set aside {len(bad)} corrupted line(s) (line {', '.join(str(i) for i, _ in bad[:10])}) "
                f"in {path.name}.corrupt; kept {len(good)} valid line(s)"
            )
    return msgs


def _valid_workload_line(line: str) -> bool:
    try:
        v = json.loads(line)
        return isinstance(v, list) and len(v) == 2 and isinstance(v[1], str)
    except ValueError:
        return False


def _valid_record_line(line: str, n_workloads: int) -> bool:
    try:
        v = json.loads(line)
        return (
            isinstance(v, list)
            and len(v) == 2
            and isinstance(v[0], int)
            and 0 <= v[0] < n_workloads
            and isinstance(v[1], list)
            and len(v[1]) >= 2
        )
    except ValueError:
        return False


def _records(db) -> list:
    return list(db.get_all_tuning_records())


def known_hashes(db, workload_mod, work_dir: Path) -> set[int]:
    """Structural hashes of every schedule already measured for this workload: the
    database's records replayed, and every schedule our trial log holds (measured as
    proposed, failed ones included: a record replayed from the database does not always
    hash like the candidate that was measured, and a rerun must not measure it again)."""
    from tvm.s_tir import Schedule
    from tvm_ffi import structural_hash

    out = {int(r["schedule_hash"], 16) for r in read_trials(work_dir) if r.get("schedule_hash")}
    warm = Path(work_dir) / WorkDir.WARM_START
    if warm.exists():  # the seeds as they were measured in their own sessions
        out |= {int(h, 16) for h in (read_json(warm, {}) or {}).get("schedule_hashes", []) if h}
    for rec in _records(db):
        try:
            sch = Schedule(workload_mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            out.add(structural_hash(sch.mod) & HASH_MASK)
        except Exception:  # a trace that no longer replays: it cannot be proposed again either
            continue
    return out
