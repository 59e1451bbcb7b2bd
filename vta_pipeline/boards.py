"""Boards: a TVM RPC tracker and the rpc_server processes registered under a key.

`LocalBoard` starts the same processes our users run on their racks
(`python -m tvm.exec.rpc_tracker`, `python -m tvm.exec.rpc_server --tracker ... --key ...`)
on 127.0.0.1, so the pipeline measures through exactly the code path it uses at night.
The processes are recorded in a JSON state file so `vta-pipeline board status|down` can
find them from another shell.
"""

from __future__ import annotations

import json
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
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
        raise BoardError(f"{tracker_down_message(host, port)} (it accepted the connection, then dropped it: {e})") from e


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


@dataclass
class LocalBoard:
    """A tracker and N rpc_server processes on 127.0.0.1 (or another bind address)."""

    key: str = "host"
    num_servers: int = 2
    host: str = "127.0.0.1"
    port: int = 0
    state_file: Path | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"

    def _spawn(self, args: list[str]) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C in the terminal goes to us, we stop them in order
        )

    def start(self, timeout: float = 60.0) -> LocalBoard:
        if not self.port:
            self.port = free_port(self.host)
        self.procs.append(
            self._spawn(["tvm.exec.rpc_tracker", "--host", self.host, "--port", str(self.port), "--port-end", str(self.port + 1)])
        )
        deadline = time.time() + timeout
        while not port_open(self.host, self.port, 0.5):
            if self.procs[0].poll() is not None or time.time() > deadline:
                self.stop()
                raise BoardError(f"the local RPC tracker did not start on {self.tracker}")
            time.sleep(0.2)
        for _ in range(self.num_servers):
            self.add_server()
        while True:
            try:
                if count_servers(self.host, self.port, self.key) >= self.num_servers:
                    break
            except Exception:
                pass
            if time.time() > deadline:
                self.stop()
                raise BoardError(f"the local rpc servers did not register with the tracker at {self.tracker}")
            time.sleep(0.3)
        self._save()
        return self

    def add_server(self) -> subprocess.Popen:
        p = self._spawn(
            ["tvm.exec.rpc_server", "--tracker", self.tracker, "--key", self.key, "--host", self.host, "--port", "9090", "--port-end", "9999"]
        )
        self.procs.append(p)
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

    def _save(self) -> None:
        if self.state_file:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            self.state_file.write_text(
                json.dumps({"tracker": self.tracker, "key": self.key, "pids": [p.pid for p in self.procs]})
            )

    def __enter__(self) -> LocalBoard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


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


def stop_from_state(state_file: Path) -> dict[str, Any] | None:
    """`board down`: stop the processes a detached `board up` recorded."""
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    for pid in reversed(state["pids"]):
        _terminate(pid)
    time.sleep(1.0)
    for pid in state["pids"]:
        _terminate(pid, signal.SIGKILL)
    state_file.unlink()
    return state


def _on_a_board(host: str, port: int, key: str, timeout_s: float, work: Callable[[Any], Any], what: str,
                failed: str = ": ", hung: str = "") -> Any:
    """`work(remote)` on a board under `key`, with a deadline.

    RPC calls have no client-side timeout: a board that accepts the session and never answers
    would block the caller for good, so the work runs in a daemon thread that is given up on
    after `timeout_s`. Every failure is a BoardError naming the key and the tracker.
    """
    import threading

    from tvm import rpc

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            remote = rpc.connect_tracker(host, port).request(key, priority=1, session_timeout=int(timeout_s))
            outcome["value"] = work(remote)
        except Exception as e:  # reported below with the key and the tracker
            outcome["error"] = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    where = f"key {key!r} at the tracker {host}:{port}"
    if t.is_alive():
        raise BoardError(f"{what}: a board under {where} did not answer within {timeout_s:.0f} s{hung}")
    if "error" in outcome:
        raise BoardError(f"{what}: a board under {where}{failed}{outcome['error']}")
    return outcome["value"]


def health_check(host: str, port: int, key: str, target_spec: dict[str, Any], timeout_s: float = 120.0,
                 cross_compiler: str | None = None) -> float:
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

    ok, ms = _on_a_board(host, port, key, timeout_s, run, "health check", failed=" cannot run a trivial kernel: ",
                         hung=" (hung board?)")
    if not ok:
        raise BoardError(f"health check: a board under key {key!r} at the tracker {host}:{port} computed a wrong "
                         "result for y = x + 1")
    return float(ms)


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
