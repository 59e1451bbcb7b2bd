"""Step 3, tune one task on the boards, resumably.

MetaSchedule alone re-running on a work dir only warm-starts its search: it neither counts
the trials already spent nor avoids measuring the same schedule again. The counting and
the bookkeeping are ours:

* Each (task workload, target, board key) has a persistent work dir in the store
  (`work/tune/<target-id>/<workload-hash>/`) holding MetaSchedule's JSON database (one line
  per measured candidate, appended after every measured batch) and our append-only
  `trials.jsonl` (one line per measurement: latency or error, board message, schedule
  hash) and `state.json` (the task's explicit state). A killed run loses at most the batch
  in flight.
* A task asked for n trials that finds k already in its database measures n - k more.
  Raising the budget later continues from the same records.
* `GuardedSearch` wraps MetaSchedule's search strategy: it drops candidates whose
  scheduled module was already measured (in this run or an earlier one), stops the task
  when early stopping triggers, and stops it when the first measurements all fail (the
  old "0.00 GFLOPS" trap) so a broken board setup is reported at once with the board's
  own error messages.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .config import MeasureConfig, TuneConfig
from .errors import BoardError
from .progress import publish
from .store import atomic_write_text

log = logging.getLogger(__name__)

STEP = "tune"
VERSION = 1
FAILED = 1e10  # what MetaSchedule stores as the latency of a failed measurement


@dataclass
class BoardSpec:
    tracker_host: str
    tracker_port: int
    key: str
    num_boards: int = 1


@dataclass
class TuneOutcome:
    """What a finished tuning task reports (also written as summary.json)."""

    task: str
    workload_hash: str
    trials: int
    trials_this_run: int
    valid: int
    errors: int
    best_latency_ms: float | None
    best_gflops: float | None
    flops: float
    stopped: str  # "budget", "early-stopping", "search-exhausted"
    curve: list[list[float]] = field(default_factory=list)  # [trial, best ms so far]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TuningAborted(BoardError):
    """A task whose measurements all fail: the board setup is broken."""


# ---- the append-only trial log -------------------------------------------------------------------
def read_trials(work_dir: Path) -> list[dict[str, Any]]:
    p = Path(work_dir) / "trials.jsonl"
    out = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a kill
    return out


def _append_trials(work_dir: Path, rows: list[dict[str, Any]]) -> None:
    with open(Path(work_dir) / "trials.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.flush()


def write_state(work_dir: Path, **state: Any) -> None:
    atomic_write_text(Path(work_dir) / "state.json", json.dumps(dict(state, updated=time.time()), indent=1))


def read_state(work_dir: Path) -> dict[str, Any]:
    p = Path(work_dir) / "state.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _mean_secs(run_secs) -> float:
    vals = [float(getattr(s, "value", s)) for s in (run_secs or [])]
    return sum(vals) / len(vals) if vals else FAILED


# ---- the guarded search strategy ----------------------------------------------------------------
def _make_guarded_search(inner, *, known_hashes: set[int], early_stopping: int | None,
                         fail_fast: int, best0: float, since_best0: int):
    from tvm_ffi import structural_hash
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

    @derived_object
    class GuardedSearch(PySearchStrategy):
        """Wraps a MetaSchedule search: no schedule measured twice, early stop, fail fast."""

        def __init__(self):
            self.inner = inner
            self.known = known_hashes
            self.best = best0
            self.since_best = since_best0
            self.run_valid = 0
            self.run_failed = 0
            self.errors: list[str] = []
            self.stop_reason: str | None = None

        def _initialize_with_tune_context(self, context) -> None:
            self.inner._initialize_with_tune_context(context)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
            self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

        def post_tuning(self) -> None:
            self.inner.post_tuning()

        def generate_measure_candidates(self):
            if self.stop_reason:
                return None
            for _ in range(4):  # the inner search may propose only known schedules for a while
                cands = self.inner.generate_measure_candidates()
                if cands is None:
                    self.stop_reason = "search-exhausted"
                    return None
                fresh, seen = [], set()
                for c in cands:
                    h = structural_hash(c.sch.mod)
                    if h in self.known or h in seen:
                        continue
                    seen.add(h)
                    fresh.append(c)
                if fresh:
                    return fresh
                self.inner.notify_runner_results(cands, [])
            self.stop_reason = "search-exhausted"
            return None

        def notify_runner_results(self, measure_candidates, results) -> None:
            for c, r in zip(measure_candidates, results):
                self.known.add(structural_hash(c.sch.mod))
                secs = _mean_secs(r.run_secs) if r.error_msg is None else FAILED
                if secs >= FAILED:
                    self.run_failed += 1
                    if r.error_msg and len(self.errors) < 5:
                        self.errors.append(str(r.error_msg).strip()[-2000:])
                    self.since_best += 1
                    continue
                self.run_valid += 1
                if secs < self.best:
                    self.best, self.since_best = secs, 0
                else:
                    self.since_best += 1
            self.inner.notify_runner_results(measure_candidates, results)
            if self.run_valid == 0 and self.run_failed >= fail_fast:
                self.stop_reason = "all-failed"
            elif early_stopping and self.since_best >= early_stopping and self.best < FAILED:
                self.stop_reason = "early-stopping"

        def clone(self):
            return self

    return GuardedSearch()


def _make_log_callback(work_dir: Path, task_name: str, progress: Callable[[dict[str, Any]], None] | None,
                       start_index: int, budget: int):
    from tvm_ffi import structural_hash
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class TrialLog(PyMeasureCallback):
        """Appends every measurement (latency or error) to trials.jsonl and reports progress."""

        def __init__(self):
            self.index = start_index

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            rows = []
            now = time.time()
            for c, b, r in zip(measure_candidates, builder_results, runner_results):
                err = b.error_msg or r.error_msg
                secs = _mean_secs(r.run_secs) if err is None else FAILED
                rows.append({
                    "trial": self.index, "t": round(now, 3), "task": task_name,
                    "latency_ms": None if secs >= FAILED else secs * 1e3,
                    "error": None if err is None else ("build: " if b.error_msg else "run: ") + str(err).strip()[-1000:],
                    "schedule_hash": f"{structural_hash(c.sch.mod) & 0xFFFFFFFFFFFFFFFF:016x}",
                })
                self.index += 1
            _append_trials(work_dir, rows)
            event = {"task": task_name, "trials": self.index, "budget": budget, "batch": rows}
            publish(event)
            if progress:
                progress(event)

    return TrialLog()


# ---- one task ------------------------------------------------------------------------------------
def _records(db) -> list:
    return list(db.get_all_tuning_records())


def _known_hashes(db, workload_mod) -> set[int]:
    """Structural hashes of every schedule already measured for this workload."""
    from tvm_ffi import structural_hash
    from tvm.s_tir import Schedule

    out = set()
    for rec in _records(db):
        try:
            sch = Schedule(workload_mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            out.add(structural_hash(sch.mod))
        except Exception:  # a trace that no longer replays: it cannot be proposed again either
            continue
    return out


def _history(work_dir: Path) -> tuple[list[float], float, int]:
    """Latencies (s) in measurement order, the best, and trials since the best.

    Read from our trial log: the database returns records sorted by latency, not in the
    order they were measured."""
    lats = [r["latency_ms"] / 1e3 if r.get("latency_ms") is not None else FAILED for r in read_trials(work_dir)]
    best, since = FAILED, 0
    for v in lats:
        if v < best:
            best, since = v, 0
        else:
            since += 1
    return lats, best, since


def task_work_dir(store_work: Path, target_id: str, workload_hash: str) -> Path:
    d = Path(store_work) / "tune" / target_id / workload_hash
    d.mkdir(parents=True, exist_ok=True)
    return d


def tune_task(
    task_file: Path,
    task_name: str,
    flops: float,
    workload_hash: str,
    target_spec: dict[str, Any],
    board: BoardSpec,
    tune: TuneConfig,
    measure: MeasureConfig,
    work_dir: Path,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> TuneOutcome:
    """Tune one task until it has `tune.trials_per_task` measured trials (or stops early).

    Safe to call again after a kill: it continues from the records in `work_dir`.
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms

    work_dir = Path(work_dir)
    target = tvm.target.Target(target_spec)
    workload_mod = tvm.ir.load_json(Path(task_file).read_text())
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    done = len(_records(db))
    lats, best0, since0 = _history(work_dir)
    remaining = tune.trials_per_task - done
    state = read_state(work_dir)
    if state.get("status") == "finished" and state.get("budget", 0) >= tune.trials_per_task:
        remaining = 0  # stopped early (or exhausted) at this budget before: do not tune again
    elif tune.early_stopping and best0 < FAILED and since0 >= tune.early_stopping:
        remaining = 0
    stopped = "budget"
    trials_before = done
    if remaining > 0:
        write_state(work_dir, status="tuning", task=task_name, budget=tune.trials_per_task, done=done)
        publish({"task": task_name, "trials": done, "budget": tune.trials_per_task, "batch": []})
        log.info("task %s: %d of %d trials done, tuning %d more", task_name, done, tune.trials_per_task, remaining)
        inner = (
            ms.search_strategy.EvolutionarySearch()
            if tune.search == "evolutionary"
            else ms.search_strategy.ReplayTrace()
        )
        guard = _make_guarded_search(
            inner,
            known_hashes=_known_hashes(db, workload_mod),
            early_stopping=tune.early_stopping,
            fail_fast=min(tune.trials_per_batch, remaining, 8),
            best0=best0,
            since_best0=since0,
        )
        ctx = ms.TuneContext(
            mod=workload_mod,
            target=target,
            space_generator="post-order-apply",
            search_strategy=guard,
            task_name=task_name,
            rand_state=tune.seed + done,  # a resumed run must not replay the same random stream
            num_threads="physical",
        )
        runner = ms.runner.RPCRunner(
            rpc_config=ms.runner.RPCConfig(
                tracker_host=board.tracker_host,
                tracker_port=board.tracker_port,
                tracker_key=board.key,
                session_timeout_sec=measure.timeout_s,
            ),
            evaluator_config=ms.runner.EvaluatorConfig(
                number=measure.number,
                repeat=measure.repeat,
                min_repeat_ms=measure.min_repeat_ms,
                enable_cpu_cache_flush=measure.enable_cpu_cache_flush,
            ),
            max_workers=max(1, board.num_boards),
        )
        from .ms_build import make_builder

        callbacks = ms.measure_callback.MeasureCallback.create("default")
        callbacks = list(callbacks) + [_make_log_callback(work_dir, task_name, progress, done, tune.trials_per_task)]
        ms.tune_tasks(
            tasks=[ctx],
            task_weights=[1.0],
            work_dir=str(work_dir),
            max_trials_global=remaining,
            num_trials_per_iter=min(tune.trials_per_batch, remaining),
            builder=make_builder(tune.builder_timeout_s),
            runner=runner,
            database=db,
            cost_model=ms.cost_model.CostModel.create(tune.cost_model, num_tuning_cores=1)
            if tune.cost_model == "xgb"
            else "random",
            measure_callbacks=callbacks,
            task_scheduler="round-robin",
        )
        stopped = guard.stop_reason or "budget"
        if guard.stop_reason == "all-failed":
            write_state(work_dir, status="failed", task=task_name, budget=tune.trials_per_task,
                        done=len(_records(db)), errors=guard.errors)
            raise TuningAborted(
                f"task {task_name}: all {guard.run_failed} measurements on key {board.key!r} at "
                f"{board.tracker_host}:{board.tracker_port} failed; the board said:\n  "
                + "\n  ".join(guard.errors[:3] or ["(no message)"])
            )
    else:
        stopped = state.get("stopped", "budget")
    lats, best, _ = _history(work_dir)
    trials = max(len(lats), len(_records(db)))
    write_state(work_dir, status="finished", task=task_name, budget=tune.trials_per_task, done=trials, stopped=stopped)
    curve, b = [], FAILED
    for i, v in enumerate(lats, 1):
        b = min(b, v)
        curve.append([i, b * 1e3 if b < FAILED else None])
    valid = sum(v < FAILED for v in lats)
    return TuneOutcome(
        task=task_name,
        workload_hash=workload_hash,
        trials=trials,
        trials_this_run=trials - trials_before,
        valid=valid,
        errors=trials - valid,
        best_latency_ms=best * 1e3 if best < FAILED else None,
        best_gflops=(flops / best / 1e9) if best < FAILED and flops else None,
        flops=flops,
        stopped=stopped,
        curve=curve,
    )
