"""Processes that die with the process that started them, however it dies.

Two modes, both watching the parent (the pid given to --watch):

- `python -m vta_pipeline.watchdog --watch PID -- tvm.exec.rpc_server --tracker ...` runs
  the TVM module in this very process (no extra interpreter) beside a thread that watches
  the parent. When the parent is gone the thread kills this process's whole group: the
  server and the `popen_worker` and `multiprocessing` children it forked, which share its
  group because `LocalBoard` starts each process in a session of its own.
- `python -m vta_pipeline.watchdog --watch PID --reap PID:START ...` runs nothing itself: a
  small process that, once the parent is gone, stops the listed processes (a helper the
  parent started but cannot make watch for itself, e.g. Prefect's temporary API server),
  if they are still the ones recorded (same pid, same start time).

Why polling the parent and not only Linux's PR_SET_PDEATHSIG: that signal fires when the
*thread* that forked the child exits, and Prefect starts the board from whichever thread
runs the flow; it also does not reach grandchildren. Polling `getppid()` is portable and
immune to pid reuse: once the parent dies, this process is re-parented (to init or a
subreaper) and `getppid()` stops returning the watched pid.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import subprocess
import sys
import threading
import time

POLL_S = 0.5
"""How often the parent is checked: a killed run's processes are gone within a second."""


def _wait_for_parent_death(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)


def _watch_group(parent: int) -> None:
    _wait_for_parent_death(parent)
    print(f"vta_pipeline.watchdog: parent {parent} is gone; stopping process group {os.getpgrp()}",
          file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _reap(parent: int, targets: list[tuple[int, float]]) -> None:
    import psutil

    _wait_for_parent_death(parent)
    procs = []
    for pid, start in targets:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - start) < 0.01:
                procs.append(p)
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def spawn_reaper(pids: list[int]) -> subprocess.Popen:
    """Start a reaper that stops `pids` when this process dies (the reaper exits with it)."""
    import psutil

    targets = [f"{pid}:{psutil.Process(pid).create_time()!r}" for pid in pids]
    return subprocess.Popen([sys.executable, "-m", "vta_pipeline.watchdog", "--watch", str(os.getpid()),
                             "--reap", *targets], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)  # a Ctrl-C to our group must not stop it first


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="vta_pipeline.watchdog")
    parser.add_argument("--watch", type=int, required=True, help="pid whose death stops what this watches")
    parser.add_argument("--reap", nargs="+", default=[], metavar="PID:START",
                        help="processes to stop when the watched pid dies (pid and start time)")
    opts = parser.parse_args(argv[:cut])
    if opts.reap:
        _reap(opts.watch, [(int(p), float(s)) for p, s in (t.split(":", 1) for t in opts.reap)])
        return
    if cut == len(argv) or cut + 1 == len(argv):
        parser.error("give --reap PID:START ... or -- MODULE [ARGS...]")
    module, *args = argv[cut + 1:]
    if os.getppid() != opts.watch:  # the parent died before we got here
        os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=_watch_group, args=(opts.watch,), name="watchdog", daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
