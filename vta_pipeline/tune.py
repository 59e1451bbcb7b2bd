"""Step 3, tune one task on the boards, resumably.

MetaSchedule alone re-running on a work dir only warm-starts its search: it neither counts
the trials already spent nor avoids measuring the same schedule again. The counting and
the bookkeeping are ours:

* Each (task workload, target, board key) has a persistent work dir in the store
  (`work/tune/<target-id>/<workload-hash>/`) holding MetaSchedule's JSON database (one line
  per measured candidate, appended after every measured batch) and our trial log and
  explicit state (`trial_log`). A killed run loses at most the batch in flight.
* A tuning session (`TuneConfig.session`, the night for the nightly flow) gets its own work
  dir, so every night tunes its full budget; its first search is warm-started with the best
  records of the same workload from earlier sessions (seeds, read from the history by the
  caller): they enter the session's database unmeasured, the evolutionary search starts
  from them, and the build can use them when tonight found nothing better
  (`search.database`).
* A task asked for n trials that finds k already in its database measures n - k more.
  Raising the budget later continues from the same records.
* The search runs in rounds through MetaSchedule's `tune_tasks`, guarded
  (`search.hooks.GuardedSearch`: no schedule measured twice, early stopping, fail fast).
* After the search, the task's default lowering is measured once on the same board: the
  build only uses a tuned schedule that beats it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from . import spaces
from .boards import BoardSpec, pools
from .config import MeasureConfig, TuneConfig
from .errors import BoardError
from .search import retime
from .search.cost_model import lease as lease_cost_model
from .search.database import known_hashes, open_database, repair_database, seed_database
from .search.hooks import make_guarded_search, make_log_callback
from .search.progress import publish
from .search.trial_log import (
    FAILED,
    history,
    last_threads,
    mean_secs,
    read_default_ms,
    read_state,
    read_trials,
    write_state,
)
from .search.work_dir import Status, Stopped, WorkDir
from .spaces import upgrade as space_upgrade
from .store.artifacts import atomic_write_text, read_json
from .tir import int8_dot, intrin_registry, schedule_rules

log = logging.getLogger(__name__)

__all__ = [
    "STEP",
    "VERSION",
    "TuneOutcome",
    "TuningAborted",
    "tune_task",
    "TaskJob",
    "WarmStart",
    "measure_default",
    "population_size",
    "genetic_iters",
]

STEP = "tune"
VERSION = 3  # 3: functions without a reduction search the injective space (before: one generic schedule)


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
    stopped: str  # a `Stopped`
    curve: list[list[float]] = field(default_factory=list)  # [trial, best ms so far]
    default_ms: float | None = None  # the untuned (default) lowering of the task, on the same board
    session: str | None = None
    session_best_ms: float | None = None  # best of this session's own measurements
    warm_start: int = 0  # records seeded from earlier sessions
    previous_best_ms: float | None = None  # best of the workload in earlier sessions (history)
    reached_previous_best_at: int | None = None  # first trial of the session at or below previous_best_ms
    threads: int | None = None  # threads the board measured with (its own report), CPU targets
    library: dict[str, Any] | None = None  # records-library seeds measured first: their provenance
    retimed: dict[str, Any] | None = None  # the best records re-timed in turn (retime): winner rank and ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TuningAborted(BoardError):
    """A task whose measurements all fail: the board setup is broken."""


@dataclass(frozen=True)
class TaskJob:
    """One task to tune: what (its TIR module's file, name, FLOPs, workload hash), where (the
    target, the boards, the cross compiler that links each candidate for them), how (the
    tuning and measuring settings) and into which work dir; `progress` hears of every batch."""

    task_file: Path
    name: str
    flops: float
    workload_hash: str
    target_spec: dict[str, Any]
    board: BoardSpec
    tune: TuneConfig
    measure: MeasureConfig
    work_dir: Path
    cross_compiler: str | None = None
    progress: Callable[[dict[str, Any]], None] | None = None


@dataclass(frozen=True)
class WarmStart:
    """Where a fresh work dir's search starts; nothing given, it starts cold.

    `seeds`: TuningRecord JSON of the workload's best records from earlier sessions, committed
    to the database before its first search; `seed_hashes`: the schedule hashes they were
    measured under (never measured again); `previous_best_ms`: their best latency, to report
    how many trials this session needed to reach it. `library`: (records, provenance) from the
    records library, for a workload the store has no records of: the work dir keeps them, and
    its search measures them on this board before its own candidates (their latencies
    elsewhere are provenance, never trusted)."""

    seeds: tuple[Any, ...] = ()
    seed_hashes: tuple[str, ...] = ()
    previous_best_ms: float | None = None
    library: tuple[list[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class _Task:
    """A job with its TIR module and target loaded, and the label of the space it searches."""

    job: TaskJob
    mod: Any
    target: Any
    space: str

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def work_dir(self) -> Path:
        return self.job.work_dir


def tune_task(job: TaskJob, warm: WarmStart = WarmStart()) -> TuneOutcome:
    """Tune one task until it has `job.tune.trials_per_task` valid measurements (or stops early).

    Safe to call again after a kill: it continues from the records in the job's work dir.
    Failed measurements (a board that died or hung) are logged as errors and do not count
    toward the budget; a run of `fail_fast` failures in a row raises TuningAborted (a
    BoardError, which the flow retries) with the boards' own messages, after keeping every
    record. `warm` seeds a fresh work dir (see WarmStart)."""
    from filelock import FileLock

    job = replace(job, work_dir=Path(job.work_dir))
    job.work_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(job.work_dir / "lock")):  # two runs never tune the same records at once
        return _tune_locked(job, warm)


def population_size(round_size: int) -> int:
    """The evolutionary search's population for a round that measures `round_size` candidates.

    MetaSchedule's default, 512 schedules evolved for 4 generations, is sized for its
    default rounds of 64 candidates (8 per measured one). Our rounds measure 1-16, and the
    population's sampling and evolution cost grows with its size (several times the CPU for
    512 as for 128: docs/performance.md, "The evolutionary search's population"). 32 per
    measured candidate, between 64 and 512, keeps 4x MetaSchedule's ratio for choice."""
    return max(64, min(512, 32 * round_size))


def genetic_iters(round_size: int) -> int:
    """Generations the evolutionary search runs per round: MetaSchedule's 4, but 2 for rounds
    of 4 candidates or fewer.

    Evolution optimizes the cost model's score, and at the budgets that use such rounds the
    model has seen too little to rank well (benchmarks/cost_model.py: random scores did as
    well at 8 trials per task): the search's time went to polishing a guess. On resnet18's
    conv tasks at 2 trials each the shorter search took a fraction of the time for an estimate
    of the network within the noise of 2 trials (docs/performance.md)."""
    return 2 if round_size <= 4 else 4


LIBRARY_SEEDS = WorkDir.LIBRARY_SEEDS  # a work dir's records-library seeds, measured first
MAX_ROUNDS = 4  # rounds to make up for failed measurements before giving up on the budget


def _tune_locked(job: TaskJob, warm: WarmStart) -> TuneOutcome:
    """tune_task's body, under the work dir's lock: repair, warm start, search, default, outcome."""
    import tvm

    work_dir, task_name = job.work_dir, job.name
    for msg in repair_database(work_dir):
        log.warning("task %s: %s", task_name, msg)
    open_database(work_dir)  # its files exist from here on, searched or not
    target = tvm.target.Target(job.target_spec)
    workload_mod = tvm.ir.load_json(Path(job.task_file).read_text())
    space = spaces.label(target, workload_mod)
    old_space = _searched_in(work_dir, workload_mod, target, space)
    if space_upgrade.upgrades(old_space, space):
        note = space_upgrade.upgrade_work_dir(
            work_dir, workload_mod, target, old_space, spaces.design_space(target, workload_mod), LIBRARY_SEEDS
        )
        log.warning(
            "task %s: searched in %s before, now %s: its search is kept in %s, its %d best records "
            "carried over (%d upgraded) are measured first, and it searches its budget again",
            task_name,
            old_space or "an unlabelled space",
            space,
            note["archive"],
            note["records"],
            note["upgraded"],
        )
    task = _Task(job, workload_mod, target, space)
    trials_before = len(read_trials(work_dir))
    if warm.seeds and _fresh(work_dir):
        _warm_start(task, warm)
    elif warm.library and warm.library[0] and _fresh(work_dir):
        _stage_library(task, warm.library)
    stopped = _search(task)
    threads = _measure_after_search(task)
    lats, _, _ = history(work_dir)
    write_state(
        work_dir,
        status=Status.FINISHED,
        task=task_name,
        budget=job.tune.trials_per_task,
        done=len(lats),
        stopped=stopped,
        space=space,
    )
    return _outcome(job, stopped, trials_before, warm.previous_best_ms, threads)


def _searched_in(work_dir: Path, workload_mod, target, space: str) -> str | None:
    """The space label the work dir's search was in: its state's (`space` when it has none
    yet). A state without a label is a search killed while tuning (before c6da5e7 only finished
    states were labelled): its best record says whether that was the current space (None:
    an older one)."""
    state = read_state(work_dir)
    if not state:
        return space
    if "space" in state:
        return state["space"]
    best = space_upgrade.best_records(work_dir / WorkDir.RECORDS, 1)
    if not best or not space.startswith("packed-conv"):
        return space
    current, _ = space_upgrade.upgrade_records(best, workload_mod, target, spaces.design_space(target, workload_mod))
    return space if current else None


def _fresh(work_dir: Path) -> bool:
    """Whether a work dir starts its first search now: a started one was seeded (or staged)
    already, or tuned without seeds, and is never seeded again."""
    return not read_state(work_dir) and not (work_dir / WorkDir.WARM_START).exists()


def _warm_start(task: _Task, warm: WarmStart) -> None:
    """Seed a fresh work dir with earlier sessions' records (see `search.database.seed_database`);
    those tuned in an older version of the task's space are carried into the current one and
    measured first instead (`spaces.upgrade`: their latencies were of another loop nest)."""
    work_dir, task_name, previous_best_ms = task.work_dir, task.name, warm.previous_best_ms
    current, upgraded = _carried(list(warm.seeds), task.mod, task.target)
    seeded = seed_database(open_database(work_dir), task.mod, current)
    if upgraded:
        atomic_write_text(
            work_dir / LIBRARY_SEEDS,
            json.dumps(
                {
                    "records": upgraded,
                    "provenance": {"space_upgrade": {"from": "earlier sessions", "records": len(upgraded)}},
                }
            ),
        )
    atomic_write_text(
        work_dir / WorkDir.WARM_START,
        json.dumps(
            {
                "seeded": seeded,
                "previous_best_ms": previous_best_ms,
                "schedule_hashes": list(warm.seed_hashes),
                "upgraded": len(upgraded),
            }
        ),
    )
    log.info(
        "task %s: warm start with %d record(s) from earlier sessions (best %s ms)",
        task_name,
        seeded,
        f"{previous_best_ms:.4f}" if previous_best_ms else "-",
    )


def _carried(records: list[Any], workload_mod, target) -> tuple[list[Any], list[Any]]:
    """Earlier records split by the task's space: (those of its current version, those carried
    into it from an older one: `space_upgrade.upgrade_records`); all as given where the space
    has no versions."""
    if not space_upgrade.versioned(spaces.label(target, workload_mod)):
        return list(records), []
    return space_upgrade.upgrade_records(records, workload_mod, target, spaces.design_space(target, workload_mod))


def _stage_library(task: _Task, library: tuple[list[Any], dict[str, Any]]) -> None:
    """Keep the library's records in a fresh work dir (`library_seeds.json`): every search
    round of this work dir measures those not measured yet first, so a kill before they
    were measured loses nothing. Records exported from an older version of the task's space
    are carried into the current one (`spaces.upgrade`)."""
    work_dir, task_name = task.work_dir, task.name
    records, note = library
    current, upgraded = _carried(records, task.mod, task.target)
    records = current + upgraded
    atomic_write_text(work_dir / LIBRARY_SEEDS, json.dumps({"records": records, "provenance": note}))
    atomic_write_text(
        work_dir / WorkDir.WARM_START, json.dumps({"seeded": 0, "library": dict(note, records=len(records))})
    )
    log.info(
        "task %s: %d record(s) of the records library (%s, commit %s) are measured first",
        task_name,
        len(records),
        note.get("cpu"),
        note.get("commit"),
    )


def library_candidates(work_dir: Path, workload_mod) -> list:
    """The staged library records that replay here, as MetaSchedule measure candidates."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    seeds = read_json(work_dir / LIBRARY_SEEDS)
    if not seeds:
        return []
    workload = ms.database.Workload(workload_mod)
    out = []
    for js in seeds.get("records", []):
        try:
            rec = ms.database.TuningRecord.from_json(js, workload)
            sch = Schedule(workload_mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            args = rec.args_info or ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            out.append(ms.MeasureCandidate(sch, args))
        except Exception as e:  # a warm start is an optimisation, never a reason to fail
            log.info("records library: skipped a record that does not replay here (%s)", str(e).splitlines()[0][:200])
    return out


def _search(task: _Task) -> str:
    """Search until the task has its budget of valid trials; returns why it stopped.

    Resume accounting comes from the trial log: a task finished at this budget (or a larger
    one) searches no more, and one that early-stopped or exhausted its search stays so, at
    any budget (an exhausted small space cost a minute of fruitless evolutionary search per
    task and budget: mobilenet_v2 int8's depthwise convs at 7x7), unless what it exhausted
    was another design space than `space` (`space_label`): a new space has candidates the
    old one had not. A round whose measurements failed is made up
    by the next one, at most MAX_ROUNDS in all."""
    work_dir, task_name, space = task.work_dir, task.name, task.space
    board, tune = task.job.board, task.job.tune
    state = read_state(work_dir)
    finished = state.get("status") == Status.FINISHED
    stopped = state.get("stopped", Stopped.BUDGET) if finished else Stopped.BUDGET
    if finished and stopped == Stopped.SEARCH_EXHAUSTED and state.get("space") != space:
        log.info("task %s: exhausted %s, searching %s", task_name, state.get("space", "an earlier space"), space)
        finished, stopped = False, Stopped.BUDGET
    if finished and state.get("budget", 0) >= tune.trials_per_task:
        return stopped
    if finished and stopped == Stopped.SEARCH_EXHAUSTED:  # a bigger budget does not grow the space
        log.info(
            "task %s: its search exhausted %s at %d trials; not searched again", task_name, space, state.get("done", 0)
        )
        return stopped
    failures = int8_dot.TensorizeFailures()
    for _round in range(MAX_ROUNDS):
        lats, best0, since0 = history(work_dir)
        valid = sum(v < FAILED for v in lats)
        remaining = tune.trials_per_task - valid
        if remaining <= 0:
            break
        if tune.early_stopping and best0 < FAILED and since0 >= tune.early_stopping:
            stopped = Stopped.EARLY_STOPPING
            break
        n_boards = _boards_up(board, task_name, valid, tune.trials_per_task)
        write_state(
            work_dir,
            status=Status.TUNING,
            task=task_name,
            budget=tune.trials_per_task,
            done=len(lats),
            space=space,
            valid=valid,
        )
        publish({"task": task_name, "trials": valid, "budget": tune.trials_per_task, "batch": []})
        log.info(
            "task %s: %d of %d valid trials done, tuning %d more", task_name, valid, tune.trials_per_task, remaining
        )
        guard = _search_round(
            task,
            replace(board, num_boards=min(board.num_boards, n_boards)),
            failures,
            done=len(lats),
            remaining=remaining,
            best0=best0,
            since0=since0,
        )
        if guard.stop_reason == Stopped.ALL_FAILED:
            _abort(work_dir, task_name, board, tune, guard)
        if guard.stop_reason in (Stopped.EARLY_STOPPING, Stopped.SEARCH_EXHAUSTED):
            stopped = guard.stop_reason
            break
        if guard.run_valid == 0:  # nothing new could be measured: do not spin
            stopped = Stopped.SEARCH_EXHAUSTED
            break
    if failures.count:
        _note_tensorize_failures(work_dir, task_name, failures)
    return stopped


def _boards_up(board: BoardSpec, task_name: str, valid: int, budget: int) -> int:
    """How many boards the key has now; a BoardError (retried by the flow) when none or no tracker."""
    from .boards import count_servers, tracker_down_message

    try:
        n_boards = count_servers(board.tracker_host, board.tracker_port, board.key)
    except BoardError:
        raise BoardError(f"task {task_name}: " + tracker_down_message(board.tracker_host, board.tracker_port)) from None
    if n_boards == 0:
        raise BoardError(
            f"task {task_name}: no board under key {board.key!r} at the tracker "
            f"{board.tracker_host}:{board.tracker_port} ({valid} of {budget} trials done and kept). "
            f"Start one with `python -m tvm.exec.rpc_server --tracker {board.tracker_host}:{board.tracker_port} "
            f"--key {board.key}` and rerun: tuning continues from the records"
        )
    return n_boards


def _search_round(
    task: _Task,
    board: BoardSpec,
    failures: int8_dot.TensorizeFailures,
    *,
    done: int,
    remaining: int,
    best0: float,
    since0: int,
):
    """One MetaSchedule `tune_tasks` call over this task for the remaining budget, measured on
    `board` (the job's, as many of its boards as are up); returns its guard."""
    from tvm.s_tir import meta_schedule as ms

    work_dir, task_name, workload_mod, target = task.work_dir, task.name, task.mod, task.target
    tune, job = task.job.tune, task.job
    db = open_database(work_dir)
    round_size = min(tune.trials_per_batch, remaining)  # a last round of 2 is not sized for 8
    inner = (
        ms.search_strategy.EvolutionarySearch(
            population_size=population_size(round_size), genetic_num_iters=genetic_iters(round_size)
        )
        if tune.search == "evolutionary"
        else ms.search_strategy.ReplayTrace()
    )
    guard = make_guarded_search(
        inner,
        known_hashes=known_hashes(db, workload_mod, work_dir),
        first=library_candidates(work_dir, workload_mod),
        early_stopping=tune.early_stopping,
        fail_fast=max(2, min(tune.trials_per_batch, 8)),
        best0=best0,
        since_best0=since0,
    )
    intrin_registry.load()  # what TuneContext imports, without its minute of inspect.stack() scans
    schedule_rules.register()  # TOPI's pooling annotations, without a console warning per task
    ctx = ms.TuneContext(
        mod=workload_mod,
        target=target,
        space_generator=spaces.design_space(target, workload_mod, failures),
        search_strategy=guard,
        task_name=task_name,
        rand_state=tune.seed + done,  # a resumed run must not replay the same random stream
        num_threads="physical",
    )
    callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
    callbacks.append(
        make_log_callback(
            work_dir,
            task_name,
            job.progress,
            done,
            tune.trials_per_task,
            ms.database.Workload(workload_mod),
            target,
            tune.session,
            board.threads,
            board.board,
            board.tvm,
        )
    )
    model_lease = lease_cost_model(work_dir, target) if tune.cost_model == "xgb" else contextlib.nullcontext("random")
    with (
        pools.builder(tune.builder_timeout_s, job.cross_compiler) as builder,
        pools.runner(board, job.measure) as runner,
        model_lease as model,
    ):
        ms.tune_tasks(
            tasks=[ctx],
            task_weights=[1.0],
            work_dir=str(work_dir),
            max_trials_global=remaining,
            num_trials_per_iter=round_size,
            builder=builder,
            runner=runner,
            database=db,
            cost_model=model,
            measure_callbacks=callbacks,
            task_scheduler="round-robin",
        )
    return guard


def _abort(work_dir: Path, task_name: str, board: BoardSpec, tune: TuneConfig, guard) -> None:
    """Record the task as failed and raise TuningAborted with the boards' own messages."""
    lats, _, _ = history(work_dir)
    valid = sum(v < FAILED for v in lats)
    write_state(
        work_dir,
        status=Status.FAILED,
        task=task_name,
        budget=tune.trials_per_task,
        done=len(lats),
        valid=valid,
        errors=guard.errors,
    )
    what = (
        "none of its measurements succeeded: the setup is broken"
        if valid == 0
        else f"its last {guard.failed_in_row} measurements failed: boards lost"
    )
    raise TuningAborted(
        f"task {task_name} on key {board.key!r} at the tracker {board.tracker_host}:{board.tracker_port}: "
        f"{what} ({valid} valid trials kept in {work_dir}). The board said:\n  "
        + "\n  ".join(guard.errors[:3] or ["(no message)"])
    )


def _measure_after_search(task: _Task) -> int | None:
    """The task's default lowering, once per work dir, its best records re-timed in turn
    (`retime`, once per set of records), and the board's thread count; returns it.

    After the search, not before it: a board that dies or hangs is then already out of the
    tracker's rotation, and the trial log stays exactly what the search measured."""
    work_dir, target, job = task.work_dir, task.target, task.job
    board, tune = job.board, job.tune
    if measures_default(target) and not (work_dir / WorkDir.DEFAULT).exists() and _boards_left(board):
        _default_latency(task)
    if tune.retime_top > 1 and _boards_left(board):
        retime.retime_top(work_dir, task.name, task.mod, target, board, job.measure, tune, job.cross_compiler)
    threads = board.threads or last_threads(work_dir)
    if threads is None and target.kind.name == "llvm" and _boards_left(board):
        from .boards import board_threads  # not given: asked after the search, as the default latency is

        threads = board_threads(board.tracker_host, board.tracker_port, board.key)
    return threads


def _outcome(
    job: TaskJob, stopped: str, trials_before: int, previous_best_ms: float | None, threads: int | None
) -> TuneOutcome:
    """What the task reports: its trial log's latencies (`trial_log.history`) and its warm-start note."""
    work_dir, flops = job.work_dir, job.flops
    lats, session_best, _ = history(work_dir)
    curve, b, reached = [], FAILED, None
    for i, v in enumerate(lats, 1):
        b = min(b, v)
        curve.append([i, b * 1e3 if b < FAILED else None])
        if reached is None and previous_best_ms is not None and b * 1e3 <= previous_best_ms:
            reached = i
    valid = sum(v < FAILED for v in lats)
    warm = read_json(work_dir / WorkDir.WARM_START, {}) or {}
    seeded_best = warm.get("previous_best_ms") if warm.get("seeded") else None
    # The session's database holds its seeds too, and the build takes its best record: report that.
    best_ms = min(
        [x for x in (session_best * 1e3 if session_best < FAILED else None, seeded_best) if x is not None], default=None
    )
    return TuneOutcome(
        task=job.name,
        workload_hash=job.workload_hash,
        trials=valid,
        trials_this_run=len(lats) - trials_before,
        valid=valid,
        errors=len(lats) - valid,
        best_latency_ms=best_ms,
        best_gflops=(flops / best_ms / 1e6) if best_ms and flops else None,
        flops=flops,
        stopped=stopped,
        curve=curve,
        default_ms=read_default_ms(work_dir),
        session=job.tune.session,
        session_best_ms=session_best * 1e3 if session_best < FAILED else None,
        warm_start=int(warm.get("seeded", 0)),
        previous_best_ms=previous_best_ms,
        reached_previous_best_at=reached,
        threads=threads,
        library=warm.get("library"),
        retimed=_retime_summary(work_dir) if job.tune.retime_top > 1 else None,
    )


def _retime_summary(work_dir: Path) -> dict[str, Any] | None:
    """What the outcome says of the re-time: which recorded rank won, at what time in turn."""
    r = retime.current(work_dir)
    if r is None:
        return None
    return {
        "candidates": len(r["candidates"]),
        "winner_rank": r["winner"] + 1,
        "winner_ms": r["winner_ms"],
        "recorded_best_ms": r["recorded_best_ms"],
        "caches": r.get("caches", "warm"),
    }


# ---- the default lowering, measured on the board ------------------------------------------------
def measures_default(target) -> bool:
    """Whether a task's default lowering is measured after its search: on CPUs and on GPUs.

    On a GPU the default is TVM's default GPU schedules (`default_lowering`), the lowering the
    network build gives a GPU task without a record. At a few trials per task a tuned GPU
    network can be slower than the untuned one (docs/performance.md, "Numbers behind the
    library's choices"), which measuring that default catches. Only accelerators the build schedules are measured (`build.GPU_KINDS`)."""
    from .build import GPU_KINDS

    return target.kind.name in ("llvm", "c") or target.kind.name in GPU_KINDS


def default_lowering(workload_mod, target):
    """The task as the network build lowers it without a record: as it is on a CPU, through
    TVM's default GPU schedules (DLight) on a GPU. The unscheduled function on a GPU is one
    unbound thread: running it crashed an H200 board's session, and the rpc_server with it."""
    from .build import GPU_KINDS, default_gpu_schedules

    return default_gpu_schedules(workload_mod, target) if target.kind.name in GPU_KINDS else workload_mod


def measure_default(
    workload_mod,
    target,
    board: BoardSpec,
    measure: MeasureConfig,
    builder_timeout_s: float,
    cross_compiler: str | None = None,
) -> tuple[float | None, str | None]:
    """Seconds the task's default lowering (`default_lowering`) takes on the board, or (None, why).

    The build compiles every task without a record this way, so a tuned schedule is only
    worth using when it beats this: with few trials, MetaSchedule's best sampled schedule
    can be slower than LLVM's vectorized plain loops (seen on int8 packed convs).
    """
    from tvm.s_tir import meta_schedule as ms

    with pools.builder(builder_timeout_s, cross_compiler) as builder:
        (built,) = builder.build([ms.builder.BuilderInput(default_lowering(workload_mod, target), target)])
    if built.error_msg:
        return None, f"build: {built.error_msg.strip().splitlines()[-1]}"
    args = ms.arg_info.ArgInfo.from_entry_func(workload_mod, remove_preproc=True)
    with pools.runner(board, measure) as runner:
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, pools.runner_device(target), args)])
        res = future.result()
    if res.error_msg:
        return None, f"run: {res.error_msg.strip().splitlines()[-1]}"
    return mean_secs(res.run_secs), None


def _default_latency(task: _Task) -> float | None:
    """measure_default once per work dir (kept in default.json: a resumed task reuses it)."""
    job, task_name = task.job, task.name
    p = task.work_dir / WorkDir.DEFAULT
    secs, why = measure_default(
        task.mod, task.target, job.board, job.measure, job.tune.builder_timeout_s, job.cross_compiler
    )
    if secs is None:
        log.warning("task %s: could not measure its default lowering (%s); tuned records will be used", task_name, why)
        return None  # not recorded: retried on the next run
    atomic_write_text(p, json.dumps({"seconds": secs, "task": task_name}))
    log.info("task %s: default lowering %.4f ms on the board", task_name, secs * 1e3)
    return secs


details = logging.getLogger("vta_pipeline_details")
"""What helps a developer and nobody running a job acts on: the run's log file, not the console."""
details.propagate = False


def _note_tensorize_failures(work_dir: Path, task_name: str, failures: int8_dot.TensorizeFailures) -> None:
    """Once per task (not once per candidate): how many candidates kept plain loops because the
    dot-product intrinsic did not fit their block, and why the first did; kept in the work dir."""
    path = Path(work_dir) / "tensorize_failures.json"
    before = read_json(path) or {"candidates": 0, "first_error": None}
    total = before["candidates"] + failures.count
    atomic_write_text(path, json.dumps({"candidates": total, "first_error": before["first_error"] or failures.first}))
    details.info(
        "task %s: %d candidate(s) kept plain int8 loops: the dot-product intrinsic did not fit "
        "their block (first: %s); %d in all, see %s",
        task_name,
        failures.count,
        failures.first,
        total,
        path,
    )


def _boards_left(board: BoardSpec) -> bool:
    from .boards import count_servers

    try:
        return count_servers(board.tracker_host, board.tracker_port, board.key) > 0
    except BoardError:
        return False
