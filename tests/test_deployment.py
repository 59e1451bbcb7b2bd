"""The nightly deployment as docs/nightly-operations.md sets it up: a real Prefect server, a process work
pool, `prefect deploy` of deployments/prefect.yaml, a run triggered by hand, a real worker
(the run itself: tests/nightly_deployment.py, shared with the UI test)."""

import pytest
from nightly_deployment import NIGHT, POOL, REPO

pytestmark = pytest.mark.slow


def test_the_deployment_has_the_nightly_schedule_pool_and_working_directory(deployed_nightly):
    dep = deployed_nightly.deployment
    (sched,) = dep.schedules
    assert sched.active and sched.schedule.cron == "30 1 * * *" and sched.schedule.timezone == "Europe/Berlin"
    assert dep.work_pool_name == POOL
    limit = dep.global_concurrency_limit  # `concurrency_limit` of prefect.yaml, as the server keeps it
    assert (limit.limit if limit is not None else dep.concurrency_limit) == 1
    # a night still running (a hung board past every deadline) cancels the next, never queues nights behind it
    assert str(dep.concurrency_options.collision_strategy.value) == "CANCEL_NEW"
    assert (
        dep.parameters["config"]["tune"]["trials_per_task"] == 64 and dep.parameters["models"][0] == "builtin:tinynet"
    )
    (pull,) = dep.pull_steps
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == str(REPO)
    assert dep.job_variables["env"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "vta_pipeline,tvm"


def test_a_run_triggered_by_hand_is_run_by_the_worker_with_one_subflow_per_pair(deployed_nightly):
    d = deployed_nightly
    assert d.run.deployment_id == d.deployment.id and d.run.work_pool_name == POOL
    assert d.run.state.is_completed() and d.run.run_count == 1
    assert d.subflow.name == f"micronet-host-{NIGHT}" and d.subflow.state.is_completed()
    assert d.result["night"] == NIGHT and d.result["session"] == NIGHT and d.result["tuned"]["correct"]
    assert d.result["history"]["measurements"] == 4  # 2 conv tasks x 2 trials


def test_our_and_tvms_info_logs_are_in_the_runs_logs(deployed_nightly):
    names = {r.name for r in deployed_nightly.logs}
    ours = [r for r in deployed_nightly.logs if r.name.startswith("vta_pipeline.")]
    assert ours and all(r.level >= 20 for r in ours), names
    assert any(n.startswith("tvm.") for n in names), names


def test_a_run_whose_process_is_killed_is_marked_crashed_by_the_heartbeat_automation(prefect_server, tmp_path):
    """deployments/automations.yaml, created on the server as the deployment's docs say (its
    window shortened to fit a test), turns a run whose heartbeats stop into Crashed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.events.schemas.automations import AutomationCore

    deployment_env = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    (nightly,) = deployment_env["deployments"]
    beat_s = int(nightly["work_pool"]["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"])
    (spec,) = yaml.safe_load((REPO / "deployments" / "automations.yaml").read_text())["automations"]
    assert spec["trigger"]["within"] >= 2 * beat_s  # one late heartbeat is not a crash
    spec["trigger"]["within"] = 40  # the test's heartbeat comes every 30 s (Prefect's minimum)
    flow_file = tmp_path / "sleeper.py"
    flow_file.write_text(
        "import time\nfrom prefect import flow\n\n@flow(name='heartbeat-sleeper')\n"
        "def sleeper():\n    time.sleep(900)\n\nsleeper()\n"
    )
    with prefect_server.client() as client:
        automation = client.create_automation(AutomationCore.model_validate(spec))
        proc = subprocess.Popen(
            [sys.executable, str(flow_file)],
            env=prefect_server.env({"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 180
            runs = []
            while not runs or runs[0].state.type.value != "RUNNING":
                assert time.time() < deadline and proc.poll() is None, "the flow run did not start"
                time.sleep(1)
                runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["heartbeat-sleeper"])))
            time.sleep(5)  # its first heartbeat is on its way
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            deadline = time.time() + 240
            run = client.read_flow_run(runs[0].id)
            while run.state.type.value != "CRASHED":
                assert run.state.type.value == "RUNNING", run.state
                assert time.time() < deadline, "the killed run is still Running"
                time.sleep(3)
                run = client.read_flow_run(runs[0].id)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            client.delete_automation(automation)  # its short window would crash other tests' runs
    assert "No heartbeat" in run.state.message
