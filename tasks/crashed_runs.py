"""A flow run whose process died shows as Crashed, not Running forever.

Prefect marks a run Crashed when its engine sees the crash (an exception, a signal it can
catch). SIGKILL, the OOM killer or a power cut leave the run "Running" in the database,
with its task runs, until something says otherwise. Two things do:

- deployments: flow-run heartbeats plus the automation in `deployments/automations.yaml`
  (the server marks a run Crashed when its heartbeats stop);
- every run of `tune_network` (CLI runs have no server that outlives them): the run records
  its start and end in the store's events with its process's identity, and the next run
  on the same store marks the runs whose process is gone and that never recorded an end
  as Crashed, with their unfinished task runs.
"""

from __future__ import annotations

import logging

from vta_pipeline.liveness import dead_runs, identity
from vta_pipeline.store import ArtifactStore

STARTED, ENDED, MARKED = "run_started", "run_ended", "run_marked_crashed"


def record_start(store: ArtifactStore, flow_run_id: str) -> None:
    store.log_event(STARTED, flow_run_id=flow_run_id, process=identity())


def record_end(store: ArtifactStore, flow_run_id: str, state: str) -> None:
    store.log_event(ENDED, flow_run_id=flow_run_id, state=state)


def mark_dead_runs_crashed(store: ArtifactStore, by: str, logger: logging.Logger | logging.LoggerAdapter) -> list[str]:
    """Mark the store's dead, unfinished flow runs Crashed on the Prefect server; return their ids.

    A run the server no longer knows (another server, a wiped database) or already shows
    in a final state is only recorded as handled.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, TaskRunFilter,
                                                TaskRunFilterState, TaskRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    marked = []
    dead = dead_runs(store.events(), STARTED, ENDED, MARKED)
    if not dead:
        return marked
    with get_client(sync_client=True) as client:
        for e in dead:
            run_id, proc = e["flow_run_id"], e.get("process", {})
            why = (f"its process (pid {proc.get('pid')} on {proc.get('host')}) died without reporting an end "
                   f"(SIGKILL, the OOM killer, a lost host); found by flow run {by} on the same store")
            try:
                run = client.read_flow_run(run_id)
            except (ObjectNotFound, ValueError):
                store.log_event(MARKED, flow_run_id=run_id, by=by, state=None)
                continue
            if run.state is None or not run.state.is_final():
                client.set_flow_run_state(run_id, Crashed(message=f"Crashed: {why}"), force=True)
                unfinished = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
                    task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
                        any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED]))))
                for tr in unfinished:
                    client.set_task_run_state(tr.id, Crashed(message=f"Crashed with its flow run: {why}"),
                                              force=True)
                logger.warning("flow run %s (%s) was left %s by a dead process: marked Crashed with %d "
                               "unfinished task run(s)", run.name, run_id,
                               run.state.name if run.state else "without a state", len(unfinished))
                marked.append(str(run_id))
            store.log_event(MARKED, flow_run_id=run_id, by=by,
                            state="Crashed" if str(run_id) in marked else run.state.name)
    return marked
