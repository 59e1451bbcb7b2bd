"""A real Prefect server (`prefect server start`) on 127.0.0.1 for tests.

Unlike `prefect_test_harness` (an in-process ephemeral API without the UI), this is the
same server a user runs: its own process group, its own PREFECT_HOME, a SQLite database
and the UI's static files in a temporary directory, analytics off. Clients (a flow run in
a subprocess, a worker, a browser) talk to it over HTTP:

    with PrefectServer() as server:
        subprocess.run([...], env=server.env(), check=True)   # PREFECT_API_URL=server.api_url
        page.goto(server.ui_url + "/runs")

`env()` gives a client process the server's API URL and its own PREFECT_HOME; inside this
process, `server.settings()` points Prefect's client at the server (and `server.client()`
opens a sync client there). `stop()` (or leaving the `with`) kills the whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping

# Inherited settings that would point the server or its clients elsewhere (a user's profile,
# an API key, another server's URL or database). Every PREFECT_* variable of the parent is
# dropped; pass what a test needs through `env=` / `env(extra)`.
_PREFECT_PREFIX = "PREFECT_"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_PREFECT_PREFIX)}


class PrefectServerError(RuntimeError):
    """The server did not come up (or died); the message carries its log's tail."""


class PrefectServer:
    """`prefect server start` as a subprocess, with everything it writes in a temp dir.

    host, port: where it listens (port None = a free one).
    workdir: where PREFECT_HOME, the SQLite DB, the UI files and the log go (None = a new
        temp dir, deleted on stop unless keep=True).
    env: extra environment for the server process (e.g. {"PREFECT_SERVER_LOGGING_LEVEL": "DEBUG"}).
    services: False runs only the API and UI (`--no-services`); workers and deployments
        need the default (True), the UI alone does not.
    startup_timeout: seconds to wait for GET /api/health.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        workdir: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        services: bool = True,
        startup_timeout: float = 180.0,
        keep: bool = False,
    ):
        self.host = host
        self.port = port
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self.extra_env = dict(env or {})
        self.services = services
        self.startup_timeout = startup_timeout
        self.keep = keep
        self.workdir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._own_workdir = False

    # ---- addresses -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    @property
    def ui_url(self) -> str:
        """The UI's root. Prefect 3.8 serves two UIs: the V1 (Vue) UI at `/` and the V2
        (React) UI at `/v2`; `/` itself redirects a browser without a saved preference to
        `/v2/`. Deep links without the prefix (`/runs/flow-run/<id>`) open the V1 UI."""
        return self.url

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "server not started"
        return self.workdir / "server.log"

    @property
    def home(self) -> Path:
        assert self.workdir is not None, "server not started"
        return self.workdir / "home"

    # ---- environments ----------------------------------------------------------------------
    def server_env(self) -> dict[str, str]:
        assert self.workdir is not None
        env = _clean_environ()
        env.update(
            {
                "PREFECT_HOME": str(self.home),
                "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.workdir / 'prefect.db'}",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_API_URL": self.api_url,
                "PREFECT_UI_STATIC_DIRECTORY": str(self.workdir / "ui"),  # not into the venv's site-packages
                "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
                "PREFECT_SERVER_API_HOST": self.host,
                "PREFECT_SERVER_API_PORT": str(self.port),
                "PREFECT_API_URL": self.api_url,  # for anything the server process itself calls
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        return env

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a client subprocess (flow run, worker, `prefect` CLI): the
        parent's environment without its PREFECT_* variables, plus the server's API URL and
        a client PREFECT_HOME of its own (results, profiles) under the server's workdir."""
        assert self.workdir is not None, "server not started"
        env = _clean_environ()
        client_home = self.workdir / "client-home"
        client_home.mkdir(parents=True, exist_ok=True)
        env.update(
            {
                "PREFECT_API_URL": self.api_url,
                "PREFECT_UI_URL": self.ui_url,
                "PREFECT_HOME": str(client_home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false",  # fail loudly instead of a private server
            }
        )
        env.update(extra or {})
        return env

    def settings(self):
        """Context manager pointing this process's Prefect client at the server."""
        from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

        return temporary_settings({PREFECT_API_URL: self.api_url, PREFECT_UI_URL: self.ui_url})

    @contextlib.contextmanager
    def client(self) -> Iterator:
        """A sync Prefect client on the server's API."""
        from prefect.client.orchestration import get_client

        with self.settings(), get_client(sync_client=True) as client:
            yield client

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "PrefectServer":
        if self.proc is not None:
            raise RuntimeError("PrefectServer already started")
        if self._workdir_arg is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="prefect-server-"))
            self._own_workdir = True
        else:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port(self.host)
        cmd = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--analytics-off",
            "--no-background",
        ]
        if not self.services:
            cmd.append("--no-services")
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            env=self.server_env(),
            cwd=str(self.workdir),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=timeout) as r:
                return r.status == 200 and json.loads(r.read() or b"null") is True
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _wait_healthy(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise PrefectServerError(
                    f"prefect server exited with code {self.proc.returncode} before answering "
                    f"{self.api_url}/health; log tail:\n{self.log_tail()}"
                )
            if self.healthy():
                self.startup_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise PrefectServerError(
                    f"prefect server did not answer {self.api_url}/health within {self.startup_timeout:.0f} s "
                    f"(log {self.log_path}); log tail:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, n_chars: int = 6000) -> str:
        try:
            data = self.log_path.read_bytes()
        except (OSError, AssertionError):
            return "(no log)"
        return data[-n_chars:].decode(errors="replace")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `timeout` s; remove the
        temp workdir unless keep=True (or a workdir was given)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            pgid = proc.pid  # start_new_session: the server leads its own process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
            with contextlib.suppress(ProcessLookupError):  # stragglers (uvicorn workers, services)
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._own_workdir and not self.keep and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def save_log(self, dest: str | os.PathLike) -> None:
        """Copy the server's log somewhere that outlives the temp dir (test outputs)."""
        with contextlib.suppress(OSError, AssertionError):
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.log_path, dest)

    def __enter__(self) -> "PrefectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.proc is not None and self.proc.poll() is None else "stopped"
        return f"PrefectServer({self.url}, {state}, workdir={self.workdir})"
