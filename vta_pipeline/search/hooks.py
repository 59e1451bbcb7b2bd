"""What we hook into MetaSchedule's search loop: a guard around its search strategy and a
measure callback that writes our trial log.

MetaSchedule re-running on a work dir only warm-starts its search: it neither counts the
trials already spent nor avoids measuring a schedule again. `GuardedSearch` wraps its
search strategy: it drops candidates whose scheduled module was already measured (in this
run or an earlier one), stops the task when early stopping triggers, and stops it when its
measurements fail in a row (the old "0.00 GFLOPS" trap), so a broken board setup is
reported at once with the board's own messages. `TrialLog` appends every measurement to
the task's trial log (`trial_log`) and publishes progress.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ..store.workload_keys import (
    HASH_MASK,  # schedule hashes as unsigned 64-bit, as the trial log writes them
)
from .database import record_json
from .progress import publish
from .trial_log import FAILED, append_trials, mean_secs
from .work_dir import Stopped


def make_guarded_search(
    inner,
    *,
    known_hashes: set[int],
    early_stopping: int | None,
    fail_fast: int,
    best0: float,
    since_best0: int,
    first: list | None = None,
):
    """`fail_fast`: stop after this many failed measurements in a row (a broken setup if
    nothing was measured yet, lost boards otherwise). `first`: measure candidates proposed
    before the search's own (the records library's), those not measured yet."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy
    from tvm_ffi import structural_hash

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
            self.failed_in_row = 0
            self.errors: list[str] = []
            self.stop_reason: str | None = None
            self.max_trials = 1 << 30  # set by pre_tuning
            self.first = list(first or [])
            self.outside: set[int] = set()  # hashes of the candidates the inner search did not propose

        def _initialize_with_tune_context(self, context) -> None:
            self.inner._initialize_with_tune_context(context)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
            self.max_trials = int(max_trials)
            self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

        def post_tuning(self) -> None:
            self.inner.post_tuning()

        def generate_measure_candidates(self):
            if self.stop_reason:
                return None
            # the round's budget is a hard cap: when known schedules were dropped from a batch,
            # the inner search's own count drifted, and a resumed task measured 10 of 8 (CI)
            room = self.max_trials - self.run_valid - self.run_failed
            if room <= 0:
                return None
            if self.first:
                batch = self._fresh(self.first)[:room]
                self.first = []
                if batch:
                    self.outside.update(structural_hash(c.sch.mod) & HASH_MASK for c in batch)
                    return batch
            for _ in range(4):  # the inner search may propose only known schedules for a while
                cands = self.inner.generate_measure_candidates()
                if cands is None:
                    self.stop_reason = Stopped.SEARCH_EXHAUSTED
                    return None
                fresh = self._fresh(cands)
                if fresh:
                    return fresh[:room]
                self.inner.notify_runner_results(cands, [])
            self.stop_reason = Stopped.SEARCH_EXHAUSTED
            return None

        def _fresh(self, cands) -> list:
            fresh, seen = [], set()
            for c in cands:
                h = structural_hash(c.sch.mod) & HASH_MASK
                if h in self.known or h in seen:
                    continue
                seen.add(h)
                fresh.append(c)
            return fresh

        def notify_runner_results(self, measure_candidates, results) -> None:
            hashes = [structural_hash(c.sch.mod) & HASH_MASK for c in measure_candidates]
            for h, r in zip(hashes, results):
                self.known.add(h)
                secs = mean_secs(r.run_secs) if r.error_msg is None else FAILED
                if secs >= FAILED:
                    self.run_failed += 1
                    self.failed_in_row += 1
                    if r.error_msg and len(self.errors) < 5:
                        self.errors.append(str(r.error_msg).strip()[-2000:])
                    self.since_best += 1
                    continue
                self.run_valid += 1
                self.failed_in_row = 0
                if secs < self.best:
                    self.best, self.since_best = secs, 0
                else:
                    self.since_best += 1
            # the inner search learns of the others' results from the database and cost model;
            # told of candidates it never proposed, it would count them against its own trials
            if not (hashes and hashes[0] in self.outside):
                self.inner.notify_runner_results(measure_candidates, results)
            if self.failed_in_row >= fail_fast:
                self.stop_reason = Stopped.ALL_FAILED
            elif early_stopping and self.since_best >= early_stopping and self.best < FAILED:
                self.stop_reason = Stopped.EARLY_STOPPING

        def clone(self):
            return self

    return GuardedSearch()


def make_log_callback(
    work_dir: Path,
    task_name: str,
    progress: Callable[[dict[str, Any]], None] | None,
    start_index: int,
    budget: int,
    workload,
    target,
    session: str | None,
    threads: int | None = None,
    board: str | None = None,
    tvm: str | None = None,
):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
    from tvm_ffi import structural_hash

    @derived_object
    class TrialLog(PyMeasureCallback):
        """Appends every measurement (latency or error) to trials.jsonl and reports progress.

        Valid measurements carry their MetaSchedule record (trace, run time, target, args) as
        JSON: the history keeps it, and a later session replays it as a warm-start seed."""

        def __init__(self):
            self.index = start_index

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            rows = []
            now = time.time()
            for c, b, r in zip(measure_candidates, builder_results, runner_results):
                err = b.error_msg or r.error_msg
                secs = mean_secs(r.run_secs) if err is None else FAILED
                rows.append(
                    {
                        "trial": self.index,
                        "t": round(now, 3),
                        "task": task_name,
                        "session": session,
                        "latency_ms": None if secs >= FAILED else secs * 1e3,
                        "error": None
                        if err is None
                        else ("build: " if b.error_msg else "run: ") + str(err).strip()[-1000:],
                        "schedule_hash": f"{structural_hash(c.sch.mod) & HASH_MASK:016x}",
                        "record": None if secs >= FAILED else record_json(c, workload, r.run_secs, target),
                        "threads": threads,
                        "board": board,
                        "tvm": tvm,  # who measured it (BoardSpec)
                    }
                )
                self.index += 1
            append_trials(work_dir, rows)
            event = {"task": task_name, "trials": self.index, "budget": budget, "batch": rows}
            publish(event)
            if progress:
                progress(event)

    return TrialLog()
