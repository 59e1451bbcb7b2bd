"""After a task's search: its fastest records measured again, in turn, and the fastest of that kept.

Why: while tuning, each candidate is measured once, in its own round, minutes apart from the
others, on hosts whose speed moves by tens of percent within minutes (a shared machine, a
board warming up).
The record with the lowest latency is then often one that was measured in a fast minute, not
the fastest schedule: re-timed in turn, most tasks' fastest record was not the recorded best
(docs/performance.md, "re-timed in turn").

So after the search the task's `top` best records (those recorded within `within` x the best:
a record further off is slower, not unlucky) are built and measured again on the board
through the tuning runner (its deadlines and fault handling), all of them in one batch per
round, `rounds` rounds: a candidate's time is the fastest repeat of its rounds (a burst on the
host slows some repeats, a slower schedule every one), and the drift of the host between rounds
moves every candidate alike. The winner is kept in the work dir
(`retimed.json`), which `pick_best.pick_best` commits in place of the recorded best. A task
retimes again only when its records changed (a bigger budget) or the settings did; a kill
during the retime leaves nothing behind, and the next run does it again.

With flushed caches (`tune.retime_caches="flushed"`, or auto: flushed on 64-bit x86 and Arm
CPUs): the search times a candidate back to back, so every run after the first finds the
weights in the caches, while inside a network a layer's weights were last read a whole
inference ago (resnet18's fp32 weights are 47 MB), and schedules differ in how often they read
each weight again: a schedule that wins warm can lose flushed (docs/performance.md).
Flushed, each candidate runs once per repeat after the runner flushed every argument but the
input (the layer before just wrote it). Warm stays the default because the network did not
get faster with flushed re-times (`benchmarks/results/r18_flush_bb834b0`, in docs/performance.md).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..boards import BoardSpec, pools
from ..config import MeasureConfig, TuneConfig
from ..store.artifacts import atomic_write_text, read_json
from .database import open_database, plain_json
from .trial_log import fastest_secs, mean_secs
from .work_dir import WorkDir

log = logging.getLogger("vta_pipeline")

RETIMED = WorkDir.RETIMED
FLUSHED_REPEATS = 10  # runs of a candidate per round with flushed caches: one run each, so more of them


def record_count(db_dir: Path) -> int:
    """Records in a task database's directory (lines of its record file): a re-time is of the
    records there were when it ran."""
    p = Path(db_dir) / WorkDir.RECORDS
    return sum(1 for line in p.read_text().splitlines() if line.strip()) if p.exists() else 0


def current(db_dir: Path) -> dict[str, Any] | None:
    """The directory's `retimed.json`, when it re-timed the records the directory holds now."""
    retimed = read_json(Path(db_dir) / RETIMED)  # torn: re-timed again
    return retimed if retimed and retimed.get("records") == record_count(db_dir) else None


def can_flush(target) -> bool:
    """Whether MetaSchedule's runner can flush the caches the target's kernels read their weights
    through: a CPU target (not a GPU's) whose CPU TVM flushes (`clflush` on 64-bit x86, `dc civac`
    on 64-bit Arm; a no-op on other CPUs)."""
    if pools.runner_device(target) != "cpu":
        return False
    import platform

    triple = str(target.attrs.get("mtriple", "")) or platform.machine()  # no triple: built for this host
    return triple.lower().startswith(("x86_64", "amd64", "aarch64", "arm64"))


def resolve_caches(setting: str, target) -> str:
    """`tune.retime_caches` for this target: auto is flushed where the runner can flush the
    caches (`can_flush`), warm elsewhere."""
    if setting != "auto":
        return setting
    return "flushed" if can_flush(target) else "warm"


def retime_measure(measure: MeasureConfig, caches: str) -> MeasureConfig:
    """The runner settings of a re-time: the search's own when warm; flushed runs a candidate
    once per repeat (at least FLUSHED_REPEATS of them), after MetaSchedule's runner has flushed
    every argument but the first (the input) from the caches, so that no run finds the weights
    the run before it left there."""
    if caches == "warm":
        return measure
    return measure.model_copy(
        update={
            "number": 1,
            "min_repeat_ms": 0,
            "repeat": max(measure.repeat, FLUSHED_REPEATS),
            "enable_cpu_cache_flush": True,
        }
    )


def retime_top(
    work_dir: Path,
    task_name: str,
    workload_mod,
    target,
    board: BoardSpec,
    measure: MeasureConfig,
    tune: TuneConfig,
    cross_compiler: str | None = None,
) -> dict[str, Any] | None:
    """Measure the task's `tune.retime_top` best records recorded within `tune.retime_within` x
    the best again in turn, `tune.retime_rounds` rounds (see the module doc); returns what
    `retimed.json` holds, or None when there is nothing to choose between (fewer than two such
    records) or no candidate could be measured (then the recorded best stands)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.utils import remove_build_dir

    top, rounds, within = tune.retime_top, tune.retime_rounds, tune.retime_within
    caches = resolve_caches(tune.retime_caches, target)
    n_records = record_count(work_dir)
    done = current(work_dir)
    if done and (done["top"], done["rounds"], done.get("within"), done.get("caches", "warm")) == (
        top,
        rounds,
        within,
        caches,
    ):
        return done  # before the database is read: a resumed task re-times nothing
    db = open_database(work_dir)
    records = db.get_top_k(db.commit_workload(workload_mod), top)
    if records:
        best = mean_secs(records[0].run_secs)
        records = [r for r in records if mean_secs(r.run_secs) <= within * best]
    if len(records) < 2:
        return None
    inputs, kept = [], []
    with pools.builder(tune.builder_timeout_s, cross_compiler) as builder:
        mods = []
        for rec in records:
            sch = Schedule(workload_mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            mods.append(sch.mod)
        built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
    device = pools.runner_device(target)
    for i, (rec, b) in enumerate(zip(records, built)):
        if b.error_msg:
            log.info(
                "task %s: record %d no longer builds, not re-timed (%s)",
                task_name,
                i,
                b.error_msg.strip().splitlines()[-1][:200],
            )
            continue
        inputs.append(ms.runner.RunnerInput(b.artifact_path, device, rec.args_info))
        kept.append(i)
    times: dict[int, list[float]] = {i: [] for i in kept}
    try:
        with pools.runner(board, retime_measure(measure, caches)) as runner:
            for _ in range(rounds):
                for i, fut in zip(kept, runner.run(inputs)):
                    res = fut.result()
                    if res.error_msg is None:
                        times[i].append(fastest_secs(res.run_secs))
    finally:
        for b in built:  # the builder's temporary directories, as tuning's own callback removes them
            if b.artifact_path:
                remove_build_dir(b.artifact_path)
    measured = {i: min(t) for i, t in times.items() if len(t) == rounds}  # a candidate that failed once is out
    if not measured:
        log.warning(
            "task %s: none of its %d best records could be measured again; the recorded best is used",
            task_name,
            len(records),
        )
        return None
    winner = min(measured, key=measured.get)
    out = {
        "task": task_name,
        "top": top,
        "rounds": rounds,
        "within": within,
        "caches": caches,
        "records": n_records,
        "winner": winner,
        "candidates": [
            {"rank": i, "recorded_ms": mean_secs(rec.run_secs) * 1e3, "retimed_ms": [t * 1e3 for t in times.get(i, [])]}
            for i, rec in enumerate(records)
        ],
        "record": plain_json(_ffi_api.TuningRecordAsJSON(records[winner])),
        "winner_ms": measured[winner] * 1e3,
        "recorded_best_ms": measured[0] * 1e3 if 0 in measured else None,
    }
    atomic_write_text(Path(work_dir) / RETIMED, json.dumps(out))
    log.info(
        "task %s: %d best records re-timed in turn: the fastest is the recorded #%d (%.4f ms; the recorded best %s)",
        task_name,
        len(measured),
        winner + 1,
        out["winner_ms"],
        f"{out['recorded_best_ms']:.4f} ms" if out["recorded_best_ms"] is not None else "failed",
    )
    return out


def winner_record(db_dir: Path, db) -> Any | None:
    """The re-timed winner of a task's database (`db`, opened from `db_dir`) as a TuningRecord,
    or None when the directory has no current re-time (the recorded best stands then)."""
    from tvm.s_tir import meta_schedule as ms

    retimed = current(db_dir)
    records = db.get_all_tuning_records() if retimed else []
    if not records:
        return None
    return ms.database.TuningRecord.from_json(retimed["record"], records[0].workload)
