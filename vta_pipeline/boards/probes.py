"""What a run asks of the boards themselves, each call with a deadline: a health check, who
they are (name, TVM, threads), and the device limits a GPU target reads off its board."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from ..errors import BoardError
from .tracker import free_and_registered

log = logging.getLogger(__name__)


class BoardHung(BoardError):
    """A board that accepted a session and then did not answer one call within its deadline."""


def within(timeout_s: float, what: str, call: Callable[[], Any]) -> Any:
    """`call()` given up on after `timeout_s`: a BoardHung naming `what` (and its deadline).

    TVM's RPC client has no deadline of its own: a call to a board that accepted the session
    and stopped answering (SIGSTOP, a hung driver, a board that lost power with its TCP
    connection still open) blocks its caller for good, and a frozen process still heartbeats
    to Prefect, so nothing marks the run Crashed. The call runs in a daemon thread; the
    caller goes on (to fail with the reason) and the thread stays blocked on the dead socket
    until the process exits. Exceptions from `call` are re-raised as they are.
    """
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            outcome["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"board call: {what}")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise BoardHung(f"{what} did not finish within {timeout_s:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _on_a_board(
    host: str,
    port: int,
    key: str,
    timeout_s: float,
    work: Callable[[Any], Any],
    what: str,
    failed: str = ": ",
    hung: str = "",
) -> Any:
    """`work(remote)` on a board under `key`, with a deadline (`within`). Every failure is a
    BoardError naming the key and the tracker."""
    from tvm import rpc

    def run() -> Any:
        remote = rpc.connect_tracker(host, port).request(key, priority=1, session_timeout=int(timeout_s))
        return work(remote)

    where = f"key {key!r} at the tracker {host}:{port}"
    try:
        return within(timeout_s, what, run)
    except BoardHung:
        raise BoardError(f"{what}: a board under {where} did not answer within {timeout_s:.0f} s{hung}") from None
    except Exception as e:  # reported with the key and the tracker
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        raise BoardError(f"{what}: a board under {where}{failed}{msg}") from None


def health_check(
    host: str,
    port: int,
    key: str,
    target_spec: dict[str, Any],
    timeout_s: float = 120.0,
    cross_compiler: str | None = None,
) -> float:
    """Run a trivial kernel (y = x + 1) on a board under `key`; return its run time in ms.

    Catches, before a night of tuning, a board that is registered but cannot run what we
    build for it (wrong target or ABI, missing runtime, a hung server). CPU targets only;
    GPU kinds are checked by their first measurements.
    """
    import tempfile

    import numpy as np
    import tvm
    from tvm import te

    if target_spec.get("kind") != "llvm":
        return 0.0
    n = 1024
    a = te.placeholder((n,), name="a", dtype="float32")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="b")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, b])}), target=tvm.target.Target(target_spec))

    def run(remote) -> tuple[bool, float]:
        with tempfile.TemporaryDirectory() as d:
            path = f"{d}/vta_pipeline_health.so"
            if cross_compiler:
                from tvm.support import cc

                lib.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
            else:
                lib.export_library(path)
            remote.upload(path)
            f = remote.load_module("vta_pipeline_health.so")
        dev = remote.cpu(0)
        x = np.arange(n, dtype="float32")
        xd, yd = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros(n, "float32"), dev)
        f(xd, yd)
        ok = bool(np.array_equal(yd.numpy(), x + 1))
        return ok, f.time_evaluator(f.entry_name, dev, number=10)(xd, yd).mean * 1e3

    ok, ms = _on_a_board(
        host, port, key, timeout_s, run, "health check", failed=" cannot run a trivial kernel: ", hung=" (hung board?)"
    )
    if not ok:
        raise BoardError(
            f"health check: a board under key {key!r} at the tracker {host}:{port} computed a wrong "
            "result for y = x + 1"
        )
    from ..search.trial_log import implausible

    why = implausible([ms / 1e3])
    if why:
        raise BoardError(f"health check: a board under key {key!r} at the tracker {host}:{port}: {why}")
    return float(ms)


def remote_threads(remote) -> int | None:
    """The threads a connected board's runtime runs CPU kernels with; None where it cannot say
    (a runtime without the query).

    TVM_NUM_THREADS on the board's rpc_server sets it; unset, TVM uses half the logical CPUs
    on x86 (it assumes SMT) and all of them elsewhere.
    """
    try:
        return int(remote.get_function("runtime.NumThreads")())
    except Exception:  # noqa: BLE001 - the measurements then say "-", never fail over it
        return None


BOARD_INFO = "vta_pipeline.board_info"
"""A function the project's board servers give every session: who the board is (its host
name), which TVM it runs and with how many threads, as JSON. TVM's runtime has no query
for its own version; a board running TVM's stock rpc_server answers only the threads."""


def register_board_info() -> None:
    """Give this process (and the session processes it forks) `BOARD_INFO`."""
    import json as json_
    import os
    import platform

    import tvm

    emulated = os.environ.get("VTA_PIPELINE_EMULATED") or None  # boards.emulator: qemu runs this board

    def info() -> str:
        threads = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
        name = platform.node() + (f" (emulated {platform.machine()})" if emulated else "")
        return json_.dumps(
            {
                "name": name,
                "tvm": tvm.__version__,
                "threads": int(threads()) if threads else None,
                **({"emulated": emulated} if emulated else {}),
            }
        )

    tvm.register_global_func(BOARD_INFO, info, override=True)


def remote_identity(remote) -> dict[str, Any]:
    """Who a connected board is: {"name", "tvm", "threads"}, None where it cannot say."""
    try:
        return dict(json.loads(remote.get_function(BOARD_INFO)()))
    except Exception:  # noqa: BLE001 - a stock rpc_server: its threads are all it can tell
        return {"name": None, "tvm": None, "threads": remote_threads(remote)}


def board_identities(host: str, port: int, key: str, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """`remote_identity` of each of the `n` boards under `key`: their sessions are held open
    together, so the tracker hands out a different board each time."""
    from tvm import rpc

    def ask() -> list[dict[str, Any]]:
        held, out = [], []
        tracker = rpc.connect_tracker(host, port)
        for _ in range(n):
            remote = tracker.request(key, priority=1, session_timeout=int(timeout_s))
            held.append(remote)
            out.append(remote_identity(remote))
        return out

    try:
        return within(timeout_s, "board identity query", ask)
    except BoardHung:
        raise BoardError(
            f"identifying the {n} board(s) under key {key!r} at the tracker {host}:{port}: they did not "
            f"all answer within {timeout_s:.0f} s (a board busy with another run, or hung)"
        ) from None


def identity_problems(identities: list[dict[str, Any]], threads: int | None) -> list[str]:
    """What makes a board's measurements not this run's: a TVM other than the one this host
    compiles with (a library is built for the runtime it is loaded by), or kernels run with
    other than the `threads` the target is scheduled for (a time then holds for those threads
    only). A board that cannot say is not a mismatch."""
    import tvm

    problems = []
    for i, b in enumerate(identities):
        who = f"board {i + 1} of {len(identities)}" + (f" ({b['name']})" if b.get("name") else "")
        if b.get("tvm") and b["tvm"] != tvm.__version__:
            problems.append(
                f"{who} runs TVM {b['tvm']}, this host compiles with TVM {tvm.__version__}: install "
                f"apache-tvm=={tvm.__version__} on the board (or this host's version of the board's)"
            )
        if threads and b.get("threads") and b["threads"] != threads:
            problems.append(
                f"{who} runs kernels with {b['threads']} thread(s), the target is scheduled for {threads} "
                f"core(s): set TVM_NUM_THREADS={threads} where the board's server starts, or give the "
                f'target "num-cores": {b["threads"]}'
            )
    return problems


def check_boards(
    host: str, port: int, key: str, n_boards: int, threads: int | None, mismatch: str = "refuse"
) -> tuple[list[dict[str, Any]], list[str]]:
    """The identities of the key's boards free now (one at least, waited for), and what does
    not match this run (`identity_problems`): a BoardError naming each when `mismatch` is
    "refuse", else returned to be warned about."""
    n = max(1, min(n_boards, free_and_registered(host, port, key)[0]))
    identities = board_identities(host, port, key, n)
    problems = identity_problems(identities, threads)
    if problems and mismatch == "refuse":
        raise BoardError(
            f"the boards under key {key!r} at the tracker {host}:{port} do not match this run: "
            + "; ".join(problems)
            + ". (Or set board.mismatch: warn to measure on them anyway.)"
        )
    return identities, problems


def describe_boards(identities: list[dict[str, Any]]) -> dict[str, Any]:
    """What a measurement row records of the boards that may have measured it: their names
    and TVM versions (one each where the key has one board; TVM's runner does not say which
    of several boards measured a candidate, so a row of a key with several names them all,
    all checked to run the same TVM with the same threads)."""
    names = sorted({b.get("name") or "?" for b in identities})
    versions = sorted({b.get("tvm") for b in identities if b.get("tvm")})
    emulated = sorted({b["emulated"] for b in identities if b.get("emulated")})
    return {
        "board": ",".join(names) if identities else None,
        "tvm": ",".join(versions) or None,
        **({"emulated": ",".join(emulated)} if emulated else {}),
    }


def board_threads(host: str, port: int, key: str, timeout_s: float = 60.0) -> int | None:
    """`remote_threads` of a board under `key`; None (and a warning) where no board answers."""
    try:
        return _on_a_board(host, port, key, timeout_s, remote_threads, "thread count query")
    except BoardError as e:
        log.warning("could not read the thread count of a board under key %r: %s", key, e)
        return None


# What MetaSchedule's GPU search must obey, as the device reports it (tvm.runtime.Device).
DEVICE_PARAMS = {
    "max_threads_per_block": "max_threads_per_block",
    "max_shared_memory_per_block": "max_shared_memory_per_block",
    "thread_warp_size": "warp_size",
}


def device_params(host: str, port: int, key: str, device: str, timeout_s: float = 60.0) -> dict[str, int]:
    """Read a GPU board's limits (threads per block, shared memory, warp size) over RPC, as
    the Mali recipe did before tuning: the preset's numbers are only a typical board's."""

    def read(remote) -> dict[str, int]:
        dev = {"cuda": remote.cuda, "opencl": remote.cl}[device](0)
        if not dev.exist:
            raise RuntimeError(f"the board has no {device} device (is its TVM runtime built with it?)")
        return {ours: int(getattr(dev, attr)) for ours, attr in DEVICE_PARAMS.items()}

    return _on_a_board(host, port, key, timeout_s, read, "device query")
