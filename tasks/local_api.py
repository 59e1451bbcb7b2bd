"""A command-line run's Prefect API, kept by a process that outlives the run to say how it ended.

Without PREFECT_API_URL, Prefect gives a flow a temporary API server: a child in the run's
own process group. A Ctrl-C in the run's terminal reaches that server at the same moment as
the run, so nothing is left to record that the run was cancelled; a SIGKILLed run (the OOM
killer) leaves the server behind. The run's own signal handler cannot do the recording
either: it must exit at once, because lingering lets the tuning threads record the
candidates in flight as failed builds.

So a command-line run starts a *keeper*, a small process in a session of its own:

1. it starts the API server (uvicorn serving Prefect's app, as Prefect's temporary server
   does, but watched by the keeper: `vta_pipeline.boards.watchdog`) and gives its URL to the run;
   with PREFECT_API_URL set it uses that server and starts none;
2. it waits for the run's process to end, however it ends;
3. the flow runs that process left open (started in the store's events, never ended) it
   closes: **Cancelled** when the run's signal handler said which signal stopped it (one
   line down a pipe, the only thing a handler that exits at once can safely do), else
   **Crashed** (SIGKILL, the OOM killer), with their unfinished task runs;
4. it stops the server it started.

A power cut takes the keeper too; then the next run on the store marks the run Crashed
(`crashed_runs.mark_dead_runs_crashed`), as before.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from vta_pipeline.boards.tracker import free_port
from vta_pipeline.errors import UserError

POLL_S = 0.5
"""How often the keeper looks at the run's process: a run's end is recorded within a second."""

_DONE = b"done\n"


class LocalApi:
    """The run's side: start the keeper, point Prefect's client at its API, tell it how the run ends."""

    def __init__(self, store: Path, log_path: Path, startup_timeout_s: float, api_url: str | None = None):
        self.store, self.log_path = Path(store), Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.external = api_url
        self.url: str | None = api_url
        self._notes: int | None = None
        self.keeper: subprocess.Popen | None = None

    def start(self) -> str:
        """Start the keeper (and, without an external API, its server); return the API URL."""
        read_end, self._notes = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "vta_pipeline.tasks.local_api",
            "--watch",
            str(os.getpid()),
            "--store",
            str(self.store),
            "--startup-timeout",
            str(self.startup_timeout_s),
        ]
        if self.external:
            cmd += ["--api", self.external]
        with open(self.log_path, "ab") as log:
            self.keeper = subprocess.Popen(
                cmd, stdin=read_end, stdout=subprocess.PIPE, stderr=log, start_new_session=True
            )  # a Ctrl-C to the run must not reach it
        os.close(read_end)
        atexit.register(self.close)
        line = self.keeper.stdout.readline().decode(errors="replace").strip()  # the keeper times out itself
        self.keeper.stdout.close()
        if not line.startswith("http"):
            raise UserError(
                f"Prefect's API server for this run did not start ({line or 'no answer'}); its "
                f"log is in {self.log_path}. Set PREFECT_API_URL to a running server "
                f"(`prefect server start`) to use that one instead."
            )
        self.url = line
        return line

    def note_signal(self, name: str) -> None:
        """Tell the keeper that signal `name` stops the run (safe inside a signal handler)."""
        if self._notes is not None:
            try:
                os.write(self._notes, f"signal {name}\n".encode())
            except OSError:
                pass

    def close(self) -> None:
        """The run ends normally: the keeper stops the server now (the flow recorded its own end)."""
        if self._notes is not None:
            try:
                os.write(self._notes, _DONE)
                os.close(self._notes)
            except OSError:
                pass
            self._notes = None
        if self.keeper is not None:
            try:
                self.keeper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def settings(self):
        """A context in which Prefect's client (flow, tasks, their threads) talks to this API."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings({PREFECT_API_URL: self.url})


# ---- the keeper ---------------------------------------------------------------------------------
def _healthy(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _start_server(parent: int, timeout_s: float, log: logging.Logger) -> tuple[subprocess.Popen, str]:
    """Prefect's API (no UI) on a free loopback port, in this process's session, dying with it."""
    env = dict(os.environ, PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
    env.pop("PREFECT_API_URL", None)
    deadline = time.monotonic() + timeout_s
    for attempt in range(3):  # a port taken between the check and the bind: another one
        port = free_port()
        url = f"http://127.0.0.1:{port}/api"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vta_pipeline.boards.watchdog",
                "--watch",
                str(os.getpid()),
                "--",
                "uvicorn",
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
        )
        while server.poll() is None and not _healthy(url):
            if time.monotonic() > deadline or os.getppid() != parent:
                _stop(server)
                raise TimeoutError(
                    f"no answer from {url}/health within {timeout_s:.0f} s "
                    "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
                )
            time.sleep(0.1)
        if server.poll() is None:
            log.info("Prefect API server for run process %d on %s (pid %d)", parent, url, server.pid)
            return server, url
    raise RuntimeError(f"the API server exited with code {server.returncode} three times; its output is above")


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _wait_for_end(parent: int, notes: int) -> str | None:
    """Block until the run's process ends; return the signal that stopped it, "done" for a
    normal end, None for a death without a word (SIGKILL)."""
    said = b""
    while os.getppid() == parent and _DONE not in said:
        ready, _, _ = select.select([notes], [], [], POLL_S)
        if ready:
            chunk = os.read(notes, 4096)
            said += chunk
            if not chunk:  # every writer is gone: the run's process has ended
                break
    if _DONE in said:
        return "done"
    signals = [
        line.split(" ", 1)[1] for line in said.decode(errors="replace").splitlines() if line.startswith("signal ")
    ]
    return signals[0] if signals else None


def _close_runs(store_path: str, parent: int, signal_name: str | None, log: logging.Logger) -> None:
    from vta_pipeline.store.artifacts import ArtifactStore
    from vta_pipeline.tasks import crashed_runs

    store = ArtifactStore(store_path)
    if signal_name is None:
        crashed_runs.mark_dead_runs_crashed(store, f"the keeper of process {parent}", log, pid=parent)
    else:
        crashed_runs.mark_dead_runs_cancelled(store, parent, signal_name, log)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vta_pipeline.tasks.local_api")
    parser.add_argument("--watch", type=int, required=True, help="the run's process")
    parser.add_argument("--store", required=True, help="the run's store (its events say which flow runs it opened)")
    parser.add_argument("--api", help="an API server already running (PREFECT_API_URL): start none")
    parser.add_argument("--startup-timeout", type=float, default=180.0)
    opts = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s keeper %(process)d %(levelname)s %(message)s"
    )
    log = logging.getLogger("vta_pipeline.tasks.local_api")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # uvicorn and Prefect print to stdout: into the log, never into the run's pipe
    server = None
    try:
        if opts.api:
            url = opts.api
        else:
            server, url = _start_server(opts.watch, opts.startup_timeout, log)
    except Exception as e:
        out.write(f"error: {e}\n")
        out.close()
        raise SystemExit(1)
    os.environ["PREFECT_API_URL"] = url  # before Prefect is imported here
    out.write(url + "\n")
    out.close()
    try:
        ended = _wait_for_end(opts.watch, 0)
        if ended != "done":
            log.info("run process %d ended %s", opts.watch, f"by {ended}" if ended else "without a word")
            try:
                _close_runs(opts.store, opts.watch, ended, log)
            except Exception:
                log.exception("could not record how the run ended; the next run on the store marks it Crashed")
    finally:
        if server is not None:
            _stop(server)


if __name__ == "__main__":
    main()
