"""The nightly deployment as the README sets it up: a real Prefect server, a process work
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
    limit = dep.global_concurrency_limit  # `concurrency_limit: 1` of prefect.yaml, as the server keeps it
    assert (limit.limit if limit is not None else dep.concurrency_limit) == 1
    assert dep.parameters["trials_per_task"] == 64 and dep.parameters["models"][0] == "builtin:tinynet"
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
