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
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import BoardError
from .emulator import Emulator
from .liveness import alive, identity
from .tracker import SERVER_PORT_RANGE, count_servers, free_port, port_open, tracker_summary

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
    `vta_pipeline.boards.watchdog` and kills its own process group when the process that
    started the board dies, however it dies; the board is also recorded in `registry`, so
    the next board started on this machine reaps it if the watchdogs could not (see
    `reap_orphans`). Detached (`board up`): the board outlives the command that started
    it, recorded in `state_file` until `board down`.

    Each process's output goes to a log of its own in `log_dir`: when a process does not
    come up, the error shows the tail of its log.

    One server by default: two servers on one host time candidates at the same time on the
    same cores, and each slows the other (candidates measured several times slower than
    re-timed alone: docs/performance.md), which misleads the search's cost model. Each server's kernels run
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
    server_module: str = "vta_pipeline.boards.server"
    server_args: tuple[str, ...] = ()  # more arguments of the server program (the VTA board's --sim-mode)
    # an emulated board (boards.emulator): its servers run another CPU's TVM runtime under qemu
    emulator: Emulator | None = None
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
        if self.emulator is not None and role != "tracker":  # the tracker is the rack's: this machine's
            cmd, env = [str(self.emulator.python), "-m"], self.emulator.env(env)
        if not self.detached:
            cmd += ["vta_pipeline.boards.watchdog", "--watch", str(os.getpid()), "--"]
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

        An emulated board checks first that its emulator is set up (a ConfigError naming the
        set-up command otherwise).

        Says what it waits for every PROGRESS_EVERY_S; a process that exits, or one not up
        within `timeout`, stops the board and raises a BoardError naming that process, with
        the tail of its log.
        """
        if self.emulator is not None:
            self.emulator.check()
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
                *self.server_args,
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
        from ..store.artifacts import atomic_write_text

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


# the watchdog by its module path of today and of the versions before the boards package (their boards are reaped too)
BOARD_PROGRAMS = (
    "rpc_tracker",
    "rpc_server",
    "vta_pipeline.boards.server",
    "board_server",  # boards started before the server moved into boards/
    "vta_pipeline.boards.watchdog",
    "vta_pipeline.watchdog",
)


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
