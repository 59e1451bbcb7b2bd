"""Step 3, tune one task on the boards, resumably.

MetaSchedule alone re-running on a work dir only warm-starts its search: it neither counts
the trials already spent nor avoids measuring the same schedule again. The counting and
the bookkeeping are ours:

* Each (task workload, target, board key) has a persistent work dir in the store
  (`work/tune/<target-id>/<workload-hash>/`) holding MetaSchedule's JSON database (one line
  per measured candidate, appended after every measured batch) and our append-only
  `trials.jsonl` (one line per measurement: latency or error, board message, schedule
  hash, and the replayable MetaSchedule record of every valid one) and `state.json` (the
  task's explicit state). A killed run loses at most the batch in flight.
* A tuning session (`TuneConfig.session`, the night for the nightly flow) gets its own work
  dir, so every night tunes its full budget; its first search is warm-started with the best
  records of the same workload from earlier sessions (seeds, read from the history by the
  caller): they enter the session's database unmeasured, the evolutionary search starts
  from them, and the build can use them when tonight found nothing better.
* A task asked for n trials that finds k already in its database measures n - k more.
  Raising the budget later continues from the same records.
* `GuardedSearch` wraps MetaSchedule's search strategy: it drops candidates whose
  scheduled module was already measured (in this run or an earlier one), stops the task
  when early stopping triggers, and stops it when the first measurements all fail (the
  old "0.00 GFLOPS" trap) so a broken board setup is reported at once with the board's
  own error messages.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from . import int8_dot, intrin_registry, packed_conv_space, pools, schedule_rules
from .cost_model import lease as lease_cost_model
from .config import MeasureConfig, TuneConfig
from .errors import BoardError
from .progress import publish
from .store import atomic_write_text
from .workload_keys import HASH_MASK  # schedule hashes as unsigned 64-bit, as the trial log writes them

log = logging.getLogger(__name__)

STEP = "tune"
VERSION = 2
FAILED = 1e10  # what MetaSchedule stores as the latency of a failed measurement


@dataclass
class BoardSpec:
    tracker_host: str
    tracker_port: int
    key: str
    num_boards: int = 1
    threads: int | None = None  # what the key's boards reported (the flow reads it once per run)


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
    default_ms: float | None = None  # the untuned (default) lowering of the task, on the same board
    session: str | None = None
    session_best_ms: float | None = None  # best of this session's own measurements
    warm_start: int = 0  # records seeded from earlier sessions
    previous_best_ms: float | None = None  # best of the workload in earlier sessions (history)
    reached_previous_best_at: int | None = None  # first trial of the session at or below previous_best_ms
    threads: int | None = None  # threads the board measured with (its own report), CPU targets

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
    """`fail_fast`: stop after this many failed measurements in a row (a broken setup if
    nothing was measured yet, lost boards otherwise)."""
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
            self.failed_in_row = 0
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
                    h = structural_hash(c.sch.mod) & HASH_MASK
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
                self.known.add(structural_hash(c.sch.mod) & HASH_MASK)
                secs = _mean_secs(r.run_secs) if r.error_msg is None else FAILED
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
            self.inner.notify_runner_results(measure_candidates, results)
            if self.failed_in_row >= fail_fast:
                self.stop_reason = "all-failed"
            elif early_stopping and self.since_best >= early_stopping and self.best < FAILED:
                self.stop_reason = "early-stopping"

        def clone(self):
            return self

    return GuardedSearch()


def _make_log_callback(work_dir: Path, task_name: str, progress: Callable[[dict[str, Any]], None] | None,
                       start_index: int, budget: int, workload, target, session: str | None,
                       threads: int | None = None):
    from tvm_ffi import structural_hash
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

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
                secs = _mean_secs(r.run_secs) if err is None else FAILED
                rows.append({
                    "trial": self.index, "t": round(now, 3), "task": task_name, "session": session,
                    "latency_ms": None if secs >= FAILED else secs * 1e3,
                    "error": None if err is None else ("build: " if b.error_msg else "run: ") + str(err).strip()[-1000:],
                    "schedule_hash": f"{structural_hash(c.sch.mod) & HASH_MASK:016x}",
                    "record": None if secs >= FAILED else _record_json(c, workload, r.run_secs, target),
                    "threads": threads,
                })
                self.index += 1
            _append_trials(work_dir, rows)
            event = {"task": task_name, "trials": self.index, "budget": budget, "batch": rows}
            publish(event)
            if progress:
                progress(event)

    return TrialLog()


def _record_json(candidate, workload, run_secs, target) -> Any:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api

    try:
        rec = ms.database.TuningRecord(candidate.sch.trace, workload, run_secs, target, candidate.args_info)
        return _plain_json(_ffi_api.TuningRecordAsJSON(rec))
    except Exception:  # never lose the measurement over its record; but say so (warm starts need it)
        log.warning("could not serialize a tuning record: the history keeps its latency but no warm-start seed",
                    exc_info=True)
        return None


def _plain_json(obj) -> Any:
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
    if isinstance(obj, Array):
        return [_plain_json(i) for i in obj]
    if isinstance(obj, Map):
        return {_plain_json(k): _plain_json(v) for k, v in obj.items()}
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


# ---- the default lowering, measured on the board ------------------------------------------------
def measure_default(workload_mod, target, board: BoardSpec, measure: MeasureConfig,
                    builder_timeout_s: float, cross_compiler: str | None = None) -> tuple[float | None, str | None]:
    """Seconds the task's default lowering (no schedule) takes on the board, or (None, why).

    The build compiles every task without a record this way, so a tuned schedule is only
    worth using when it beats this: with few trials, MetaSchedule's best sampled schedule
    can be slower than LLVM's vectorized plain loops (seen on int8 packed convs).
    """
    from tvm.s_tir import meta_schedule as ms

    with pools.builder(builder_timeout_s, cross_compiler) as builder:
        (built,) = builder.build([ms.builder.BuilderInput(workload_mod, target)])
    if built.error_msg:
        return None, f"build: {built.error_msg.strip().splitlines()[-1]}"
    args = ms.arg_info.ArgInfo.from_entry_func(workload_mod, remove_preproc=True)
    device = {"llvm": "cpu", "c": "cpu"}.get(target.kind.name, target.kind.name)
    with pools.runner(board, measure) as runner:
        (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, device, args)])
        res = future.result()
    if res.error_msg:
        return None, f"run: {res.error_msg.strip().splitlines()[-1]}"
    return _mean_secs(res.run_secs), None


def _default_latency(work_dir: Path, task_name: str, workload_mod, target, board, measure, tune,
                     cross_compiler: str | None = None) -> float | None:
    """measure_default once per work dir (kept in default.json: a resumed task reuses it)."""
    p = work_dir / "default.json"
    secs, why = measure_default(workload_mod, target, board, measure, tune.builder_timeout_s, cross_compiler)
    if secs is None:
        log.warning("task %s: could not measure its default lowering (%s); tuned records will be used", task_name, why)
        return None  # not recorded: retried on the next run
    atomic_write_text(p, json.dumps({"seconds": secs, "task": task_name}))
    log.info("task %s: default lowering %.4f ms on the board", task_name, secs * 1e3)
    return secs

# ---- corrupted records ---------------------------------------------------------------------------
def repair_database(work_dir: Path) -> list[str]:
    """Set aside lines of the task's database files that do not parse; keep the rest.

    Returns one message per file repaired (file name and line numbers); the bad lines are
    appended to `<file>.corrupt` so nothing is thrown away."""
    msgs = []
    wl_path = Path(work_dir) / "database_workload.json"
    rec_path = Path(work_dir) / "database_tuning_record.json"
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
        return (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and 0 <= v[0] < n_workloads
                and isinstance(v[1], list) and len(v[1]) >= 2)
    except ValueError:
        return False


# ---- one task ------------------------------------------------------------------------------------
def _records(db) -> list:
    return list(db.get_all_tuning_records())


def _known_hashes(db, workload_mod, work_dir: Path) -> set[int]:
    """Structural hashes of every schedule already measured for this workload: the
    database's records replayed, and every schedule our trial log holds (measured as
    proposed, failed ones included: a record replayed from the database does not always
    hash like the candidate that was measured, and a rerun must not measure it again)."""
    from tvm_ffi import structural_hash
    from tvm.s_tir import Schedule

    out = {int(r["schedule_hash"], 16) for r in read_trials(work_dir) if r.get("schedule_hash")}
    warm = Path(work_dir) / "warm_start.json"
    if warm.exists():  # the seeds as they were measured in their own sessions
        out |= {int(h, 16) for h in json.loads(warm.read_text()).get("schedule_hashes", []) if h}
    for rec in _records(db):
        try:
            sch = Schedule(workload_mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            out.add(structural_hash(sch.mod) & HASH_MASK)
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


def task_work_dir(store_work: Path, target_id: str, workload_hash: str, session: str | None = None) -> Path:
    d = Path(store_work) / "tune" / target_id / (workload_hash if session is None else f"{workload_hash}@{session}")
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
    seeds: list[Any] | None = None,
    previous_best_ms: float | None = None,
    cross_compiler: str | None = None,
    seed_hashes: list[str] | None = None,
) -> TuneOutcome:
    """Tune one task until it has `tune.trials_per_task` valid measurements (or stops early).

    Safe to call again after a kill: it continues from the records in `work_dir`. Failed
    measurements (a board that died or hung) are logged as errors and do not count toward
    the budget; a run of `fail_fast` failures in a row raises TuningAborted (a BoardError,
    which the flow retries) with the boards' own messages, after keeping every record.

    `seeds`: TuningRecord JSON of the workload's best records from earlier sessions, committed
    to a fresh work dir before its first search (warm start). `previous_best_ms`: the best
    latency of earlier sessions, to report how many trials this session needed to reach it.
    `seed_hashes`: the schedule hashes the seeds were measured under (never measured again).
    `cross_compiler`: links each candidate into a shared library for the board (ARM boards
    need no compiler of their own then).
    """
    from filelock import FileLock

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(work_dir / "lock")):  # two runs never tune the same records at once
        return _tune_locked(task_file, task_name, flops, workload_hash, target_spec, board, tune, measure,
                            work_dir, progress, seeds or [], previous_best_ms, cross_compiler, seed_hashes or [])


def population_size(round_size: int) -> int:
    """The evolutionary search's population for a round that measures `round_size` candidates.

    MetaSchedule's default, 512 schedules evolved for 4 generations, is sized for its
    default rounds of 64 candidates (8 per measured one). Our rounds measure 1-16, and the
    population's sampling and evolution cost grows with its size: on a resnet18 conv here
    the first round took 20.7 s to propose 4 candidates with 512, 4.9 s with 128. 32 per
    measured candidate, between 64 and 512, keeps 4x MetaSchedule's ratio for choice."""
    return max(64, min(512, 32 * round_size))


def genetic_iters(round_size: int) -> int:
    """Generations the evolutionary search runs per round: MetaSchedule's 4, but 2 for rounds
    of 4 candidates or fewer.

    Evolution optimizes the cost model's score, and at the budgets that use such rounds the
    model has seen too little to rank well (benchmarks/cost_model.py: random scores did as
    well at 8 trials per task): the search's time went to polishing a guess. Over resnet18's
    15 fp32 conv tasks at 2 trials each, tuned one at a time on 2 local boards: 64 schedules
    for 2 generations took 65 s, 128 for 4 took 290 s (144 s without one task whose
    candidate hung), and the network estimate (best ms x weight) was 468 vs 516 ms, within
    the noise of 2 trials."""
    return 2 if round_size <= 4 else 4


def design_space(target: Any, workload_mod: Any, failures: int8_dot.TensorizeFailures | None = None) -> Any:
    """The search space of one task: NeoCPU's packed-conv space for graph pack's convs on a
    CPU (`packed_conv_space`: float, and uint8 x int8 where the CPU has a dot product), the
    dot-product rule for other uint8 x int8 blocks (`int8_dot`), MetaSchedule's generic space
    for everything else."""
    kind = packed_conv_space.conv_kind(workload_mod, target)
    if kind is not None:
        return packed_conv_space.space_generator(target, kind)
    return int8_dot.space_generator(target, workload_mod, failures)


MAX_ROUNDS = 4  # rounds to make up for failed measurements before giving up on the budget


def _tune_locked(task_file, task_name, flops, workload_hash, target_spec, board, tune, measure, work_dir,
                 progress, seeds, previous_best_ms, cross_compiler, seed_hashes) -> TuneOutcome:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from .boards import count_servers, tracker_down_message

    for msg in repair_database(work_dir):
        log.warning("task %s: %s", task_name, msg)
    target = tvm.target.Target(target_spec)
    int8_dot.register()  # tensorized records replay by the intrinsic's name
    workload_mod = tvm.ir.load_json(Path(task_file).read_text())
    state = read_state(work_dir)
    trials_before = len(read_trials(work_dir))
    if seeds and not state and not (work_dir / "warm_start.json").exists():  # seed a fresh work dir once
        seeded = seed_database(ms.database.JSONDatabase(work_dir=str(work_dir)), workload_mod, seeds)
        atomic_write_text(work_dir / "warm_start.json",
                          json.dumps({"seeded": seeded, "previous_best_ms": previous_best_ms,
                                      "schedule_hashes": list(seed_hashes)}))
        log.info("task %s: warm start with %d record(s) from earlier sessions (best %s ms)", task_name, seeded,
                 f"{previous_best_ms:.4f}" if previous_best_ms else "-")
    stopped = state.get("stopped", "budget") if state.get("status") == "finished" else "budget"
    finished_at_budget = state.get("status") == "finished" and state.get("budget", 0) >= tune.trials_per_task
    threads = board.threads  # stamped on every measurement
    failures = int8_dot.TensorizeFailures()
    for _round in range(MAX_ROUNDS):
        db = ms.database.JSONDatabase(work_dir=str(work_dir))
        lats, best0, since0 = _history(work_dir)
        valid = sum(v < FAILED for v in lats)
        remaining = tune.trials_per_task - valid
        if remaining <= 0 or finished_at_budget:
            break
        if tune.early_stopping and best0 < FAILED and since0 >= tune.early_stopping:
            stopped = "early-stopping"
            break
        try:
            n_boards = count_servers(board.tracker_host, board.tracker_port, board.key)
        except BoardError:
            raise BoardError(
                f"task {task_name}: " + tracker_down_message(board.tracker_host, board.tracker_port)
            ) from None
        if n_boards == 0:
            raise BoardError(
                f"task {task_name}: no board under key {board.key!r} at the tracker "
                f"{board.tracker_host}:{board.tracker_port} ({valid} of {tune.trials_per_task} trials done and kept). "
                f"Start one with `python -m tvm.exec.rpc_server --tracker {board.tracker_host}:{board.tracker_port} "
                f"--key {board.key}` and rerun: tuning continues from the records"
            )
        done = len(lats)
        write_state(work_dir, status="tuning", task=task_name, budget=tune.trials_per_task, done=done, valid=valid)
        publish({"task": task_name, "trials": valid, "budget": tune.trials_per_task, "batch": []})
        log.info("task %s: %d of %d valid trials done, tuning %d more", task_name, valid, tune.trials_per_task,
                 remaining)
        round_size = min(tune.trials_per_batch, remaining)  # a last round of 2 is not sized for 8
        inner = (
            ms.search_strategy.EvolutionarySearch(population_size=population_size(round_size),
                                                  genetic_num_iters=genetic_iters(round_size))
            if tune.search == "evolutionary"
            else ms.search_strategy.ReplayTrace()
        )
        guard = _make_guarded_search(
            inner,
            known_hashes=_known_hashes(db, workload_mod, work_dir),
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
            space_generator=design_space(target, workload_mod, failures),
            search_strategy=guard,
            task_name=task_name,
            rand_state=tune.seed + done,  # a resumed run must not replay the same random stream
            num_threads="physical",
        )
        callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
        callbacks.append(_make_log_callback(work_dir, task_name, progress, done, tune.trials_per_task,
                                            ms.database.Workload(workload_mod), target, tune.session, threads))
        boards_now = replace(board, num_boards=min(board.num_boards, n_boards))
        model_lease = (lease_cost_model(work_dir, target) if tune.cost_model == "xgb"
                       else contextlib.nullcontext("random"))
        with pools.builder(tune.builder_timeout_s, cross_compiler) as builder, \
                pools.runner(boards_now, measure) as runner, model_lease as model:
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
        if guard.stop_reason == "all-failed":
            lats, _, _ = _history(work_dir)
            valid = sum(v < FAILED for v in lats)
            write_state(work_dir, status="failed", task=task_name, budget=tune.trials_per_task,
                        done=len(lats), valid=valid, errors=guard.errors)
            what = ("none of its measurements succeeded: the setup is broken"
                    if valid == 0 else f"its last {guard.failed_in_row} measurements failed: boards lost")
            raise TuningAborted(
                f"task {task_name} on key {board.key!r} at the tracker {board.tracker_host}:{board.tracker_port}: "
                f"{what} ({valid} valid trials kept in {work_dir}). The board said:\n  "
                + "\n  ".join(guard.errors[:3] or ["(no message)"])
            )
        if guard.stop_reason in ("early-stopping", "search-exhausted"):
            stopped = guard.stop_reason
            break
        if guard.run_valid == 0:  # nothing new could be measured: do not spin
            stopped = "search-exhausted"
            break
    if failures.count:
        _note_tensorize_failures(work_dir, task_name, failures)
    # After the search, not before it: a board that dies or hangs is then already out of the
    # tracker's rotation, and the trial log stays exactly what the search measured.
    if not (work_dir / "default.json").exists() and _boards_left(board):
        _default_latency(work_dir, task_name, workload_mod, target, board, measure, tune, cross_compiler)
    threads = threads or _last_threads(work_dir)
    if threads is None and target.kind.name == "llvm" and _boards_left(board):
        from .boards import board_threads  # not given: asked after the search, as the default latency is

        threads = board_threads(board.tracker_host, board.tracker_port, board.key)
    lats, session_best, _ = _history(work_dir)
    write_state(work_dir, status="finished", task=task_name, budget=tune.trials_per_task, done=len(lats),
                stopped=stopped)
    curve, b, reached = [], FAILED, None
    for i, v in enumerate(lats, 1):
        b = min(b, v)
        curve.append([i, b * 1e3 if b < FAILED else None])
        if reached is None and previous_best_ms is not None and b * 1e3 <= previous_best_ms:
            reached = i
    valid = sum(v < FAILED for v in lats)
    warm = json.loads((work_dir / "warm_start.json").read_text()) if (work_dir / "warm_start.json").exists() else {}
    seeded_best = warm.get("previous_best_ms") if warm.get("seeded") else None
    # The session's database holds its seeds too, and the build takes its best record: report that.
    best_ms = min([x for x in (session_best * 1e3 if session_best < FAILED else None, seeded_best) if x is not None],
                  default=None)
    return TuneOutcome(
        task=task_name,
        workload_hash=workload_hash,
        trials=valid,
        trials_this_run=len(lats) - trials_before,
        valid=valid,
        errors=len(lats) - valid,
        best_latency_ms=best_ms,
        best_gflops=(flops / best_ms / 1e6) if best_ms and flops else None,
        flops=flops,
        stopped=stopped,
        curve=curve,
        default_ms=_read_default_ms(work_dir),
        session=tune.session,
        session_best_ms=session_best * 1e3 if session_best < FAILED else None,
        warm_start=int(warm.get("seeded", 0)),
        previous_best_ms=previous_best_ms,
        reached_previous_best_at=reached,
        threads=threads,
    )


details = logging.getLogger("vta_pipeline_details")
"""What helps a developer and nobody running a job acts on: the run's log file, not the console."""
details.propagate = False


def _note_tensorize_failures(work_dir: Path, task_name: str, failures: int8_dot.TensorizeFailures) -> None:
    """Once per task (not once per candidate): how many candidates kept plain loops because the
    dot-product intrinsic did not fit their block, and why the first did; kept in the work dir."""
    path = Path(work_dir) / "tensorize_failures.json"
    before = json.loads(path.read_text()) if path.exists() else {"candidates": 0, "first_error": None}
    total = before["candidates"] + failures.count
    atomic_write_text(path, json.dumps({"candidates": total, "first_error": before["first_error"] or failures.first}))
    details.info("task %s: %d candidate(s) kept plain int8 loops: the dot-product intrinsic did not fit "
                 "their block (first: %s); %d in all, see %s", task_name, failures.count, failures.first, total, path)


def _last_threads(work_dir: Path) -> int | None:
    """The thread count of the task's latest measurement that recorded one."""
    for row in reversed(read_trials(work_dir)):
        if row.get("threads"):
            return int(row["threads"])
    return None


def _boards_left(board: BoardSpec) -> bool:
    from .boards import count_servers

    try:
        return count_servers(board.tracker_host, board.tracker_port, board.key) > 0
    except BoardError:
        return False


def _read_default_ms(work_dir: Path) -> float | None:
    p = Path(work_dir) / "default.json"
    if not p.exists():
        return None
    secs = json.loads(p.read_text()).get("seconds")
    return secs * 1e3 if secs is not None else None
