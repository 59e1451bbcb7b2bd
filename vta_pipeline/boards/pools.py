"""Candidate builder and board runner pools shared by every task a process tunes.

Why: a fresh MetaSchedule worker process imports TVM before it does anything (6-8 s of CPU
on the 2-core machine we measure on). Stock `LocalBuilder` starts a new pool for every batch
of candidates (and one more for its sanity check), `RPCRunner` one per runner. The pipeline
tunes each task in its own `tune_tasks` call (one Prefect task per tuning task, so that each
caches, retries and reports alone) and measures each task's default lowering besides: with
stock pools that cost ~40 s of CPU per task, more than tuning a small task takes, and it was
the bulk of the pipeline's overhead over a bare `tune_tasks` loop (benchmarks/compare.py).

Here a process keeps one builder pool per (timeout, cross compiler) and one runner pool per
(board, measure config); the tasks it tunes, concurrently from threads or one after the
other, lease them. Builder workers are recycled after `BUILDS_PER_WORKER` builds (the stock
builder restarts its pool because long-lived workers leak memory). Pools nobody leases are
kept for reuse up to `IDLE_KEPT` of each kind, the oldest shut down beyond that (tests and
the nightly flow start many local boards, each on its own port).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MeasureConfig
    from .tracker import BoardSpec

log = logging.getLogger(__name__)

BUILDS_PER_WORKER = 64
IDLE_KEPT = 2
WORKER_GRACE_S = 10  # a fresh runner worker imports TVM before it can start the session


@dataclass
class _Entry:
    obj: Any
    close: Callable[[], None]
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


class _Shared:
    """Objects built once per key and leased; idle ones beyond `IDLE_KEPT` are closed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    @contextlib.contextmanager
    def lease(self, key: Hashable, make: Callable[[], tuple[Any, Callable[[], None]]]) -> Iterator[Any]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                obj, close = make()
                entry = self._entries[key] = _Entry(obj, close)
            entry.users += 1
        try:
            yield entry.obj
        finally:
            with self._lock:
                entry.users -= 1
                entry.last_used = time.monotonic()
                idle = sorted((e.last_used, k) for k, e in self._entries.items() if e.users == 0)
                doomed = [self._entries.pop(k) for _, k in idle[: max(0, len(idle) - IDLE_KEPT)]]
            for e in doomed:
                e.close()

    def close_all(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for e in entries:
            e.close()

    def __len__(self) -> int:
        return len(self._entries)


_builders = _Shared()
_runners = _Shared()


def close_all() -> None:
    """Shut every idle and leased pool down (end of a process, tests)."""
    _builders.close_all()
    _runners.close_all()


atexit.register(close_all)  # before interpreter teardown, where the pools' own __del__ fails noisily


def pool_counts() -> dict[str, int]:
    return {"builders": len(_builders), "runners": len(_runners)}


# ---- builder ---------------------------------------------------------------------------------------
def _make_shared_builder(timeout_s: float, cross_compiler: str | None, workers: int):
    import functools

    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    from .builder import cross_export, fast_build

    f_export = functools.partial(cross_export, cross_compiler) if cross_compiler else None
    pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=BUILDS_PER_WORKER)

    @derived_object
    class SharedBuilder(PyBuilder):
        """LocalBuilder's build, on a pool that outlives the batch."""

        def build(self, build_inputs):
            out = []
            jobs = [(fast_build, f_export, b.mod, b.target, None) for b in build_inputs]
            for r in pool.map_with_error_catching(lambda x: _worker_func(*x), jobs):
                if r.status == StatusKind.COMPLETE:
                    out.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    out.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {timeout_s} seconds"))
                else:
                    out.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{r.value}"))
            return out

    return SharedBuilder(), pool.shutdown


@contextlib.contextmanager
def builder(timeout_s: float, cross_compiler: str | None = None, workers: int | None = None) -> Iterator[Any]:
    """Lease this process's candidate builder (a MetaSchedule Builder) for these settings."""
    import os

    workers = workers or os.cpu_count() or 1
    key = (float(timeout_s), cross_compiler, workers)
    with _builders.lease(key, lambda: _make_shared_builder(timeout_s, cross_compiler, workers)) as b:
        yield b


# ---- runner ----------------------------------------------------------------------------------------
def make_runner(board: BoardSpec, measure: MeasureConfig):
    """MetaSchedule's RPCRunner with a client-side deadline on every measurement, behind
    `_checked` (refused lies, boards found hung dropped from the run).

    RPCRunner's worker pool has no timeout: a board that accepts a session and never
    answers (frozen, hung driver), or a key whose boards are all gone (the tracker queues
    the request forever), hangs tuning for good, and the finished measurements of that
    batch are never written. Giving the pool a timeout makes TVM kill the stuck worker and
    report "RPCRunner: Timeout" for that candidate; the tracker never hands the hung board
    out again (it stays checked out), so tuning goes on with the others.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.support.popen_pool import PopenPoolExecutor

    workers = max(1, board.num_boards)
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
        max_workers=workers,
    )
    runner.pool.shutdown()
    runner.pool = PopenPoolExecutor(max_workers=workers, timeout=measure.timeout_s + WORKER_GRACE_S)
    return _checked(runner, board, measure.timeout_s, workers, measure.tracker_wait_s)


# ---- boards found hung -----------------------------------------------------------------------------
TIMEOUT_PREFIX = "RPCRunner: Timeout"
DISPATCH_POLL_S = 0.05  # how often the dispatcher looks at the candidates in flight (a wake-up, no CPU)


@dataclass
class _KeyHealth:
    timeouts: int = 0  # measurements in a row on the key that timed out
    hung_since: float | None = None  # wall time every board of the key was found hung
    boards: int = 0


_health: dict[tuple[str, int, str], _KeyHealth] = {}
_health_lock = threading.Lock()


def _observe(where: tuple[str, int, str], error_msg: str | None) -> None:
    """Note a measurement's outcome: a timeout counts toward the key's boards being hung;
    anything else (a time, or an error the board answered with) means a board answers."""
    with _health_lock:
        h = _health.setdefault(where, _KeyHealth())
        if error_msg is not None and error_msg.startswith(TIMEOUT_PREFIX):
            h.timeouts += 1
        else:
            h.timeouts, h.hung_since = 0, None


def _free_and_registered(host: str, port: int, key: str) -> tuple[int, int] | None:
    from ..errors import BoardError
    from .tracker import free_and_registered

    try:
        return free_and_registered(host, port, key)
    except BoardError:
        return None  # no tracker: the measurement fails on its own, with that reason


def hung_refusal(where: tuple[str, int, str], timeout_s: float, poll_s: float = 0.5) -> str | None:
    """Why not to send a measurement to the key's boards, or None to send it.

    A board that took a session and stopped answering (SIGSTOP, a hung driver, power lost
    with its TCP connection open) stays checked out at the tracker, so every later request
    waits in the tracker's queue for the whole timeout: with one board, every measurement of
    every task, batch and retry waited it out (an hour a task at the nightly defaults). Here,
    once as many measurements in a row have timed out as the key has boards and no board is
    free, the boards get one more timeout's wait to come back (a board that ran a slow
    candidate does, once it finishes it); after that the key is hung for this process and
    its measurements are refused at once (errors, so the task stops with this reason and
    keeps its records), until a board is free at the tracker again or one answers."""
    host, port, key = where
    with _health_lock:
        h = _health.get(where)
        if h is None or h.timeouts == 0:
            return None
        timeouts, hung_since = h.timeouts, h.hung_since
    seen = _free_and_registered(host, port, key)
    if seen is None or seen[0] > 0 or timeouts < seen[1]:
        return None
    if hung_since is None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(poll_s)
            seen = _free_and_registered(host, port, key)
            if seen is None or seen[0] > 0:
                return None
        with _health_lock:
            h = _health.setdefault(where, _KeyHealth())
            if h.timeouts == 0:  # a board answered meanwhile
                return None
            h.hung_since = hung_since = time.time()
            h.boards = seen[1]
        log.warning(
            "every board under key %r at the tracker %s:%d (%d) is hung: its measurements are refused "
            "until one is free again",
            key,
            host,
            port,
            seen[1],
        )
    return (
        f"not measured: every board under key {key!r} at the tracker {host}:{port} ({seen[1]}) stopped "
        f"answering ({timeouts} measurement(s) in a row timed out, after {timeout_s:.0f} s each, and none "
        f"was free again {timeout_s:.0f} s later; hung since {time.strftime('%H:%M:%S', time.localtime(hung_since))}). "
        "A frozen or hung rpc_server stays checked out at the tracker: restart it and rerun, tuning "
        "continues from the records"
    )


TRACKER_POLL_S = 2.0
MAX_REQUEUES = 3  # a candidate an outage cut off goes out again at most this often


def _tracker_answers(host: str, port: int) -> bool:
    from .tracker import port_open

    return port_open(host, port, 2.0)


def wait_for_tracker(where: tuple[str, int, str], wait_s: float, poll_s: float = TRACKER_POLL_S) -> str | None:
    """None once the tracker answers and lists a board under the key; why not, after `wait_s`.

    A tracker restarted mid-night (an upgrade, its host rebooting) used to turn every
    candidate sent meanwhile into a failed measurement: MetaSchedule never proposes a failed
    schedule again, and a task whose measurements all failed was retried and then failed.
    Candidates wait here instead, and go out once the boards are registered again (ours
    register by themselves: `board_server`)."""
    host, port, key = where
    if _tracker_answers(host, port):
        return None
    log.warning(
        "the tracker %s:%d does not answer: measurements under key %r wait for it (up to %.0f s)",
        host,
        port,
        key,
        wait_s,
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        time.sleep(poll_s)
        seen = _free_and_registered(host, port, key)
        if seen is not None and seen[1] > 0:
            log.warning(
                "the tracker %s:%d is back after %.0f s, with %d board(s) under key %r: measuring again",
                host,
                port,
                time.monotonic() - t0,
                seen[1],
                key,
            )
            return None
    return (
        f"not measured: the tracker at {host}:{port} has not answered (or listed a board under key {key!r}) for "
        f"{wait_s:.0f} s: start it again (`python -m tvm.exec.rpc_tracker --host {host} --port {port}`, or "
        "`vta-pipeline board up`) and rerun; tuning continues from the records"
    )


def _checked(inner, board: BoardSpec, timeout_s: float, workers: int, tracker_wait_s: float = 900.0):
    """`inner` (a MetaSchedule runner) whose results are refused where the board's times cannot
    be true (`trial_log.implausible`): each such measurement becomes an error, so no 0 s
    record reaches the database, the cost model or the best pick, and a board that always lies
    stops the task as any broken setup does, with the reason.

    Candidates go to `inner` one at a time, at most `workers` in flight, each only once
    `hung_refusal` lets it: a key whose boards all hung costs a run one timeout (and one
    wait for them to come back), not one per candidate. While the tracker does not answer
    they wait for it (`wait_for_tracker`); one that failed because the tracker went away
    under it goes out again once it is back, instead of counting as a failed schedule."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    from ..search.trial_log import implausible

    where = (board.tracker_host, board.tracker_port, board.key)

    def checked(r) -> RunnerResult:
        _observe(where, r.error_msg)
        why = implausible(r.run_secs) if r.error_msg is None else None
        return r if why is None else RunnerResult(None, error_msg=f"board under key {board.key!r}: {why}")

    @derived_object
    class GatedFuture(PyRunnerFuture):
        def __init__(self) -> None:
            super().__init__()
            self.settled = threading.Event()
            self.value = None

        def settle(self, value) -> None:
            self.value = value
            self.settled.set()

        def done(self) -> bool:
            return self.settled.is_set()

        def result(self) -> RunnerResult:
            self.settled.wait()
            return self.value

    def dispatch(inputs, gated) -> None:
        pending, in_flight = [(inp, g, 0) for inp, g in zip(inputs, gated)], []
        try:
            while pending or in_flight:
                while pending and len(in_flight) < workers:
                    inp, g, sent = pending.pop(0)
                    why = wait_for_tracker(where, tracker_wait_s) or hung_refusal(where, timeout_s)
                    if why:
                        g.settle(RunnerResult(None, error_msg=why))
                        continue
                    in_flight.append((inner.run([inp])[0], g, inp, sent + 1))
                finished = [x for x in in_flight if x[0].done()]
                for f, g, inp, sent in finished:
                    r = f.result()
                    if (
                        r.error_msg is not None
                        and sent <= MAX_REQUEUES
                        and not _tracker_answers(board.tracker_host, board.tracker_port)
                    ):
                        pending.insert(0, (inp, g, sent))  # cut off by the outage, not the schedule's fault
                        continue
                    g.settle(checked(r))
                in_flight = [x for x in in_flight if not any(x is y for y in finished)]
                if in_flight and not finished:
                    time.sleep(DISPATCH_POLL_S)
        except BaseException as e:  # noqa: BLE001 - every candidate gets a result, whatever broke here
            for g in gated:
                if not g.done():
                    g.settle(RunnerResult(None, error_msg=f"runner dispatch failed: {e!r}"))

    @derived_object
    class CheckedRunner(PyRunner):
        def __init__(self) -> None:
            super().__init__()
            self.pool = inner.pool  # shut down with the runner's lease

        def run(self, runner_inputs):
            gated = [GatedFuture() for _ in runner_inputs]
            threading.Thread(
                target=dispatch, args=(list(runner_inputs), gated), daemon=True, name=f"runner dispatch: {board.key}"
            ).start()
            return gated

    return CheckedRunner()


def runner_device(target) -> str:
    """The device a MetaSchedule `RunnerInput` names for kernels built for `target`: "cpu" for
    CPU code (llvm, c), else the target's kind (cuda, opencl, ...)."""
    return {"llvm": "cpu", "c": "cpu"}.get(target.kind.name, target.kind.name)


@contextlib.contextmanager
def runner(board: BoardSpec, measure: MeasureConfig) -> Iterator[Any]:
    """Lease this process's runner for a board (tracker, key, worker count) and measure config."""
    key = (board.tracker_host, board.tracker_port, board.key, max(1, board.num_boards), measure.model_dump_json())

    def make():
        r = make_runner(board, measure)
        return r, r.pool.shutdown

    with _runners.lease(key, make) as r:
        yield r
