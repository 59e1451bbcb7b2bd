"""`vta-pipeline run`: tune a network end to end with the Prefect flow `tune_network`, showing
one progress bar per tuning task, against a temporary Prefect server kept by a process that
outlives this one long enough to record how the run ended (`tasks.local_api`)."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from vta_pipeline.cli.common import _config, _fail, _guard
from vta_pipeline.cli.flags import config_flags
from vta_pipeline.cli.options import ConfigOpt


@config_flags("model", "target", "board", "tune", "measure", "evaluate", "guard", "int8", "opt")
def run(
    config: ConfigOpt = None,
    cache: Annotated[str, typer.Option(help="on | off | redo | readonly")] = "on",
    dask: Annotated[
        Optional[str],
        typer.Option(
            "--dask", help="Run the tuning tasks on this Dask scheduler (tcp://HOST:8786); store on shared storage."
        ),
    ] = None,
    *,
    overrides: dict,
):
    """Tune a network end to end (the Prefect flow `tune_network`) and print the result.

    Every flag sets the config field its help names; --config reads them all from a file."""

    def go():
        from vta_pipeline.fetch import check_model
        from vta_pipeline.targets import resolve_target

        from ..store.artifacts import CachePolicy, check_store_path

        try:
            CachePolicy(cache)
        except ValueError:
            _fail(f"--cache {cache!r}: use one of on, off, redo, readonly")
        cfg = _config(config, overrides)
        from vta_pipeline import steps

        tgt = resolve_target(cfg.target)
        steps.check_target(cfg, tgt)  # toolchain, layout: before Prefect starts
        steps.check_local_board(cfg, tgt)
        check_model(cfg.model)
        store_path = check_store_path(cfg.store)
        from ..store import gc as store_gc

        store_gc.check_free_space(store_path, cfg.min_free_gib)  # before Prefect starts
        if cfg.board.tracker:  # a remote tracker: fail now, before Prefect starts, if it is down
            from vta_pipeline import boards

            boards.tracker_summary(*cfg.board.address())
        _prefect_env()
        from vta_pipeline.cli.run_log import open_run_log
        from vta_pipeline.flows.tune_network import tune_network
        from vta_pipeline.tasks.dask_runner import with_task_runner

        log_path = open_run_log(store_path)
        api = _local_api(store_path, log_path)
        _exit_on_interrupt(store_path, log_path, api)

        flow = with_task_runner(tune_network, dask, cfg)  # a bad cluster fails here, before any work
        if dask:  # progress events fire in the workers: the UI's progress artifact shows them
            typer.echo(f"tuning tasks run on the Dask cluster {dask}; progress: the run's artifacts in the Prefect UI")
            with api.settings():
                state = flow(cfg.model_dump(mode="json"), cache=cache, return_state=True)
        else:
            with api.settings(), _tuning_progress():
                state = tune_network(cfg.model_dump(mode="json"), cache=cache, return_state=True)
        try:
            result = state.result()
        except Exception as e:
            full = store_gc.disk_full(e)
            if full is None:
                raise
            raise store_gc.StoreFull(store_gc.disk_full_message(store_path, full)) from None
        from vta_pipeline.report import RunResult, render

        typer.echo(render(RunResult.model_validate(result)))
        if state.name == "Regressed":
            typer.secho(state.message, fg=typer.colors.YELLOW, bold=True)
        typer.echo(f"full log: {log_path}")

    _guard(go)


class _tuning_progress:
    """One rich progress bar per tuning task, fed by vta_pipeline.search.progress events."""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from vta_pipeline.search import progress

        self.bars = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            transient=False,
        )
        self.ids: dict[str, int] = {}
        self.best: dict[str, float] = {}
        self.bars.start()
        self.unsubscribe = progress.subscribe(self.on_event)
        return self

    def on_event(self, e):
        lat = [r["latency_ms"] for r in e.get("batch", []) if r.get("latency_ms") is not None]
        if lat:
            self.best[e["task"]] = min(self.best.get(e["task"], float("inf")), *lat)
        best = f"{self.best[e['task']]:.4f} ms" if e["task"] in self.best else "-"
        if e["task"] not in self.ids:
            self.ids[e["task"]] = self.bars.add_task(e["task"], total=e["budget"], best=best)
        self.bars.update(self.ids[e["task"]], completed=e["trials"], best=best)

    def __exit__(self, *exc):
        self.unsubscribe()
        self.bars.stop()


def _exit_on_interrupt(store_path, log_path, api) -> None:
    """Ctrl-C (SIGINT) or SIGTERM ends the run at once, with one message.

    Prefect raises KeyboardInterrupt in the flow's thread only: the tuning threads went on
    measuring (the process was still there minutes later) and two tracebacks were printed.
    Exiting here keeps what a SIGKILL keeps, which the store is built for: every measured batch
    is already appended and fsynced, artifacts are renamed into place only when whole, and the
    local board stops with this process (its watchdog). At most the batch in flight is
    measured again. The run's keeper, told the signal's name, marks the run Cancelled.

    It exits at once: the builder's workers share this process group and die of the same
    Ctrl-C, and a handler that lingered (to mark the run Cancelled itself) let the tuning
    threads record the candidates in flight as failed builds."""
    import signal
    import sys

    def stop(signum, _frame) -> None:
        name = signal.Signals(signum).name
        api.note_signal(name)
        sys.stderr.write(
            f"\nvta-pipeline: {name}: stopping now. Every measured batch is kept in the store "
            f"{store_path}; rerun the same command to continue where this run stopped "
            f"(at most the batch in flight is measured again). Log: {log_path}\n"
        )
        sys.stderr.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _prefect_env() -> None:
    """Settings that make a local, serverless run work on a slow machine."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "vta_pipeline")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _local_api(store_path, log_path):
    """The run's Prefect API and its keeper (`tasks.local_api`): Prefect's own temporary server
    shares the run's process group, so a Ctrl-C stopped it before anything could record the
    run as Cancelled, and a SIGKILLed run left it behind. With PREFECT_API_URL set, that
    server is used and the keeper only closes the run there."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    from vta_pipeline.tasks.local_api import LocalApi

    api = LocalApi(
        store_path,
        log_path,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(),
        api_url=PREFECT_API_URL.value() or None,
    )
    api.start()
    return api
