"""Boards: a TVM RPC tracker and the rpc_server processes registered under a key.

`LocalBoard` starts the same processes our users run on their racks
(`python -m tvm.exec.rpc_tracker`, `python -m tvm.exec.rpc_server --tracker ... --key ...`)
on 127.0.0.1, so the pipeline measures through exactly the code path it uses at night.
The processes are recorded in a JSON state file so `vta-pipeline board status|down` can
find them from another shell.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import BoardError
from .liveness import alive, identity


@dataclass
class BoardSpec:
    """Where a task measures: the boards under `key` at a tracker, as tuning and the pools see them."""

    tracker_host: str
    tracker_port: int
    key: str
    num_boards: int = 1
    threads: int | None = None  # what the key's boards reported (the flow reads it once per run)
    board: str | None = None  # their names (describe_boards): each trial row records who measured it
    tvm: str | None = None  # the TVM version they run


SERVER_PORT_RANGE = 64  # ports an rpc_server tries from its first, should another process take that one


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something listens at host:port.

    A connect to a closed loopback port in the ephemeral range can pick that same port as its
    own source and connect to itself (TCP simultaneous open): that is no listener, and taking
    it for one would call a dead tracker up.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            return s.getsockname() != s.getpeername()
    except OSError:
        return False


TRACKER_CONNECT_TIMEOUT_S = 10.0
"""How long a tracker's TCP handshake may take before we call the tracker down.

TVM's tracker listens with a backlog of 1: while its event loop is busy (tuning workers
and rpc_servers all talk to it) or its host is CPU-starved, the kernel's accept queue
holds two connections and drops further SYNs, which the client resends after 1 s, 3 s,
7 s. A 1 s limit turned such a stall into "no tracker" in the middle of a tuning run.
A tracker that is really gone refuses the connection at once, so this costs nothing there.
"""


def tracker_summary(host: str, port: int, connect_timeout_s: float = TRACKER_CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """What `python -m tvm.exec.query_rpc_tracker` shows, as a dict."""
    from tvm import rpc

    if not port_open(host, port, connect_timeout_s):
        raise BoardError(tracker_down_message(host, port))
    try:
        return rpc.connect_tracker(host, port).summary()
    except (ConnectionError, EOFError) as e:  # it accepted, then went away: a tracker shutting down
        raise BoardError(
            f"{tracker_down_message(host, port)} (it accepted the connection, then dropped it: {e})"
        ) from e


def tracker_down_message(host: str, port: int) -> str:
    return (
        f"no RPC tracker answers at {host}:{port}. Start one with "
        f"`python -m tvm.exec.rpc_tracker --host {host} --port {port}` (or `vta-pipeline board up`), "
        "or run without --tracker to use a local board"
    )


def count_servers(host: str, port: int, key: str) -> int:
    """Servers (idle or busy) registered under `key`, as the tracker lists them."""
    summary = tracker_summary(host, port)
    return sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{key}")


def free_and_registered(host: str, port: int, key: str) -> tuple[int, int]:
    """Servers under `key` no session holds now, and all registered under it, from one summary."""
    summary = tracker_summary(host, port)
    free = int(summary.get("queue_info", {}).get(key, {}).get("free", 0))
    return free, sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{key}")


def preflight(host: str, port: int, key: str, wait_s: float = 10.0) -> int:
    """Fail fast (before any expensive step) if the tracker or the key's boards are missing."""
    deadline = time.time() + wait_s
    while True:
        n = count_servers(host, port, key)
        if n > 0:
            return n
        if time.time() > deadline:
            summary = tracker_summary(host, port)
            keys = ", ".join(sorted(summary.get("queue_info", {}))) or "none"
            raise BoardError(
                f"the tracker at {host}:{port} has no boards under key {key!r} (keys present: {keys}). "
                f"Start one with `python -m tvm.exec.rpc_server --tracker {host}:{port} --key {key}`"
            )
        time.sleep(0.5)


def format_summary(summary: dict[str, Any]) -> str:
    """The two tables `python -m tvm.exec.query_rpc_tracker` prints."""
    lines = ["Server List", "-" * 40, "server-address         key"]
    for s in summary.get("server_info", []):
        addr = s.get("addr", ["?", "?"])
        lines.append(f"{addr[0] + ':' + str(addr[1]):<23}{s.get('key')}")
    lines += ["", "Queue Status", "-" * 40, f"{'key':<16}{'total':>6}{'free':>6}{'pending':>8}"]
    for key, q in sorted(summary.get("queue_info", {}).items()):
        total = sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{key}")
        lines.append(f"{key:<16}{total:>6}{int(q.get('free', 0)):>6}{int(q.get('pending', 0)):>8}")
    return "\n".join(lines)


START_TIMEOUT_S = 600.0
"""How long a local board may take to come up: its tracker listening and every server registered.

Each process imports TVM on its own; on a 2-core machine right after `uv sync`, with the
Prefect server and the flow's own imports starting beside them, that has taken over a
minute. A process that dies instead fails the start at once, so the long limit only costs
time when a process hangs.
"""

PROGRESS_EVERY_S = 15.0
"""How often a slow start says what it is still waiting for."""

REGISTRY = Path(os.environ.get("VTA_PIPELINE_BOARD_REGISTRY", "~/.vta-pipeline/boards")).expanduser()
"""Where every owned local board records its processes and its owner (one JSON file each), so
that a later start can reap a board whose owner died without stopping it."""

log = logging.getLogger(__name__)


@dataclass
class LocalBoard:
    """A tracker and N rpc_server processes on 127.0.0.1 (or another bind address).

    Owned (the default, `detached=False`): every process runs under
    `vta_pipeline.watchdog` and kills its own process group when the process that
    started the board dies, however it dies; the board is also recorded in `registry`, so
    the next board started on this machine reaps it if the watchdogs could not (see
    `reap_orphans`). Detached (`board up`): the board outlives the command that started
    it, recorded in `state_file` until `board down`.

    Each process's output goes to a log of its own in `log_dir`: when a process does not
    come up, the error shows the tail of its log.

    One server by default: two servers on one host time candidates at the same time on the
    same cores, and each slows the other (candidates ranked 10-100 measured up to 3x slower
    than re-timed alone), which misleads the search's cost model. Each server's kernels run
    `threads` threads (default: this machine's logical CPUs, TVM_NUM_THREADS).
    """

    key: str = "host"
    num_servers: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    state_file: Path | None = None
    log_dir: Path | None = None
    detached: bool = False
    registry: Path | None = None
    threads: int | None = None
    # the server program: TVM's, or one that registers more functions (the VTA simulator board's)
    server_module: str = "vta_pipeline.board_server"
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_dir = Path(self.log_dir) if self.log_dir else None
        self.registry = Path(self.registry) if self.registry else None
        if self.threads is None:
            self.threads = os.cpu_count() or 1

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"

    def _registry(self) -> Path:
        return self.registry or REGISTRY

    def _log_path(self, role: str) -> Path:
        d = self.log_dir or self._registry().parent / "logs"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"board-{self.key}-{self.port}-{role}.log"

    def _spawn(self, args: list[str], role: str) -> subprocess.Popen:
        # TVM's runtime uses half the logical CPUs on x86 unless told (it assumes SMT): a
        # board measures with the threads the network will run with, the target's cores.
        # tvm_ffi's import asks torch.cuda.is_available() where PyTorch is installed, which
        # initializes CUDA in the rpc_server before it forks a process per session: on a GPU
        # board every session then failed with cudaErrorInitializationError (an H200). A
        # board exchanges no tensors with PyTorch, so it goes without that hook.
        env = dict(
            os.environ, PYTHONUNBUFFERED="1", TVM_NUM_THREADS=str(self.threads), TVM_FFI_DISABLE_TORCH_C_DLPACK="1"
        )
        cmd = [sys.executable, "-m"]
        if not self.detached:
            cmd += ["vta_pipeline.watchdog", "--watch", str(os.getpid()), "--"]
        path = self._log_path(role)
        with path.open("ab") as out:
            out.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n".encode())
            out.flush()
            p = subprocess.Popen(
                [*cmd, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal goes to us, we stop them in order
            )
        self.procs.append(p)
        self.logs.append(path)
        return p

    def _role(self, i: int) -> str:
        return "tracker" if i == 0 else f"rpc server {i} of {self.num_servers}"

    def start(self, timeout: float = START_TIMEOUT_S) -> LocalBoard:
        """Start the tracker and the servers; return once every server is registered.

        Says what it waits for every PROGRESS_EVERY_S; a process that exits, or one not up
        within `timeout`, stops the board and raises a BoardError naming that process, with
        the tail of its log.
        """
        reap_orphans(self._registry())
        if not self.port:
            self.port = free_port(self.host)
        t0 = time.monotonic()
        self._spawn(
            ["tvm.exec.rpc_tracker", "--host", self.host, "--port", str(self.port), "--port-end", str(self.port + 1)],
            "tracker",
        )
        if not self.detached:
            self._record()
        self._wait(
            lambda: port_open(self.host, self.port, 0.5),
            t0,
            timeout,
            lambda: f"the RPC tracker to listen on {self.tracker}",
            waiting_on=[0],
        )
        for i in range(self.num_servers):
            self.add_server(record=False)
        if not self.detached:
            self._record()
        self._wait(
            lambda: self._registered() >= self.num_servers,
            t0,
            timeout,
            lambda: (
                f"{self.num_servers} rpc server(s) to register under key {self.key!r} "
                f"({self._registered()} of {self.num_servers} so far)"
            ),
            waiting_on=None,
        )
        log.info(
            "local board up in %.0f s: tracker %s, %d server(s) under key %r (logs: %s)",
            time.monotonic() - t0,
            self.tracker,
            self.num_servers,
            self.key,
            self.logs[0].parent,
        )
        self._save()
        return self

    def _wait(
        self,
        ready: Callable[[], bool],
        t0: float,
        timeout: float,
        what: Callable[[], str],
        waiting_on: list[int] | None,
    ) -> None:
        last_said = time.monotonic()
        while not ready():
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    self._fail(i, f"exited with status {p.returncode} while the board was starting")
            now = time.monotonic()
            if now - t0 > timeout:
                late = waiting_on if waiting_on is not None else self._unregistered()
                self._fail(
                    late[0] if late else len(self.procs) - 1, f"was not up after {timeout:.0f} s (waiting for {what()})"
                )
            if now - last_said >= PROGRESS_EVERY_S:
                log.info("local board: waiting for %s, %.0f s so far", what(), now - t0)
                last_said = now
            time.sleep(0.2)

    def _registered(self) -> int:
        try:
            return count_servers(self.host, self.port, self.key)
        except BoardError:
            return 0

    def _unregistered(self) -> list[int]:
        """Indices of the servers whose listening port the tracker does not list."""
        try:
            ports = {
                int(s["addr"][1])
                for s in tracker_summary(self.host, self.port).get("server_info", [])
                if s.get("key") == f"server:{self.key}"
            }
        except (BoardError, KeyError, IndexError, ValueError):
            return list(range(1, len(self.procs)))
        return [i for i in range(1, len(self.procs)) if not (_listen_ports(self.procs[i].pid) & ports)]

    def _fail(self, i: int, why: str) -> None:
        p, path = self.procs[i], self.logs[i]
        tail = log_tail(path)
        self.stop()
        raise BoardError(f"local board: the {self._role(i)} (pid {p.pid}) {why}. Its output ({path}):\n{tail}")

    def add_server(self, record: bool = True) -> subprocess.Popen:
        """Start one more rpc_server. Each searches for its listening port from its own free
        port: TVM's server binds with SO_REUSEADDR, so two servers started at once from the
        same first port (9090, the default) could both bind it, and the second then died in
        `listen` with "Address already in use" (seen in CI on a 2-server board)."""
        i = len(self.procs)
        first = free_port(self.host)
        p = self._spawn(
            [
                self.server_module,
                "--tracker",
                self.tracker,
                "--key",
                self.key,
                "--host",
                self.host,
                "--port",
                str(first),
                "--port-end",
                str(min(first + SERVER_PORT_RANGE, 65536)),
            ],
            f"server{i}",
        )
        if record and not self.detached:
            self._record()
        return p

    @property
    def servers(self) -> list[subprocess.Popen]:
        return self.procs[1:]

    def stop(self) -> None:
        """Stop every process of every group, not just the group leaders.

        The tracker's listening socket lives in a child of `tvm.exec.rpc_tracker` (a PopenWorker),
        which can outlive its parent by a moment: until it is gone the port still accepts, and a
        caller that was told "stopped" would talk to a tracker that is dying.
        """
        for p in reversed(self.procs):
            _terminate(p.pid)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _terminate(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        for p in self.procs:
            if not _group_gone(p.pid, timeout_s=5.0):
                _terminate(p.pid, signal.SIGKILL)
                _group_gone(p.pid, timeout_s=5.0)
        self.procs.clear()
        if self.state_file and self.state_file.exists():
            self.state_file.unlink()
        if self.port:
            self._registry_file().unlink(missing_ok=True)

    def _registry_file(self) -> Path:
        return self._registry() / f"{self.host}-{self.port}.json"

    def _record(self) -> None:
        """Write (or rewrite) this board's registry entry: its owner and every process."""
        d = self._registry()
        d.mkdir(parents=True, exist_ok=True)
        from .store import atomic_write_text

        atomic_write_text(
            self._registry_file(),
            json.dumps(
                {
                    "tracker": self.tracker,
                    "key": self.key,
                    "owner": identity(os.getpid()),
                    "procs": [identity(p.pid) for p in self.procs],
                }
            ),
        )

    def _save(self) -> None:
        if self.state_file:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            self.state_file.write_text(
                json.dumps(
                    {
                        "tracker": self.tracker,
                        "key": self.key,
                        "pids": [p.pid for p in self.procs],
                        "procs": [identity(p.pid) for p in self.procs],
                    }
                )
            )

    def __enter__(self) -> LocalBoard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a process's log, indented, for an error message."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"    (could not read it: {e})"
    return "\n".join("    " + line for line in text) or "    (empty)"


def _listen_ports(pid: int) -> set[int]:
    """TCP ports a process or its children listen on (a server listens in a PopenWorker child)."""
    import psutil

    ports: set[int] = set()
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            ports |= {c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        pass
    return ports


def reap_orphans(registry: Path | None = None) -> list[str]:
    """Stop the boards in `registry` whose owner is dead; return their trackers.

    A board's watchdogs normally stop it within a second of its owner's death; this catches
    the rest (a watchdog that was itself killed or stopped, or could not act). Boards of
    versions before the registry recorded nothing and are not found here. Only processes that are still the ones recorded (same pid, same
    start time) are signalled. Boards with a living owner are left alone.
    """
    registry = registry or REGISTRY
    reaped = []
    for f in sorted(registry.glob("*.json")) if registry.is_dir() else []:
        try:
            state = json.loads(f.read_text())
            owner, procs = state["owner"], state["procs"]
        except (OSError, ValueError, KeyError, TypeError):
            f.unlink(missing_ok=True)  # torn or foreign: nothing we can act on
            continue
        if alive(owner):
            continue
        running = [ident for ident in procs if alive(ident)]
        for ident in reversed(running):
            _terminate(ident["pid"], signal.SIGKILL)
        for ident in running:
            _group_gone(ident["pid"], timeout_s=5.0)
        f.unlink(missing_ok=True)
        if running:
            log.warning(
                "stopped %d process(es) of the local board at %s (key %r): its owner, pid %s, had died "
                "without stopping it",
                len(running),
                state.get("tracker"),
                state.get("key"),
                owner.get("pid"),
            )
            reaped.append(str(state.get("tracker")))
    return reaped


def _terminate(pid: int, sig: int = signal.SIGTERM) -> None:
    """Signal a process group started by LocalBoard (rpc_server forks workers)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process is left in the process group `pgid`."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in group `pgid`.

    Zombies count as gone: an orphan's zombie waits for an init that may never reap it
    (containers often run something else as pid 1), and it holds no socket.
    """
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the kernel's answer, zombies included
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":  # after "comm)": state, ppid, pgrp
            return True
    return False


BOARD_PROGRAMS = ("rpc_tracker", "rpc_server", "board_server", "vta_pipeline.watchdog")


def _still_ours(state: dict[str, Any]) -> list[int]:
    """The recorded pids that are still the processes `board up` started: same pid and start
    time (a pid the kernel gave to another program since, after a reboot say, is never
    signalled). State files from before the start times were recorded: a pid whose command
    line runs one of the board's programs."""
    if "procs" in state:
        return [int(i["pid"]) for i in state["procs"] if i.get("start") is not None and alive(i)]
    import psutil

    ours = []
    for pid in state.get("pids", []):
        try:
            cmd = " ".join(psutil.Process(int(pid)).cmdline())
        except psutil.Error:
            continue
        if any(prog in cmd for prog in BOARD_PROGRAMS):
            ours.append(int(pid))
    return ours


def stop_from_state(state_file: Path) -> dict[str, Any] | None:
    """`board down`: stop the processes a detached `board up` recorded, those still running."""
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    pids = _still_ours(state)
    for pid in reversed(pids):
        _terminate(pid)
    time.sleep(1.0)
    for pid in pids:
        if _group_alive(pid):
            _terminate(pid, signal.SIGKILL)
    state_file.unlink()
    return state


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
    from .trial_log import implausible

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
    import platform

    import tvm

    def info() -> str:
        threads = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
        return json_.dumps(
            {"name": platform.node(), "tvm": tvm.__version__, "threads": int(threads()) if threads else None}
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
    return {"board": ",".join(names) if identities else None, "tvm": ",".join(versions) or None}


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
