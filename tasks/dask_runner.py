"""Run the tuning tasks of a flow on an existing Dask cluster (prefect-dask).

What runs where, with `with_task_runner(tune_network, "tcp://HOST:8786", config)`:

- The flow process (where you type `vta-pipeline run`) runs the flow body and every step it
  calls directly: fetch, quantize, pack, extract, pick best, build, upload + evaluate, the
  local board when there is no `--tracker`, the tracker pre-flight and health check.
- The Dask workers run the steps the flow *submits*: one `tune_task` run per tuning task.
  That is where the CPU goes (MetaSchedule's search, its cost model and the candidate
  builds), so that is what fans out across machines. At most min(boards, tasks) tuning
  runs are in flight (the flow's window): workers beyond that stay idle.
- The boards are not Dask's business. A tuning run measures its candidates through the RPC
  tracker (MetaSchedule's RPCRunner on the tracker key), exactly as without Dask:
  measurement capacity already scales by adding boards to the tracker, from any machine.

What the workers need, and what `check_cluster` verifies before any expensive work:

- The same code: this project installed at the same version in the workers' environment
  (or the workers started from a checkout: `cd REPO && dask worker tcp://HOST:8786`), so
  that `tasks.tune` imports there. Task functions travel by reference, not by value.
- The same artifact store, at the same absolute path. Tasks receive the store as a path
  (`str(ArtifactStore(config.store).root)`, resolved on the flow machine) and open it
  there: a tuning run writes its records, its database and Prefect's result file into it,
  and the flow reads them back. Mount the store's directory (NFS, a shared volume) at that
  path on every worker. A store the workers cannot see is found by a probe file the flow
  process writes and every worker must read back.
- The tracker: with `--tracker HOST:PORT` every worker must reach it; without one, the
  local board binds 127.0.0.1 on the flow machine, so all workers must run there too.
- The Prefect API: a task run is created, and its state and logs reported, by the worker
  that runs it, at the API URL of the flow process (prefect-dask ships the flow's settings
  context with each task; setting `PREFECT_API_URL` in the workers' environment as well does
  no harm). An ephemeral API (no `PREFECT_API_URL`, the default of a plain local run) lives
  on the flow machine's loopback and dies with the flow: start a server
  (`prefect server start --host 0.0.0.0`) and export `PREFECT_API_URL=http://HOST:4200/api`.

`DaskTaskRunner(address=...)` never starts a cluster: start one with `dask scheduler` on
one machine and `dask worker tcp://SCHEDULER:8786 --nthreads 1` on each worker machine
(one thread per worker process: a tuning run already uses the machine's cores).

Progress bars: the CLI draws them from in-process events; tuning runs on workers publish
those in the workers' processes. Follow them in the Prefect UI (each tuning run's progress
artifact and logs) instead.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from vta_pipeline.errors import ConfigError

F = TypeVar("F")

DEFAULT_PORT = 8786
CONNECT_TIMEOUT_S = 10.0  # a scheduler that does not answer a TCP connect within this is "down"
WORKERS_WAIT_S = 30.0  # workers started together with the scheduler take a few seconds to register


class DaskSetupError(ConfigError):
    """The Dask cluster (or what its workers need) is missing or misconfigured."""


def _start_hint(host: str, port: int) -> str:
    return (
        f"start a scheduler with `dask scheduler --port {port}` on {host} and at least one worker "
        f"with `dask worker tcp://{host}:{port} --nthreads 1` (from this project's environment)"
    )


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of a scheduler address `tcp://HOST:PORT` (a bare `HOST:PORT` is accepted).

    Raises DaskSetupError naming the address and the expected form.
    """
    raw = (address or "").strip()
    bad = DaskSetupError(
        f"Dask scheduler address {address!r} is not tcp://HOST:PORT (e.g. tcp://10.0.0.5:{DEFAULT_PORT}, "
        f"the address `dask scheduler` prints)"
    )
    if not raw:
        raise bad
    if "://" not in raw:
        raw = "tcp://" + raw
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        raise bad from None
    if parts.scheme != "tcp":
        raise DaskSetupError(
            f"Dask scheduler address {address!r}: only tcp:// is supported (got {parts.scheme}://); use tcp://HOST:PORT"
        )
    if (
        not parts.hostname
        or port is None
        or not 0 < port < 65536
        or parts.path not in ("", "/")
        or parts.query
        or parts.username
    ):
        raise bad
    return parts.hostname, port


def normalize_address(address: str) -> str:
    """The address as Dask wants it: tcp://HOST:PORT."""
    host, port = parse_address(address)
    return f"tcp://{'[' + host + ']' if ':' in host else host}:{port}"


def check_scheduler(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """Fail in seconds, naming the address and how to start one, when no scheduler listens.

    A plain TCP connect: a `distributed.Client` to a dead address retries for its whole
    timeout and then fails with a bare OSError. Returns the normalized address.
    """
    host, port = parse_address(address)
    norm = normalize_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        raise DaskSetupError(
            f"no Dask scheduler answers at {norm} within {timeout_s:g} s ({e.strerror or e}); "
            + _start_hint(host, port)
        ) from None
    return norm


def scheduler_identity(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """The scheduler's answer to `identity` (its workers included), within `timeout_s`.

    Asked over one raw comm with a hard deadline: `distributed.Client` waits forever for a
    peer that accepts the connection and never answers (something else on the port, a
    wedged scheduler). Raises DaskSetupError naming the address.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=timeout_s)
        try:
            await comm.write({"op": "identity", "n_workers": -1, "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    host, port = parse_address(address)
    try:  # a thread of its own: the caller may be running an event loop
        with ThreadPoolExecutor(1) as pool:
            reply = pool.submit(asyncio.run, asyncio.wait_for(ask(), timeout_s)).result()
    except (OSError, TimeoutError, asyncio.TimeoutError) as e:
        raise DaskSetupError(
            f"{address} accepts connections but no Dask scheduler answered within {timeout_s:g} s "
            f"({type(e).__name__}: {e}); is it a Dask scheduler's port? Otherwise " + _start_hint(host, port)
        ) from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        what = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
        raise DaskSetupError(f"{address} is not a Dask scheduler (it answered as {what!r}): " + _start_hint(host, port))
    return reply


def require_workers(
    address: str, min_workers: int = 1, wait_s: float = WORKERS_WAIT_S, timeout_s: float = CONNECT_TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    """The scheduler's workers ({address: identity}), once at least `min_workers` registered.

    A scheduler without workers accepts tasks and never runs them: the flow would hang at
    its first tuning task. Waits up to `wait_s` for workers to register, then raises
    DaskSetupError naming the scheduler and the command that starts a worker.
    """
    address = check_scheduler(address, timeout_s)
    deadline = time.monotonic() + wait_s
    while True:
        workers = scheduler_identity(address, timeout_s).get("workers", {})
        if len(workers) >= min_workers:
            return workers
        if time.monotonic() >= deadline:
            raise DaskSetupError(
                f"the Dask scheduler at {address} has {len(workers)} worker(s) after {wait_s:g} s, "
                f"{min_workers} needed; start one on each tuning machine with "
                f"`dask worker {address} --nthreads 1` (from this project's environment)"
            )
        time.sleep(0.5)


# ---- what every worker must see ------------------------------------------------------------------
VERSIONED = ("vta-pipeline", "apache-tvm", "prefect", "prefect-dask")


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def probe_worker(
    store_root: str | None,
    probe_name: str | None,
    token: str | None,
    tracker: tuple[str, int] | None,
    api_url: str | None,
    versions: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Runs on each worker (via Client.run): can it run our tasks against this store?"""
    import importlib
    import urllib.request

    out: dict[str, Any] = {"hostname": socket.gethostname(), "pid": os.getpid(), "problems": []}
    theirs = _versions()
    for dist, v in sorted((versions or {}).items()):
        if theirs.get(dist) != v:
            out["problems"].append(
                f"has {dist} {theirs.get(dist) or '(not installed)'}, the flow machine {v}: "
                "install the same versions on every worker"
            )
    try:
        importlib.import_module("vta_pipeline.tasks.tune")
    except Exception as e:  # noqa: BLE001 - reported, with the worker named
        out["problems"].append(
            f"cannot import the pipeline's tasks ({type(e).__name__}: {e}); install this "
            "project in the worker's environment or start the worker from its checkout"
        )
    if store_root is not None:
        p = Path(store_root) / probe_name
        try:
            seen = p.read_text()
        except OSError as e:
            seen = f"<{e.strerror or e}>"
        if seen != token:
            out["problems"].append(
                f"does not see the artifact store at {store_root} (probe file {p.name}: "
                f"{seen[:60]}); mount the store's directory at the same path on every worker"
            )
    if tracker is not None:
        try:
            with socket.create_connection(tracker, timeout=5):
                pass
        except OSError as e:
            out["problems"].append(f"cannot reach the RPC tracker {tracker[0]}:{tracker[1]} ({e.strerror or e})")
    if api_url:
        try:
            with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=10) as r:
                r.read()
        except Exception as e:  # noqa: BLE001
            out["problems"].append(f"cannot reach the Prefect API at {api_url} ({e})")
    return out


def _run_on_workers(address: str, timeout_s: float, fn, *args) -> dict[str, Any]:
    """Client.run(fn, *args) on every worker: {worker: result or the exception it raised}."""
    import distributed

    try:
        with distributed.Client(address, timeout=timeout_s, set_as_default=False) as client:
            return client.run(fn, *args, on_error="return")
    except Exception as e:  # noqa: BLE001 - named, with the scheduler
        raise DaskSetupError(
            f"the workers of the Dask scheduler at {address} could not run the set-up probe ({type(e).__name__}: {e})"
        ) from None


def _prefect_api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def check_cluster(
    address: str,
    config: dict[str, Any] | Any | None = None,
    *,
    min_workers: int = 1,
    wait_s: float = WORKERS_WAIT_S,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> dict[str, dict[str, Any]]:
    """Everything the workers need, checked from the flow machine in seconds.

    The scheduler answers, at least `min_workers` workers are registered, this process has a
    Prefect API URL, and every worker runs the same versions of this project, TVM and
    Prefect, imports our tasks, reaches the Prefect API and, when the run's `config`
    (PipelineConfig or its JSON) is given, reads back a probe file written into its store
    (the shared-storage requirement) and reaches its tracker (without one, every worker must
    be on this machine, where the local board listens on 127.0.0.1). Returns {worker
    address: the scheduler's identity of it + "hostname", "pid"}; raises DaskSetupError
    listing every worker's problems.
    """
    from vta_pipeline.config import PipelineConfig, parse_hostport

    address = check_scheduler(address, timeout_s)
    api_url = _prefect_api_url()
    if not api_url:
        raise DaskSetupError(
            "tasks on Dask workers report to the Prefect API of the flow, and this process has none "
            "(PREFECT_API_URL unset: an ephemeral API on this machine's loopback). Start a server with "
            "`prefect server start --host 0.0.0.0` and export PREFECT_API_URL=http://HOST:4200/api"
        )
    cfg = None
    if config is not None:
        cfg = config if isinstance(config, PipelineConfig) else PipelineConfig.model_validate(config)
    store_root = probe = token = None
    if cfg is not None:
        store_root = Path(cfg.store).expanduser().resolve()  # as ArtifactStore resolves it
        store_root.mkdir(parents=True, exist_ok=True)
        probe, token = f".dask-probe-{uuid.uuid4().hex}", uuid.uuid4().hex
        (store_root / probe).write_text(token)
    tracker = parse_hostport(cfg.board.tracker) if cfg is not None and cfg.board.tracker else None
    try:
        workers = require_workers(address, min_workers, wait_s, timeout_s)
        report = _run_on_workers(
            address,
            timeout_s,
            probe_worker,
            str(store_root) if store_root else None,
            probe,
            token,
            tracker,
            api_url,
            _versions(),
        )
    finally:
        if probe:
            (store_root / probe).unlink(missing_ok=True)
    problems, here = [], socket.gethostname()
    for w, r in sorted(report.items()):
        if isinstance(r, BaseException):
            problems.append(
                f"{w}: cannot load this project's code ({type(r).__name__}: {r}); install this project "
                "in the worker's environment or start the worker from its checkout"
            )
            continue
        if cfg is not None and tracker is None and r["hostname"] != here:
            r["problems"].append(
                f"runs on {r['hostname']}, but without --tracker the local board listens on "
                f"127.0.0.1 of {here}; pass --tracker HOST:PORT reachable from every worker"
            )
        problems += [f"{w} ({r['hostname']}): {p}" for p in r["problems"]]
    if problems:
        raise DaskSetupError(f"the Dask cluster at {address} cannot run the tuning tasks:\n  " + "\n  ".join(problems))
    return {w: {**workers.get(w, {}), "hostname": r["hostname"], "pid": r["pid"]} for w, r in report.items()}


def with_task_runner(
    flow: F,
    dask_address: str | None,
    config: dict[str, Any] | Any | None = None,
    *,
    check: bool = True,
    min_workers: int = 1,
    wait_s: float = WORKERS_WAIT_S,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> F:
    """`flow` unchanged without an address, else the flow with a DaskTaskRunner on that cluster.

    The runner connects to an existing scheduler (it starts nothing). With `check` (the
    default) `check_cluster` runs first, so a wrong address, a cluster without workers, a
    store the workers cannot see or an unreachable tracker or Prefect API fails in seconds
    with the fix, before any import or tuning. Pass the run's `config` (PipelineConfig JSON,
    as the flow takes it) to include the store and tracker checks.
    """
    if dask_address is None:
        return flow
    address = normalize_address(dask_address)
    if check:
        check_cluster(address, config, min_workers=min_workers, wait_s=wait_s, timeout_s=timeout_s)
    from prefect_dask import DaskTaskRunner  # imports distributed: seconds, after the quick checks

    return flow.with_options(task_runner=DaskTaskRunner(address=address))
