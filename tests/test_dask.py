"""Tuning tasks on a real Dask cluster: a scheduler and two worker processes on 127.0.0.1.

The cluster is started the way a user starts one (`dask scheduler`, `dask worker ADDRESS`,
here as `python -m distributed.cli.*` of this venv, each in its own process group, from
the repo root) and the real flow runs against it through `tasks.dask_runner.with_task_runner`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vta_pipeline.boards import free_port
from vta_pipeline.config import build_config
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.tasks.dask_runner import (
    DaskSetupError,
    check_cluster,
    check_scheduler,
    normalize_address,
    probe_worker,
    require_workers,
    with_task_runner,
)

REPO = Path(__file__).resolve().parent.parent


def _cfg(store, tracker, key, trials=2):
    # replay-trace + random cost model: no evolution rounds, no XGBoost. What is under test is
    # where the tuning runs, not how well it searches, and the workers start cold.
    return build_config(
        None,
        {
            "model.source": "builtin",
            "model.name": "micronet",
            "board.tracker": tracker,
            "board.key": key,
            "tune.trials_per_task": trials,
            "tune.trials_per_batch": trials,
            "tune.task_filter": "conv2d",
            "tune.search": "replay-trace",
            "tune.cost_model": "random",
            "measure.number": 2,
            "evaluate.repeat": 3,
            "store": str(store),
            "opt": "O0",
        },
    ).model_dump(mode="json")


# ---- the address and the cluster checks, without a cluster -------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "",
        "localhost",
        "tcp://",
        "tcp://host",
        "tcp://host:0",
        "tcp://host:99999",
        "tcp://host:port",
        "http://host:8786",
        "tcp://host:8786/x",
    ],
)
def test_bad_scheduler_address_names_it_and_the_form(bad):
    with pytest.raises(DaskSetupError) as e:
        with_task_runner(object(), bad)
    assert repr(bad) in str(e.value) and ("tcp://HOST:PORT" in str(e.value))


def test_address_forms():
    assert normalize_address("127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    assert normalize_address(" tcp://sched.lab:9000 ") == "tcp://sched.lab:9000"


def test_no_address_leaves_the_flow_alone():
    flow = object()
    assert with_task_runner(flow, None) is flow


def test_scheduler_down_fails_in_seconds_naming_it_and_the_fix():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(DaskSetupError) as e:
        with_task_runner(object(), f"tcp://127.0.0.1:{port}")
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert f"tcp://127.0.0.1:{port}" in msg and "dask scheduler" in msg
    assert f"dask worker tcp://127.0.0.1:{port}" in msg


def test_a_port_that_is_not_a_scheduler_fails_in_seconds():
    """Something that accepts connections and never answers: distributed.Client would wait forever."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        address = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(DaskSetupError) as e:
            require_workers(address, timeout_s=2)
        assert time.monotonic() - t0 < 15
        assert address in str(e.value) and "no Dask scheduler answered" in str(e.value)


def test_dask_needs_a_prefect_server_the_workers_can_reach():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as srv, temporary_settings(restore_defaults={PREFECT_API_URL}):
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        with pytest.raises(DaskSetupError) as e:
            with_task_runner(object(), f"tcp://127.0.0.1:{srv.getsockname()[1]}")
    assert "PREFECT_API_URL" in str(e.value) and "prefect server start" in str(e.value)


def test_probe_reports_a_store_it_cannot_see(tmp_path):
    (tmp_path / ".probe").write_text("token")
    ok = probe_worker(str(tmp_path), ".probe", "token", None, None)
    assert ok["problems"] == [] and ok["pid"] == os.getpid()
    elsewhere = probe_worker(str(tmp_path / "not-mounted"), ".probe", "token", None, None)
    assert len(elsewhere["problems"]) == 1 and "does not see the artifact store" in elsewhere["problems"][0]
    other_tvm = probe_worker(str(tmp_path), ".probe", "token", None, None, {"apache-tvm": "0.0.1"})
    assert len(other_tvm["problems"]) == 1 and "has apache-tvm 0.27" in other_tvm["problems"][0]


# ---- a real cluster ------------------------------------------------------------------------------
def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(procs: list[subprocess.Popen]) -> None:
    """Each process group: SIGTERM, then SIGKILL (a nanny's worker is in its group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + 10
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        if all(p.poll() is not None for p in procs):
            break


def _tails(logs: list[Path]) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists())


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _logs_of(task_run_ids):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    with get_client(sync_client=True) as client:
        return client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=list(task_run_ids))))


@pytest.mark.slow
def test_tuning_tasks_run_on_two_dask_workers(prefect_harness, board, tmp_path):
    import distributed
    from prefect.settings import PREFECT_API_URL

    from vta_pipeline.flows.tune_network import tune_network

    api_url = PREFECT_API_URL.value()
    assert api_url, "the Prefect harness gives this process an API URL"
    # What a worker machine gets: this project's environment and code, the API URL of the
    # flow's Prefect server. Its own PREFECT_HOME and Dask scratch space, so nothing lands in
    # the user's ~/.prefect or in /tmp.
    env = dict(
        os.environ,
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(tmp_path / "worker-prefect-home"),
        DASK_TEMPORARY_DIRECTORY=str(tmp_path / "dask-tmp"),
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1",
    )
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = [tmp_path / "scheduler.log", tmp_path / "tuner-1.log", tmp_path / "tuner-2.log"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            _spawn(
                ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                logs[0],
                env,
            )
        )
        deadline = time.monotonic() + 120
        while True:  # the scheduler imports distributed first: up to a minute on this machine
            assert procs[0].poll() is None, _tails(logs)
            try:
                check_scheduler(address, timeout_s=1)
                break
            except DaskSetupError:
                assert time.monotonic() < deadline, _tails(logs)
                time.sleep(0.5)

        # A scheduler without workers would take the tasks and never run them: refused.
        with pytest.raises(DaskSetupError, match=r"0 worker\(s\).*dask worker " + address):
            require_workers(address, wait_s=1)

        # Two workers, each as `dask worker ADDRESS` starts one (with its nanny), one thread.
        for i in (1, 2):
            procs.append(
                _spawn(
                    [
                        "distributed.cli.dask_worker",
                        address,
                        "--nworkers",
                        "1",
                        "--nthreads",
                        "1",
                        "--name",
                        f"tuner-{i}",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                    ],
                    logs[i],
                    env,
                )
            )
        require_workers(address, min_workers=2, wait_s=180)

        store = ArtifactStore(tmp_path / "shared-store")
        cfg = _cfg(store.root, board.tracker, board.key)
        # The set-up probe runs on the workers: a tracker they cannot reach is named per worker.
        dead = f"127.0.0.1:{free_port()}"
        with pytest.raises(DaskSetupError) as e:
            check_cluster(address, _cfg(store.root, dead, board.key))
        assert str(e.value).count(f"cannot reach the RPC tracker {dead}") == 2, str(e.value)
        workers = check_cluster(address, cfg)
        assert len(workers) == 2 and not list(store.root.glob(".dask-probe-*"))
        worker_pids = {w["pid"] for w in workers.values()}
        assert os.getpid() not in worker_pids and len(worker_pids) == 2

        flow = with_task_runner(tune_network, address, cfg)
        assert type(flow.task_runner).__name__ == "DaskTaskRunner" and flow.task_runner.address == address
        state = flow(cfg, return_state=True)
        assert state.is_completed(), f"{state}\n{_tails(logs)}"
        result = state.result()

        # A correct tuned build of micronet, its two conv2d tasks tuned to budget.
        assert result["tuned"]["correct"] and result["untuned"]["correct"]
        assert [t["trials"] for t in result["tasks"]] == [2, 2]
        assert all(t["best_gflops"] and t["errors"] == 0 for t in result["tasks"])

        # Where the tuning ran. The store's event log records the pid of the process that
        # computed each step: the two tuning steps were computed by the two worker processes,
        # one each; everything else by this process (the flow's).
        tune_pids = [e["pid"] for e in store.events() if e["event"] == "computed" and e["step"] == "tune"]
        assert sorted(tune_pids) == sorted(worker_pids), (tune_pids, worker_pids)
        others = {e["pid"] for e in store.events() if e["event"] == "computed" and e["step"] != "tune"}
        assert others == {os.getpid()}
        # Dask's side: each worker executed exactly one task (the probes run via Client.run,
        # not as tasks), and they are the processes that wrote the events.
        with distributed.Client(address, timeout=30, set_as_default=False) as client:
            executed = client.run(lambda dask_worker: (os.getpid(), dask_worker.state.executed_count))
        assert sorted(executed.values()) == sorted((pid, 1) for pid in worker_pids), executed

        # Prefect's side: the workers created and finished the tuning task runs of this flow
        # run at the test's API, and shipped their logs there.
        runs = [r for r in _task_runs(state.state_details.flow_run_id) if r.name.startswith("tune-")]
        assert sorted(r.name for r in runs) == sorted(f"tune-{t['task']}" for t in result["tasks"])
        assert {r.state_name for r in runs} == {"Completed"}
        deadline = time.monotonic() + 30
        while {lg.task_run_id for lg in _logs_of(r.id for r in runs)} != {r.id for r in runs}:
            assert time.monotonic() < deadline, "the workers' task run logs never reached the API"
            time.sleep(1)

        # The artifacts the workers wrote are in the shared store, where the flow read them.
        tuned = store.find("tune")
        assert len(tuned) == 2
        for art in tuned:
            summary = json.loads((art.path / "summary.json").read_text())
            assert summary["trials"] == 2 and (art.path / "database_tuning_record.json").exists()
        assert {a.manifest["host"] for a in tuned} == {socket.gethostname()}
        results = store.root / "prefect-results"
        assert len([p for p in results.iterdir() if p.name.startswith("tune-")]) == 2  # Prefect's, from the workers
        assert (store.root / "runs" / f"{result['run_id']}.json").exists()
        for p in procs:
            assert p.poll() is None, _tails(logs)  # nothing crashed along the way
    finally:
        _stop(procs)
