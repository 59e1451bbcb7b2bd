"""Processes that die with the process that started them, however it dies.

`python -m vta_pipeline.boards.watchdog --watch PID -- tvm.exec.rpc_server --tracker ...` runs the
module (a TVM RPC server, uvicorn serving Prefect's API) in this very process (no extra
interpreter) beside a thread that watches the parent (the pid given to --watch). When the
parent is gone the thread kills this process's whole group: the server and the
`popen_worker` and `multiprocessing` children it forked, which share its group because
`LocalBoard` starts each process in a session of its own.

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
    print(
        f"vta_pipeline.boards.watchdog: parent {parent} is gone; stopping process group {os.getpgrp()}",
        file=sys.stderr,
        flush=True,
    )
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="vta_pipeline.boards.watchdog")
    parser.add_argument("--watch", type=int, required=True, help="pid whose death stops what this watches")
    opts = parser.parse_args(argv[:cut])
    if cut == len(argv) or cut + 1 == len(argv):
        parser.error("give -- MODULE [ARGS...]")
    module, *args = argv[cut + 1 :]
    if os.getppid() != opts.watch:  # the parent died before we got here
        os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=_watch_group, args=(opts.watch,), name="watchdog", daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
