"""The tracker, from a client's side: where a task measures (`BoardSpec`), whether a tracker
is up, how many boards a key has free, and what to say when it is down."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from ..errors import BoardError


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
    emulated: str | None = None  # "qemu-aarch64 7.2...": an emulated board (boards.emulator), whose timings are qemu's


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
