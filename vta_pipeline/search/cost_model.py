"""One MetaSchedule cost model per target and board key, trained on every measurement the store holds.

Why: the flow tunes each task in a `tune_tasks` call of its own (one Prefect task run per
tuning task, resumable round by round), and MetaSchedule's XGBoost model predicts at random
until it has seen `num_warmup_samples` measurements (100 by default). A fresh model per task
and per round never got there at a night's budgets (tens of trials per task): the
evolutionary search picked its candidates at random, forgot each resumed task's own
earlier records, and forgot every earlier night. The stock `tune_tasks` over all tasks at
least shares one model across its tasks.

Here a process keeps one model per tuning scope (the store's `work/tune/<target>-<key>`
directory: the same target measured on the same kind of board), shared by every task
tuned in that process, concurrently or in turn, and bootstrapped from the records already
on disk in that scope (other tasks, other models, earlier nights, other processes). The
records are the state, not a saved model file: nothing to go stale or corrupt, and a
record that no longer replays (TVM upgrade) is skipped.

Bookkeeping: records are ingested by line count per work dir. A work dir being tuned in
this process is not read from disk while its round runs (its measurements reach the model
through MetaSchedule's own `update` calls); when the round ends its line count is taken as
ingested.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .work_dir import WorkDir

log = logging.getLogger(__name__)

WARMUP_SAMPLES = 32
"""Measurements before the model's predictions replace random scores (MetaSchedule: 100).

A night tunes 8-64 trials per task in batches of 4-8; with the model shared across the
store's tasks 32 measurements are a few tasks' worth, and the XGBoost objective ranks
schedules within a workload (cost relative to the workload's best), which it learns from
few samples per workload."""

RECORDS = WorkDir.RECORDS
WORKLOADS = WorkDir.WORKLOADS


@dataclass
class _Scope:
    model: Any  # ms.cost_model.XGBModel
    lock: threading.Lock = field(default_factory=threading.Lock)
    ingested: dict[str, int] = field(default_factory=dict)  # work dir name -> record lines read
    active: set[str] = field(default_factory=set)  # work dirs tuning in this process now
    samples: int = 0


_scopes: dict[tuple[str, str], _Scope] = {}
_scopes_lock = threading.Lock()


def _scope_for(scope_dir: Path, target) -> _Scope:
    from tvm.s_tir import meta_schedule as ms

    key = (str(Path(scope_dir).resolve()), json.dumps(dict(target.export()), sort_keys=True, default=str))
    with _scopes_lock:
        if key not in _scopes:
            _scopes[key] = _Scope(ms.cost_model.XGBModel(num_warmup_samples=WARMUP_SAMPLES, num_tuning_cores=1))
        return _scopes[key]


def _record_line_count(work_dir: Path) -> int:
    rec_file = work_dir / RECORDS
    return len(rec_file.read_text().splitlines()) if rec_file.exists() else 0


def _read_records(work_dir: Path, skip: int) -> tuple[list[tuple[Any, Any]], int]:
    """(workload, record) pairs after the first `skip` record lines, and the line count."""
    from tvm.s_tir import meta_schedule as ms

    from ..tir import int8_dot
    from .database import read_workloads

    int8_dot.register()  # tensorized records name our intrinsics: unregistered, they would not parse

    rec_file, wl_file = work_dir / RECORDS, work_dir / WORKLOADS
    if not rec_file.exists() or not wl_file.exists():
        return [], 0
    lines = rec_file.read_text().splitlines()
    if len(lines) <= skip:
        return [], len(lines)
    workloads = read_workloads(wl_file)
    out = []
    for line in lines[skip:]:
        try:
            idx, rec_json = json.loads(line)
            wl = workloads[idx]
            if wl is not None:
                out.append((wl, ms.database.TuningRecord.from_json(rec_json, wl)))
        except Exception:
            continue
    return out, len(lines)


def _ingest(scope: _Scope, work_dir: Path, target) -> int:
    """Train on the records of `work_dir` not seen yet; returns how many were added."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm_ffi import structural_hash

    pairs, n_lines = _read_records(work_dir, scope.ingested.get(work_dir.name, 0))
    scope.ingested[work_dir.name] = n_lines
    groups: dict[int, tuple[Any, list, list]] = {}
    for wl, rec in pairs:
        secs = [float(s) for s in (rec.run_secs or [])]
        if not secs or min(secs) >= 1e9:  # a failed measurement: no latency to learn from
            continue
        try:
            sch = Schedule(wl.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
        except Exception:  # does not replay in this TVM: nothing to learn
            continue
        g = groups.setdefault(structural_hash(wl.mod), (wl.mod, [], []))
        g[1].append(ms.search_strategy.MeasureCandidate(sch, rec.args_info))
        g[2].append(ms.runner.RunnerResult(run_secs=rec.run_secs, error_msg=None))
    added = 0
    for mod, candidates, results in groups.values():
        ctx = ms.TuneContext(mod=mod, target=target, task_name="cost-model-bootstrap", num_threads=1)
        scope.model.update(ctx, candidates, results)
        added += len(candidates)
    return added


def _sync(scope: _Scope, scope_dir: Path, target) -> int:
    added = 0
    for work_dir in sorted(p for p in Path(scope_dir).iterdir() if p.is_dir()):
        if work_dir.name not in scope.active:
            added += _ingest(scope, work_dir, target)
    scope.samples += added
    return added


def _locked_model(scope: _Scope):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import PyCostModel

    @derived_object
    class SharedCostModel(PyCostModel):
        """The scope's XGBoost model behind a lock: Prefect runs tasks in threads."""

        def load(self, path: str) -> None:
            with scope.lock:
                scope.model.load(path)

        def save(self, path: str) -> None:
            with scope.lock:
                scope.model.save(path)

        def update(self, context, candidates, results) -> None:
            with scope.lock:
                scope.model.update(context, candidates, results)
                scope.samples += len(candidates)

        def predict(self, context, candidates):
            with scope.lock:
                return scope.model.predict(context, candidates)

    return SharedCostModel()


@contextmanager
def lease(work_dir: Path, target) -> Iterator[Any]:
    """The shared cost model for tuning `work_dir` (one task's records) on `target`.

    Trains it first on every record in the scope not seen yet, this task's own earlier
    records included; yields a MetaSchedule cost model to pass to `tune_tasks`."""
    work_dir = Path(work_dir)
    scope = _scope_for(work_dir.parent, target)
    with scope.lock:
        added = _sync(scope, work_dir.parent, target)
        scope.active.add(work_dir.name)
        total = scope.samples
    if added:
        log.info(
            "cost model for %s: trained on %d more record(s) from the store (%d in all)",
            work_dir.parent.name,
            added,
            total,
        )
    try:
        yield _locked_model(scope)
    finally:
        with scope.lock:
            scope.active.discard(work_dir.name)
            # this round's records came in through update(): count them as read
            scope.ingested[work_dir.name] = _record_line_count(work_dir)


def samples(work_dir: Path, target) -> int:
    """Measurements the shared model of `work_dir`'s scope has learned from (for tests and logs)."""
    return _scope_for(Path(work_dir).parent, target).samples


def reset() -> None:
    """Forget every scope's model (a test's fresh process, in effect)."""
    with _scopes_lock:
        _scopes.clear()
