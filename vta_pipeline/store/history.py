"""The history: every measurement and every evaluation of every run, as Parquet.

Two datasets in the store, partitioned by night (hive style, `night=2026-11-21/`), appended
by each run and never rewritten:

* `history/measurements/`: one row per tuning measurement (run, night, session, model,
  target, board key, task, workload key, trial, schedule hash, the replayable MetaSchedule
  record, latency, GFLOPS, error).
* `history/evaluations/`: one row per evaluated build (untuned / tuned latency, output
  check, tuning trials and time of the run).

Appending is idempotent: a measurement is identified by (target, board key, workload,
session, trial, time) and an evaluation by its evaluate artifact, so a flow retry or a
cached rerun that reports the same tuning again adds nothing. Readers are the
`vta-pipeline history` command, the warm start (best records per workload from earlier
sessions) and the regression guard (best night of a model's variant: `variant.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from filelock import FileLock

from ..search.work_dir import WorkDir
from . import variant, workload_keys
from .artifacts import durable_replace

MEASUREMENTS = "measurements"
EVALUATIONS = "evaluations"

MEASUREMENT_SCHEMA = pa.schema(
    [
        ("measurement_id", pa.string()),
        ("run_id", pa.string()),
        ("night", pa.string()),
        ("session", pa.string()),
        ("model", pa.string()),
        ("target", pa.string()),  # preset name or target JSON, as configured
        ("target_id", pa.string()),  # the exact TVM target (+host): records only replay on the same one
        ("board_key", pa.string()),
        ("task", pa.string()),
        ("workload_key", pa.string()),
        ("trial", pa.int32()),
        ("measured_at", pa.timestamp("ms", tz="UTC")),
        ("schedule_hash", pa.string()),
        ("record", pa.string()),  # MetaSchedule TuningRecord JSON (valid measurements)
        ("latency_ms", pa.float64()),
        ("gflops", pa.float64()),
        ("error", pa.string()),
        ("threads", pa.int32()),  # threads the board ran the candidate with (as it reported them)
        ("board", pa.string()),  # the board(s) under the key that measured it (boards.describe_boards)
        ("tvm_version", pa.string()),  # the TVM they ran; both null in rows before them or from stock servers
        ("emulated", pa.bool_()),  # measured on an emulated board (boards.emulator): qemu's time; null before it
    ]
)

EVALUATION_SCHEMA = pa.schema(
    [
        ("evaluation_id", pa.string()),
        ("run_id", pa.string()),
        ("night", pa.string()),
        ("model", pa.string()),
        ("target", pa.string()),
        ("target_id", pa.string()),
        ("board_key", pa.string()),
        ("build", pa.string()),  # untuned | tuned
        ("build_id", pa.string()),  # the build artifact: what "keep the previous best build" points at
        ("mean_ms", pa.float64()),
        ("median_ms", pa.float64()),
        ("std_ms", pa.float64()),
        ("correct", pa.bool_()),
        ("max_abs_err", pa.float64()),
        ("trials", pa.int64()),
        ("tuning_tasks", pa.int64()),
        ("run_seconds", pa.float64()),
        ("evaluated_at", pa.timestamp("ms", tz="UTC")),
        ("threads", pa.int32()),  # threads the board ran the network with (as it reported them)
        ("variant", pa.string()),  # variant.of the run's config (fp32 / int8, pack): null in rows before it
        ("board", pa.string()),  # the board that ran the network (its host name)
        ("tvm_version", pa.string()),  # the TVM it ran
        ("emulated", pa.bool_()),  # the board was emulated (boards.emulator): qemu's time; null in rows before it
    ]
)


def history_dir(store_root: Path) -> Path:
    return Path(store_root) / "history"


_log = logging.getLogger(__name__)
QUARANTINE = "quarantine"


def _whole_parts(store_root: Path, name: str) -> list[Path]:
    """The dataset's Parquet parts that open, after moving any that do not (0 bytes, or torn:
    a rename that reached the disk before its data did, on a power cut) to
    history/quarantine/, with one warning each: the rest of the history stays readable."""
    base = history_dir(store_root) / name
    good = []
    for part in sorted(base.rglob("*.parquet")):
        try:
            pq.read_metadata(part)
        except (OSError, pa.ArrowException) as e:
            dest = history_dir(store_root) / QUARANTINE / name / part.relative_to(base)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(part, dest)
            except FileNotFoundError:  # another reader moved it first
                continue
            _log.warning(
                "history part %s does not open (%s): moved to %s; the other parts are read. Its "
                "measurement rows come back with the next run over the same tuning tasks (they are "
                "keyed by content, and the trial logs keep them); evaluation rows in it are lost",
                part,
                str(e).splitlines()[0],
                dest,
            )
            continue
        good.append(part)
    return good


def _dataset(store_root: Path, name: str, schema: pa.Schema) -> ds.Dataset | None:
    base = history_dir(store_root) / name
    if not base.exists():
        return None
    parts = _whole_parts(store_root, name)
    if not parts:
        return None
    return ds.dataset(
        [str(p) for p in parts],
        format="parquet",
        schema=schema,
        partition_base_dir=str(base),
        partitioning=ds.partitioning(pa.schema([("night", pa.string())]), flavor="hive"),
    )


def read(
    store_root: Path, name: str, filter: ds.Expression | None = None, columns: list[str] | None = None
) -> pa.Table:
    """One history dataset as a table (empty, with the schema, when nothing was recorded)."""
    schema = MEASUREMENT_SCHEMA if name == MEASUREMENTS else EVALUATION_SCHEMA
    d = _dataset(store_root, name, schema)
    if d is None:
        t = schema.empty_table()
        return t.select(columns) if columns else t
    return d.to_table(filter=filter, columns=columns)


def _append(store_root: Path, name: str, schema: pa.Schema, id_col: str, rows: list[dict[str, Any]]) -> int:
    """Append rows whose id is not in the dataset yet; returns how many were written."""
    if not rows:
        return 0
    base = history_dir(store_root) / name
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(history_dir(store_root) / f".{name}.lock")):
        ids = {r[id_col] for r in rows}
        have = read(store_root, name, filter=pc.field(id_col).isin(list(ids)), columns=[id_col])
        known = set(have.column(id_col).to_pylist())
        fresh = [r for r in rows if r[id_col] not in known]
        if not fresh:
            return 0
        table = pa.Table.from_pylist(fresh, schema=schema)
        # Readers take no lock (a run reads the history while another appends): the parts
        # are written beside the dataset and renamed into it whole, so no reader ever opens
        # a part still being written ("Parquet magic bytes not found in footer").
        staging = history_dir(store_root) / f".staging-{name}-{uuid.uuid4().hex}"
        try:
            ds.write_dataset(
                table,
                staging,
                format="parquet",
                partitioning=ds.partitioning(pa.schema([("night", pa.string())]), flavor="hive"),
                basename_template=f"part-{int(time.time())}-{uuid.uuid4().hex[:8]}-{{i}}.parquet",
            )
            for part in sorted(staging.rglob("*.parquet")):
                dest = base / part.relative_to(staging)
                dest.parent.mkdir(parents=True, exist_ok=True)
                durable_replace(part, dest)  # a power cut must not leave a renamed part without its bytes
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return len(fresh)


# ---- writing a run ---------------------------------------------------------------------------------
def night_of(t: float | None = None) -> str:
    """The local calendar date of `t` (now): the default night of a run."""
    return time.strftime("%Y-%m-%d", time.localtime(t))


def _ts(seconds: float | None):
    return None if seconds is None else int(seconds * 1000)


def measurement_rows(run: dict[str, Any], tune_dir: Path) -> list[dict[str, Any]]:
    """Rows for every measurement in one tune artifact's trial log."""
    summary = json.loads((Path(tune_dir) / WorkDir.SUMMARY).read_text())
    log = Path(tune_dir) / WorkDir.TRIALS
    flops = summary.get("flops") or 0.0
    rows = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            t = json.loads(line)
        except ValueError:
            continue
        # A row migrated from an old workload key keeps the identity it was first recorded under.
        ident = json.dumps(
            [
                run["target_id"],
                run["board_key"],
                t.get("measured_key", summary["workload_hash"]),
                t.get("session"),
                t.get("measured_trial", t["trial"]),
                t.get("t"),
            ]
        )
        lat = t.get("latency_ms")
        rows.append(
            {
                "measurement_id": hashlib.sha256(ident.encode()).hexdigest()[:32],
                "run_id": run["run_id"],
                "night": run["night"],
                "session": t.get("session"),
                "model": run["model"],
                "target": run["target"],
                "target_id": run["target_id"],
                "board_key": run["board_key"],
                "task": summary["task"],
                "workload_key": summary["workload_hash"],
                "trial": t["trial"],
                "measured_at": _ts(t.get("t")),
                "schedule_hash": t.get("schedule_hash"),
                "record": json.dumps(t["record"]) if t.get("record") is not None else None,
                "latency_ms": lat,
                "gflops": flops / lat / 1e6 if lat and flops else None,
                "error": t.get("error"),
                "threads": t.get("threads"),
                "board": t.get("board"),
                "tvm_version": t.get("tvm"),
                "emulated": bool(run.get("emulated")) or "(emulated " in (t.get("board") or ""),
            }
        )
    return rows


def evaluation_rows(result: Any) -> list[dict[str, Any]]:
    """The two evaluation rows of a `report.RunResult` (typed as Any: the report reads the
    history for its plots, so the history does not import the report)."""
    rows = []
    for build, e in (("untuned", result.untuned), ("tuned", result.tuned)):
        rows.append(
            {
                "evaluation_id": e.evaluation_id or f"{result.run_id}-{build}",
                "run_id": result.run_id,
                "night": result.night,
                "model": result.model,
                "target": result.target,
                "target_id": result.target_id,
                "board_key": result.board_key,
                "build": build,
                "build_id": e.build_id,
                "mean_ms": e.mean_ms,
                "median_ms": e.median_ms,
                "std_ms": e.std_ms,
                "correct": e.correct,
                "max_abs_err": e.max_abs_err,
                "trials": result.trials,
                "tuning_tasks": len(result.tasks),
                "run_seconds": result.seconds,
                "evaluated_at": _ts(result.finished),
                "threads": e.threads,
                "variant": result.of_variant,
                "board": e.board_name,
                "tvm_version": e.tvm,
                "emulated": bool(e.emulated),
            }
        )
    return rows


def record_measurements(store_root: Path, run: dict[str, Any], tune_dirs: Iterable[Path]) -> int:
    """Append the measurements of tune artifacts; `run` names them (run_id, night, model,
    target, target_id, board_key). Returns the rows added."""
    m = [row for d in tune_dirs for row in measurement_rows(run, d)]
    return _append(store_root, MEASUREMENTS, MEASUREMENT_SCHEMA, "measurement_id", m)


def not_emulated() -> ds.Expression:
    """Rows measured on real boards (and rows from before the column, all of which were)."""
    return pc.field("emulated").is_null() | (pc.field("emulated") == False)  # noqa: E712 - an Arrow expression


def record_run(store_root: Path, result: Any, tune_dirs: Iterable[Path]) -> dict[str, int]:
    """Append a finished run's (`report.RunResult`) measurements and evaluations; returns the rows added."""
    return {
        MEASUREMENTS: record_measurements(store_root, dict(result.to_json(), emulated=result.emulated), tune_dirs),
        EVALUATIONS: _append(store_root, EVALUATIONS, EVALUATION_SCHEMA, "evaluation_id", evaluation_rows(result)),
    }


# ---- questions -------------------------------------------------------------------------------------
def _match(**eq: str | None) -> ds.Expression | None:
    expr = None
    for col, v in eq.items():
        if v is None:
            continue
        e = pc.field(col) == v
        expr = e if expr is None else expr & e
    return expr


def evaluations(store_root: Path, filter: ds.Expression | None = None) -> list[dict[str, Any]]:
    """Evaluation rows, each with its variant: rows recorded before the variant column get
    theirs from their run's result in the store (`runs/<run_id>.json`), else stay None."""
    rows = read(store_root, EVALUATIONS, filter=filter).to_pylist()
    of_run: dict[str, str | None] = {}
    for r in rows:
        if r["variant"] is None:
            if r["run_id"] not in of_run:
                try:
                    result = json.loads((Path(store_root) / "runs" / f"{r['run_id']}.json").read_text())
                    of_run[r["run_id"]] = variant.of_result(result)
                except (OSError, ValueError):
                    of_run[r["run_id"]] = None
            r["variant"] = of_run[r["run_id"]]
    return rows


def best_per_night(store_root: Path, model: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
    """Best correct tuned latency per (model, variant, target, board key, night), oldest night first."""
    f = _match(model=model, target=target, build="tuned")
    f = (pc.field("correct") == True) if f is None else f & (pc.field("correct") == True)  # noqa: E712
    by: dict[tuple, dict[str, Any]] = {}
    for r in evaluations(store_root, f):
        k = (r["model"], r["variant"], r["target"], r["board_key"], r["night"])
        row = by.setdefault(
            k,
            {
                "model": k[0],
                "variant": k[1],
                "target": k[2],
                "board_key": k[3],
                "night": k[4],
                "best_ms": r["mean_ms"],
                "runs": set(),
                "trials": r["trials"],
            },
        )
        row["best_ms"] = min(row["best_ms"], r["mean_ms"])
        row["runs"].add(r["run_id"])
        row["trials"] = max(row["trials"] or 0, r["trials"] or 0)
    rows = [dict(r, runs=len(r["runs"])) for r in by.values()]
    return sorted(rows, key=lambda r: (r["model"], r["variant"] or "", r["target"], r["board_key"], r["night"]))


def trend(store_root: Path, model: str, target: str | None = None) -> list[dict[str, Any]]:
    """Night by night for one model and each of its variants: best untuned and tuned latency
    and the speed-up."""
    by: dict[tuple, dict[str, Any]] = {}
    for r in evaluations(store_root, _match(model=model, target=target)):
        k = (r["variant"], r["target"], r["board_key"], r["night"])
        row = by.setdefault(
            k,
            {
                "variant": k[0],
                "target": k[1],
                "board_key": k[2],
                "night": k[3],
                "untuned_ms": None,
                "tuned_ms": None,
                "trials": 0,
            },
        )
        col = f"{r['build']}_ms"
        if r["build"] == "tuned" and not r["correct"]:
            continue
        if row[col] is None or r["mean_ms"] < row[col]:
            row[col] = r["mean_ms"]
        row["trials"] = max(row["trials"], r["trials"] or 0)
    out = sorted(by.values(), key=lambda r: (r["variant"] or "", r["target"], r["board_key"], r["night"]))
    for r in out:
        r["speedup"] = r["untuned_ms"] / r["tuned_ms"] if r["untuned_ms"] and r["tuned_ms"] else None
    return out


def best_per_workload(store_root: Path, target: str | None = None) -> list[dict[str, Any]]:
    """The best valid measurement of every workload over all nights (task, latency, night)."""
    f = pc.field("latency_ms").is_valid()
    if target is not None:
        f = f & (pc.field("target") == target)
    t = read(
        store_root,
        MEASUREMENTS,
        filter=f,
        columns=["target", "board_key", "workload_key", "task", "latency_ms", "gflops", "night", "model"],
    )
    if t.num_rows == 0:
        return []
    alias = workload_keys.aliases(store_root)
    if alias:  # rows recorded under a workload's old key count as that workload's
        t = t.set_column(
            t.schema.get_field_index("workload_key"),
            "workload_key",
            pa.array([alias.get(k, k) for k in t.column("workload_key").to_pylist()], pa.string()),
        )
    t = t.sort_by([("latency_ms", "ascending")])
    counts = {
        (r["target"], r["board_key"], r["workload_key"]): r["latency_ms_count"]
        for r in t.group_by(["target", "board_key", "workload_key"]).aggregate([("latency_ms", "count")]).to_pylist()
    }
    best: dict[tuple, dict[str, Any]] = {}
    for r in t.to_pylist():
        k = (r["target"], r["board_key"], r["workload_key"])
        if k not in best:
            best[k] = dict(r, measurements=counts[k])
    return sorted(best.values(), key=lambda r: (r["target"], r["board_key"], r["task"]))


def best_records(
    store_root: Path, workload_key: str, target_id: str, board_key: str, k: int, exclude_session: str | None = None
) -> tuple[list[Any], float | None, list[str]]:
    """Up to k best distinct records of a workload from earlier sessions, their best latency,
    and the schedule hashes they were measured under (a replayed record does not always hash
    like the candidate that was measured, and a seed must not be measured again).

    Only records measured on the same TVM target and board key: a schedule's speed on
    another board says little, and MetaSchedule's database ignores the target."""
    keys = workload_keys.keys_of(store_root, workload_key)  # rows recorded before a key migration too
    f = (
        pc.field("workload_key").isin(keys)
        & (pc.field("target_id") == target_id)
        & (pc.field("board_key") == board_key)
        & pc.field("record").is_valid()
    )
    if exclude_session is not None:
        f = f & (pc.field("session").is_null() | (pc.field("session") != exclude_session))
    t = read(store_root, MEASUREMENTS, filter=f, columns=["session", "schedule_hash", "record", "latency_ms"])
    if t.num_rows == 0:
        return [], None, []
    t = t.sort_by([("latency_ms", "ascending")])
    out, hashes, seen, best = [], [], set(), None
    for r in t.to_pylist():
        if r["schedule_hash"] in seen:
            continue
        seen.add(r["schedule_hash"])
        best = r["latency_ms"] if best is None else best
        if len(out) < k:
            out.append(json.loads(r["record"]))
            hashes.append(r["schedule_hash"])
    return out, best, hashes
