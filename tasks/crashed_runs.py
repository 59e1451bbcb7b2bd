"""A flow run whose process died shows as Crashed (or Cancelled, when a signal stopped it), not Running forever.

Prefect marks a run Crashed when its engine sees the crash (an exception, a signal it can
catch). SIGKILL, the OOM killer or a power cut leave the run "Running" in the database,
with its task runs, until something says otherwise. Three things do:

- deployments: flow-run heartbeats plus the automation in `deployments/automations.yaml`
  (the server marks a run Crashed when its heartbeats stop);
- a command-line run's keeper (`tasks.local_api`), a process that outlives the run: it
  closes the run's flow runs as soon as the run's process is gone, Cancelled when a signal
  stopped it, else Crashed;
- every run of `tune_network`: the run records its start and end in the store's events with
  its process's identity, and the next run on the same store marks the runs whose process
  is gone and that nothing closed (the keeper died too: a power cut) Crashed, with their
  unfinished task runs.
"""

from __future__ import annotations

import logging

from vta_pipeline.boards.liveness import dead_runs, identity
from vta_pipeline.store.artifacts import ArtifactStore

STARTED, ENDED, MARKED = "run_started", "run_ended", "run_marked_crashed"


def record_start(store: ArtifactStore, flow_run_id: str) -> None:
    store.log_event(STARTED, flow_run_id=flow_run_id, process=identity())


def record_end(store: ArtifactStore, flow_run_id: str, state: str) -> None:
    store.log_event(ENDED, flow_run_id=flow_run_id, state=state)


def mark_dead_runs_crashed(
    store: ArtifactStore, by: str, logger: logging.Logger | logging.LoggerAdapter, pid: int | None = None
) -> list[str]:
    """Mark the store's dead, unfinished flow runs Crashed on the Prefect server; return their ids.

    `pid`: only the runs of that process (its keeper, `tasks.local_api`, closing them).
    A run the server no longer knows (another server, a wiped database) or already shows
    in a final state is only recorded as handled.
    """
    from prefect.states import Crashed

    marked = []
    for e in _dead(store, pid):
        proc = e.get("process", {})
        why = (
            f"its process (pid {proc.get('pid')} on {proc.get('host')}) died without reporting an end "
            f"(SIGKILL, the OOM killer, a lost host); found by {by}"
        )
        closed = _close(
            e["flow_run_id"],
            lambda m: Crashed(message=m),
            f"Crashed: {why}",
            f"Crashed with its flow run: {why}",
            logger,
        )
        if closed:
            marked.append(e["flow_run_id"])
        store.log_event(MARKED, flow_run_id=e["flow_run_id"], by=by, state="Crashed" if closed else closed)
    return marked


def mark_dead_runs_cancelled(
    store: ArtifactStore, pid: int, signal_name: str, logger: logging.Logger | logging.LoggerAdapter
) -> list[str]:
    """Mark the unfinished flow runs of process `pid`, which `signal_name` stopped, Cancelled."""
    from prefect.states import Cancelled

    why = (
        f"{signal_name} stopped the run's process (pid {pid}); every measured batch is kept in the store "
        f"{store.root}: rerun the same command to continue"
    )
    marked = []
    for e in _dead(store, pid):
        closed = _close(
            e["flow_run_id"],
            lambda m: Cancelled(message=m),
            f"Cancelled: {why}",
            f"Cancelled with its flow run: {why}",
            logger,
        )
        if closed:
            marked.append(e["flow_run_id"])
        record_end(store, e["flow_run_id"], "Cancelled" if closed else closed)
    return marked


def _dead(store: ArtifactStore, pid: int | None) -> list[dict]:
    dead = dead_runs(store.events(), STARTED, ENDED, MARKED)
    return [e for e in dead if pid is None or e.get("process", {}).get("pid") == pid]


def _close(
    run_id: str, state, flow_message: str, task_message: str, logger: logging.Logger | logging.LoggerAdapter
) -> str | bool:
    """Set flow run `run_id` and its unfinished task runs to `state(message)`; True when done,
    else the state it already had (None when the server does not know it)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(run_id)
        except (ObjectNotFound, ValueError):
            return None
        if run.state is not None and run.state.is_final():
            return run.state.name
        client.set_flow_run_state(run_id, state(flow_message), force=True)
        unfinished = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(
                    type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED])
                )
            ),
        )
        for tr in unfinished:
            client.set_task_run_state(tr.id, state(task_message), force=True)
    logger.warning(
        "flow run %s (%s) was left %s by a dead process: marked %s with %d unfinished task run(s)",
        run.name,
        run_id,
        run.state.name if run.state else "without a state",
        flow_message.split(":")[0],
        len(unfinished),
    )
    return True
