"""The nightly deployment as the README sets it up: a real Prefect server, a process work
pool, `prefect deploy` of deployments/prefect.yaml, a run triggered by hand, a real worker."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_server import PrefectServer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
OUTPUTS = REPO / "test-outputs" / "deployment"


def _prefect(server, *args, timeout=300):
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", *args], cwd=REPO, env=server.env(),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_nightly_deployment_runs_through_a_real_worker(board, tmp_path):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId, LogFilter, LogFilterFlowRunId

    OUTPUTS.mkdir(parents=True, exist_ok=True)
    store = tmp_path / "store"
    with PrefectServer() as server:
        try:
            _prefect(server, "work-pool", "create", "vta-boards", "--type", "process")
            _prefect(server, "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
            with server.client() as client:
                dep = client.read_deployment_by_name("nightly/nightly")
                (sched,) = dep.schedules
                assert sched.schedule.cron == "30 1 * * *" and sched.schedule.timezone == "Europe/Berlin"
                assert dep.work_pool_name == "vta-boards" and dep.parameters["trials_per_task"] == 64
                assert dep.pull_steps[0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(REPO)
            # Triggered by hand with a tiny budget, as the README shows.
            params = {"models": ["builtin:micronet"], "targets": ["host"], "trials_per_task": 2,
                      "trials_per_batch": 2, "tracker": board.tracker, "key": board.key, "store": str(store),
                      "night": "2026-11-22", "config": {"tune": {"task_filter": "conv2d"}, "measure": {"number": 2},
                                                         "evaluate": {"repeat": 3}}}
            out = _prefect(server, "deployment", "run", "nightly/nightly", "--params", json.dumps(params))
            worker = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", "vta-boards", "--name", "test-worker"],
                cwd=tmp_path, env=server.env(), stdout=open(OUTPUTS / "worker.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                with server.client() as client:
                    (run,) = client.read_flow_runs()
                    deadline = time.time() + 900
                    while not run.state.is_final():
                        assert worker.poll() is None, (OUTPUTS / "worker.log").read_text()[-3000:]
                        assert time.time() < deadline, f"nightly run still {run.state.name}"
                        time.sleep(3)
                        run = client.read_flow_run(run.id)
                    assert run.state.is_completed(), (run.state.message, (OUTPUTS / "worker.log").read_text()[-3000:])
                    assert run.deployment_id == dep.id and run.work_pool_name == "vta-boards"
                    (sub,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
                    assert sub.name == "micronet-host-2026-11-22" and sub.state.is_completed()
                    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[sub.id])))
            finally:
                import os
                import signal

                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
            # Our library's and TVM's INFO lines are in the run's logs (the deployment's env).
            names = {log.name for log in logs}
            assert any(n.startswith("vta_pipeline.") for n in names), names
            assert any(n.startswith("tvm.") for n in names), names
            (OUTPUTS / "logs.txt").write_text("\n".join(f"{log.name}: {log.message[:200]}" for log in logs))
            assert "nightly/nightly" in out
            result = json.loads(next((store / "runs").glob("*.json")).read_text())
            assert result["night"] == "2026-11-22" and result["tuned"]["correct"]
        finally:
            server.save_log(OUTPUTS / "server.log")
