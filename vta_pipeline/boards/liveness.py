"""Is that process still the one we started? Pids with their start times, and dead runs.

A pid alone is not an identity: after a crash and a reboot, or on a busy host, the same
number names another process. Every record that must later tell "still running" from
"died without saying so" (a local board's processes, a flow run in the store's events)
keeps the pid with the process's start time and the host it ran on.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Iterable

import psutil


def identity(pid: int | None = None) -> dict[str, Any]:
    """{pid, start, host} of a process (this one by default); start is None if it is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        start = psutil.Process(pid).create_time()
    except psutil.Error:
        start = None
    return {"pid": pid, "start": start, "host": socket.gethostname()}


def alive(ident: dict[str, Any]) -> bool:
    """Whether the process `ident` names is still running (a zombie counts as dead).

    Only answerable on the host it ran on: a process of another host counts as alive, so
    that nothing acts on a run it cannot see (a store on shared storage, a Dask worker).
    """
    if ident.get("host", socket.gethostname()) != socket.gethostname():
        return True
    try:
        p = psutil.Process(int(ident["pid"]))
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return ident.get("start") is None or abs(p.create_time() - float(ident["start"])) < 0.01
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def dead_runs(
    events: Iterable[dict[str, Any]],
    started: str = "run_started",
    ended: str = "run_ended",
    handled: str = "run_marked_crashed",
) -> list[dict[str, Any]]:
    """The `started` events of runs that never logged `ended` (nor were `handled` already)
    and whose process is dead: runs killed without a chance to report (SIGKILL, OOM, power)."""
    opened: dict[str, dict[str, Any]] = {}
    closed: set[str] = set()
    for e in events:
        run = e.get("flow_run_id")
        if not run:
            continue
        if e.get("event") == started:
            opened[run] = e
        elif e.get("event") in (ended, handled):
            closed.add(run)
    return [e for run, e in opened.items() if run not in closed and not alive(e.get("process", {}))]
