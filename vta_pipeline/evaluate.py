"""Steps 6 and 7, upload and evaluate: run the built library on a board, time it, check it.

The library is uploaded to a board requested from the tracker by key, loaded there and run
in a Relax VM on the board's device. Latency comes from TVM's time evaluator (number runs
per repeat, repeat repeats). The output for the seeded reference input is compared with
the source framework's output recorded at import time, so a wrong tuned kernel fails the
run instead of shipping.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import BoardError

STEP = "evaluate"
VERSION = 3  # 2: repeats within a time budget; 3: runs per repeat from min_repeat_ms, the board's threads
MIN_REPEAT = 3
MAX_NUMBER = 100_000  # runs per repeat, whatever a (lying) first run's time asks for
BOARD_TIMEOUT_S = 300.0  # EvalConfig.board_timeout_s: the longest one call to the board may take
UPLOAD_MIN_BYTES_PER_S = 1 << 20  # an upload's deadline grows with the file, at this slowest link speed
TIMING_SLACK = 3.0  # a timed call may run this many times its planned runs' time (a busy host) ...


@dataclass
class Evaluation:
    mean_ms: float
    std_ms: float
    median_ms: float
    min_ms: float
    repeats: list[float]
    max_abs_err: float
    cosine: float
    correct: bool
    board: str
    vs_float: dict[str, Any] | None = None  # int8 networks: agreement with the float model
    number: int = 1  # runs averaged into each repeat
    threads: int | None = None  # threads the board ran the network with, as it reported them (CPUs)
    board_name: str | None = None  # who the board is (its host name), where it can say
    tvm: str | None = None  # the TVM it runs, where it can say
    emulated: str | None = None  # what emulates the board ("qemu-aarch64 7.2..."): its times are qemu's
    vta_ms: float | None = None  # on a VTA board: the offloaded convs' simulated time per run
    cpu_ms: float | None = None  # ... and the rest of the network's, on the board's CPU
    vta_convs: list[dict[str, Any]] | None = None  # per offloaded conv: workload, knobs, cycles, ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_timing(
    number: int, repeat: int, min_repeat_ms: float, max_seconds: float | None, per_run_s: float
) -> tuple[int, int]:
    """(runs per repeat, repeats) for a network that runs in `per_run_s`.

    Runs per repeat: at least `number`, and enough that one repeat lasts `min_repeat_ms`. A
    repeat of one run of a few milliseconds is at the mercy of the timer, the caches and one
    scheduler tick (docs/performance.md, "Numbers behind the library's choices").
    Repeats: `repeat`, fewer if they do not fit in `max_seconds` (an untuned resnet18 runs
    2 s per inference), never fewer than MIN_REPEAT.
    """
    per_run_s = max(float(per_run_s), 1e-9)
    number = max(number, min(MAX_NUMBER, math.ceil(min_repeat_ms / 1e3 / per_run_s)))
    if max_seconds is None or repeat <= MIN_REPEAT:
        return number, repeat
    fit = int(max_seconds / (per_run_s * number))
    return number, max(MIN_REPEAT, min(repeat, fit))


def _believable(secs, key: str, what: str) -> None:
    """A BoardError where a board's timer reports what cannot be true (`trial_log.implausible`)."""
    from .search.trial_log import implausible

    why = implausible(secs if isinstance(secs, (list, tuple)) else [secs])
    if why:
        raise BoardError(f"timing {what} on a {key!r} board: {why}")


def _device(remote, kind: str):
    return {"llvm": remote.cpu, "cuda": remote.cuda, "opencl": remote.cl}.get(kind, remote.cpu)(0)


class _Calls:
    """The calls of one board session, each given up on after its deadline (`boards.within`):
    a board that accepted the session and stopped answering fails the step with what to do,
    where it used to block the run (and every later night queued behind it) for good."""

    def __init__(self, tracker: tuple[str, int], key: str, timeout_s: float) -> None:
        self.tracker, self.key, self.timeout_s = tracker, key, float(timeout_s)

    def __call__(self, what: str, call: Callable[[], Any], extra_s: float = 0.0) -> Any:
        from .boards import BoardHung, within

        limit = self.timeout_s + extra_s
        try:
            return within(limit, what, call)
        except BoardHung:
            host, port = self.tracker
            raise BoardHung(
                f"{what} on a {self.key!r} board (tracker {host}:{port}) did not finish within {limit:.0f} s: the "
                "board took the session and stopped answering (a frozen or hung rpc_server, a board that lost "
                "power). Restart that board's rpc_server (`vta-pipeline board status` lists a local board's "
                "processes) and rerun: the tuning and the build are kept in the store, and the rerun goes "
                "straight to this step. A network that really runs this long on the board needs a larger "
                "evaluate.board_timeout_s (--config)"
            ) from None

    def upload(self, remote, lib_path: Path, target: str | None = None) -> None:
        size = Path(lib_path).stat().st_size
        self(
            f"uploading {Path(lib_path).name} ({size / 2**20:.1f} MiB)",
            lambda: remote.upload(str(lib_path), target=target),
            extra_s=size / UPLOAD_MIN_BYTES_PER_S,
        )


def _request_board(tracker: tuple[str, int], key: str, session_timeout: int, calls: _Calls | None = None):
    """A session on a board under `key`, or a BoardError that says how to get one."""
    from tvm import rpc

    from .boards import BoardHung, count_servers

    host, port = tracker
    if count_servers(host, port, key) == 0:  # request() would block forever on an empty key
        raise BoardError(
            f"no board is registered under key {key!r} at the tracker {host}:{port}; start one with "
            f"`python -m tvm.exec.rpc_server --tracker {host}:{port} --key {key}` and rerun"
        )
    calls = calls or _Calls(tracker, key, BOARD_TIMEOUT_S)
    try:
        return calls(
            "requesting a session",
            lambda: rpc.connect_tracker(host, port).request(key, priority=1, session_timeout=session_timeout),
        )
    except BoardHung:
        raise
    except Exception as e:
        raise BoardError(f"could not get a board with key {key!r} from the tracker at {host}:{port}: {e}") from None


def _timed_s(number: int, repeat: int, per_run_s: float) -> float:
    """The deadline's share for `repeat` repeats of `number` runs of `per_run_s` each."""
    return TIMING_SLACK * number * repeat * max(per_run_s, 0.0)


def evaluate_on_board(
    lib_path: Path,
    reference: tuple[np.ndarray, np.ndarray],
    target_kind: str,
    tracker: tuple[str, int],
    key: str,
    number: int,
    repeat: int,
    rtol: float,
    atol: float,
    session_timeout: int = 600,
    float_output: np.ndarray | None = None,
    max_seconds: float | None = None,
    min_repeat_ms: float = 0.0,
    vta: bool = False,
    board_timeout_s: float = BOARD_TIMEOUT_S,
) -> Evaluation:
    """Upload, run once for the output check, then time: a warm-up run (it also sizes the
    repeats, see `plan_timing`) and `repeat` repeats of `number` or more runs each.

    `vta`: the network's convs are offloaded to a VTA simulator board, whose wall time is the
    host simulating: a run's time is then the convs' simulated time plus the CPU's share
    (`vta.network.time_on_board`), over `repeat` runs (at most MIN_REPEAT: the simulating is slow).

    Every call to the board has a deadline (`board_timeout_s`, the upload's grown with the
    file, the timing's with its planned runs): past it, a BoardHung that says what to do."""
    import tvm
    from tvm import relax

    from .boards import remote_identity

    host, port = tracker
    calls = _Calls(tracker, key, board_timeout_s)
    remote = _request_board(tracker, key, session_timeout, calls)
    name = Path(lib_path).name
    try:
        calls.upload(remote, lib_path)
        lib = calls(f"loading {name}", lambda: remote.load_module(name))
        dev = _device(remote, target_kind)
        vm = relax.VirtualMachine(lib, dev)
        x, y_ref = reference
        xd = calls("sending the input", lambda: tvm.runtime.tensor(x, dev))

        def output():
            out = vm["main"](xd)
            return (out[0] if not isinstance(out, tvm.runtime.Tensor) else out).numpy()

        y = calls(f"running {name} once", output)
        split = None
        if vta:
            from .vta.network import time_on_board

            split = calls(
                f"simulating {name}",
                lambda: time_on_board(vm, dev, remote, [xd], repeat=min(repeat, MIN_REPEAT)),
                extra_s=board_timeout_s * min(repeat, MIN_REPEAT),
            )
            number, reps = 1, [split.total_ms]
        else:
            per_run_s = calls(
                f"a warm-up run of {name}", lambda: vm.time_evaluator("main", dev, number=1, repeat=1)(xd).mean
            )  # ... and sized
            _believable(per_run_s, key, name)
            number, repeat = plan_timing(number, repeat, min_repeat_ms, max_seconds, per_run_s)
            timer = vm.time_evaluator("main", dev, number=number, repeat=repeat)
            res = calls(
                f"timing {name} ({repeat} x {number} runs)",
                lambda: timer(xd),
                extra_s=_timed_s(number, repeat, per_run_s),
            )
            _believable(list(res.results), key, name)
            reps = [float(r) * 1e3 for r in res.results]
        who = calls("asking who the board is", lambda: remote_identity(remote))
        threads = who.get("threads") if target_kind == "llvm" else None
    except BoardError:
        raise
    except Exception as e:
        raise BoardError(f"running {Path(lib_path).name} on a {key!r} board failed: {e}") from None
    y = y.reshape(y_ref.shape).astype("float64")
    yr = y_ref.astype("float64")
    cos = float(np.dot(y.ravel(), yr.ravel()) / (np.linalg.norm(y) * np.linalg.norm(yr) + 1e-30))
    vs_float = None
    if float_output is not None:
        from .quantize import agreement

        vs_float = agreement(y.astype("float32"), float_output)
    return Evaluation(
        mean_ms=statistics.fmean(reps),
        std_ms=statistics.pstdev(reps),
        median_ms=statistics.median(reps),
        min_ms=min(reps),
        repeats=reps,
        max_abs_err=float(np.max(np.abs(y - yr))),
        cosine=cos,
        correct=bool(np.allclose(y, yr, rtol=rtol, atol=atol)),
        board=f"{key}@{host}:{port}",
        vs_float=vs_float,
        number=number,
        threads=threads,
        board_name=who.get("name"),
        tvm=who.get("tvm"),
        emulated=who.get("emulated"),
        vta_ms=split.vta_ms if split else None,
        cpu_ms=split.cpu_ms if split else None,
        vta_convs=split.convs if split else None,
    )


def time_in_turn(
    libs: Sequence[Path],
    x: np.ndarray,
    target_kind: str,
    tracker: tuple[str, int],
    key: str,
    rounds: int,
    min_repeat_ms: float = 50.0,
    session_timeout: int = 600,
    local: Sequence[Callable[[], float]] = (),
    settle_s: float = 0.5,
    board_timeout_s: float = BOARD_TIMEOUT_S,
) -> list[list[float]]:
    """Each library's latency (ms per run) in each of `rounds` rounds, all of them on one board
    session, one after the other in every round: the first library first in even rounds and
    last in odd ones, so that neither always runs in the other's wake.

    Two evaluations taken on different nights (or minutes apart on a shared host) differ by
    more than many regressions do (docs/performance.md: two evaluations of equal builds far
    apart, even when timed in turn). In turn, the host's drift moves both libraries of a round
    alike and their ratio stays.
    Each library's runs per round are sized (on a warm run) to last `min_repeat_ms`; a first
    round is not counted (a first repeat runs cold and slow). In every
    round each engine runs once untimed right before its timed runs (a `local` engine does the
    same itself, `baseline._timer`): the engine before it has just evicted its weights from the
    caches and its threads slept through the rest, and only one of the two sides paying for
    that made the comparison depend on how many runs filled a round."""
    import tvm
    from tvm import relax

    if rounds < 1 or len(libs) + len(local) < 2:
        raise ValueError(
            f"timing in turn needs two or more engines and a round or more, got {len(libs) + len(local)} and {rounds}"
        )
    calls = _Calls(tracker, key, board_timeout_s)
    remote = _request_board(tracker, key, session_timeout, calls)
    try:
        dev = _device(remote, target_kind)
        timers = []
        for i, lib_path in enumerate(libs):
            name = f"in_turn_{i}_{Path(lib_path).name}"  # builds share the file name model.so
            calls.upload(remote, lib_path, target=name)
            vm = relax.VirtualMachine(calls(f"loading {name}", lambda: remote.load_module(name)), dev)
            xd = calls("sending the input", lambda: tvm.runtime.tensor(x, dev))
            once = vm.time_evaluator("main", dev, number=1, repeat=1)
            # sized on a warm run: the first run of a build pays its page faults and the threads'
            # wake-up, and runs sized on it were too few to fill min_repeat_ms
            per_run_s = min(
                calls(
                    f"a warm-up run of {name}", lambda: vm.time_evaluator("main", dev, number=1, repeat=2)(xd).results
                )
            )
            _believable(per_run_s, key, Path(lib_path).name)
            number, _ = plan_timing(1, 1, min_repeat_ms, None, per_run_s)
            timers.append(
                (
                    vm.time_evaluator("main", dev, number=number, repeat=1),
                    xd,
                    Path(lib_path).name,
                    _timed_s(number, 1, per_run_s),
                    once,
                )
            )

        def board_ms(t, xd, name, extra_s, once) -> float:
            calls(f"a warm-up run of {name}", lambda: once(xd))  # untimed, as each local engine's first run
            secs = float(calls(f"timing {name}", lambda: t(xd).mean, extra_s=extra_s))
            _believable(secs, key, name)
            return secs * 1e3

        engines = [lambda a=a: board_ms(*a) for a in timers] + list(local)
        ms: list[list[float]] = [[] for _ in engines]
        for r in range(-1, rounds):  # round -1 is not counted: each library's first full repeat runs cold
            order = range(len(engines)) if r % 2 == 0 else reversed(range(len(engines)))
            for i in order:
                time.sleep(settle_s)  # the previous engine's spinning threads go to sleep
                t = engines[i]()
                if r >= 0:
                    ms[i].append(t)
    except BoardError:
        raise
    except Exception as e:
        raise BoardError(
            f"timing {', '.join(Path(p).name for p in libs)} in turn on a {key!r} board failed: {e}"
        ) from None
    return ms
