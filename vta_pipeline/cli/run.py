"""`vta-pipeline run`: tune a network end to end with the Prefect flow `tune_network`, showing
one progress bar per tuning task, against a temporary Prefect server kept by a process that
outlives this one long enough to record how the run ended (`tasks.local_api`)."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from vta_pipeline.cli.common import _config, _fail, _guard, _int8_overrides, _model_overrides, _opt_overrides
from vta_pipeline.cli.options import (
    BfactorOpt,
    BlockedOpt,
    CalibDataOpt,
    CalibModeOpt,
    CfactorOpt,
    ConfigOpt,
    DepthwiseDotOpt,
    GlobalScaleOpt,
    Int8ActivationsOpt,
    KeyOpt,
    ModelOpt,
    OnnxOpt,
    OptLevelOpt,
    PackLayoutOpt,
    PackOpt,
    PackStartIdxOpt,
    PackStartOpt,
    PackStemOpt,
    PackStopIdxOpt,
    PackStopOpt,
    PadChannelsOpt,
    QuantizeDenseOpt,
    QuantizeOpt,
    ShapeOpt,
    SkipConvOpt,
    SourceOpt,
    StoreOpt,
    TargetOpt,
    TrackerOpt,
    VtaConfigOpt,
    VtaOpt,
    WinogradOpt,
    WinogradSmallBelowOpt,
)


def run(
    config: ConfigOpt = None,
    model: ModelOpt = None,
    source: SourceOpt = None,
    onnx_path: OnnxOpt = None,
    input_shape: ShapeOpt = None,
    pretrained: Annotated[Optional[bool], typer.Option("--pretrained/--random-weights")] = None,
    target: TargetOpt = None,
    tracker: TrackerOpt = None,
    key: KeyOpt = None,
    local_servers: Annotated[
        Optional[int],
        typer.Option(help="rpc servers of the local board (1: one measurement at a time on this machine's cores)."),
    ] = None,
    local_threads: Annotated[
        Optional[int], typer.Option(help="Threads the local board runs kernels with (default: the target's num-cores).")
    ] = None,
    trials_per_task: Annotated[Optional[int], typer.Option(help="Measured trials per task.")] = None,
    trials_per_batch: Annotated[Optional[int], typer.Option(help="Candidates per measured batch.")] = None,
    allocation: Annotated[
        Optional[str],
        typer.Option(
            help="flat (trials-per-task each) | latency (half each, the rest to the tasks the network's time goes to)"
        ),
    ] = None,
    cost_model: Annotated[Optional[str], typer.Option(help="xgb | random")] = None,
    search: Annotated[Optional[str], typer.Option(help="evolutionary | replay-trace")] = None,
    early_stopping: Annotated[
        Optional[int], typer.Option(help="Stop a task after N trials without improvement.")
    ] = None,
    task_filter: Annotated[Optional[str], typer.Option(help="auto | all | conv2d | packed")] = None,
    number: Annotated[Optional[int], typer.Option(help="Runs per measurement while tuning.")] = None,
    repeat: Annotated[Optional[int], typer.Option(help="Measurements per candidate while tuning.")] = None,
    timeout: Annotated[Optional[int], typer.Option(help="RPC session timeout per measurement, s.")] = None,
    retime_caches: Annotated[
        Optional[str],
        typer.Option(
            help="How each task's best records are re-timed after its search: warm (back to back; the default) | "
            "flushed (weights and output flushed from the caches before each run, as inside a network) | auto "
            "(flushed on 64-bit x86 and Arm CPUs)"
        ),
    ] = None,
    eval_repeat: Annotated[Optional[int], typer.Option(help="Timed repeats of the final evaluation.")] = None,
    compare: Annotated[
        Optional[bool],
        typer.Option(
            "--compare/--no-compare",
            help="On a local board of a host CPU target, time ONNX Runtime fp32 in turn with the tuned build and "
            "report ours / ORT (default: on).",
        ),
    ] = None,
    store: StoreOpt = None,
    cache: Annotated[str, typer.Option(help="on | off | redo | readonly")] = "on",
    vta: VtaOpt = False,
    vta_config: VtaConfigOpt = None,
    quantize: QuantizeOpt = None,
    global_scale: GlobalScaleOpt = None,
    skip_conv_layers: SkipConvOpt = None,
    calibrate_mode: CalibModeOpt = None,
    calibration_data: CalibDataOpt = None,
    pack: PackOpt = None,
    pack_start: PackStartOpt = None,
    pack_stop: PackStopOpt = None,
    pack_start_idx: PackStartIdxOpt = None,
    pack_stop_idx: PackStopIdxOpt = None,
    bfactor: BfactorOpt = None,
    cfactor: CfactorOpt = None,
    pack_layout: PackLayoutOpt = None,
    pad_channels: PadChannelsOpt = None,
    quantize_dense: QuantizeDenseOpt = None,
    int8_activations: Int8ActivationsOpt = None,
    pack_stem: PackStemOpt = None,
    depthwise_dot: DepthwiseDotOpt = None,
    winograd: WinogradOpt = None,
    winograd_small_below: WinogradSmallBelowOpt = None,
    opt: OptLevelOpt = None,
    blocked: BlockedOpt = None,
    session: Annotated[
        Optional[str],
        typer.Option(help="Tuning session (e.g. tonight's date): a new session tunes a full budget of its own."),
    ] = None,
    warm_start: Annotated[
        Optional[int], typer.Option(help="Seed each task with up to N best records of earlier sessions (0 = cold).")
    ] = None,
    records_library: Annotated[
        Optional[str],
        typer.Option(
            help="Workloads the store never measured start from: builtin (shipped records of this CPU class) | off | "
            "a directory from `vta-pipeline library export`."
        ),
    ] = None,
    max_regression_pct: Annotated[
        Optional[float],
        typer.Option(help="Regression guard: tuned latency this % worse than the best night keeps the old build."),
    ] = None,
    confirm_rounds: Annotated[
        Optional[int],
        typer.Option(
            help="Regression guard: time tonight's and the best night's builds in turn on the board this many rounds "
            "before calling a regression (0: the evaluations alone decide)."
        ),
    ] = None,
    dask: Annotated[
        Optional[str],
        typer.Option(
            "--dask", help="Run the tuning tasks on this Dask scheduler (tcp://HOST:8786); store on shared storage."
        ),
    ] = None,
):
    """Tune a network end to end (the Prefect flow `tune_network`) and print the result."""

    def go():
        from vta_pipeline.fetch import check_model
        from vta_pipeline.targets import resolve_target

        from ..store.artifacts import CachePolicy, check_store_path

        try:
            CachePolicy(cache)
        except ValueError:
            _fail(f"--cache {cache!r}: use one of on, off, redo, readonly")
        cfg = _config(
            config,
            {
                **_model_overrides(model, source, onnx_path, input_shape),
                "model.pretrained": pretrained,
                "target": target,
                "board.tracker": tracker,
                "board.key": key,
                "board.local_servers": local_servers,
                "board.local_threads": local_threads,
                "tune.trials_per_task": trials_per_task,
                "tune.trials_per_batch": trials_per_batch,
                "tune.allocation": allocation,
                "tune.cost_model": cost_model,
                "tune.search": search,
                "tune.early_stopping": early_stopping,
                "tune.retime_caches": retime_caches,
                "tune.task_filter": task_filter,
                "measure.number": number,
                "measure.repeat": repeat,
                "measure.timeout_s": timeout,
                "evaluate.repeat": eval_repeat,
                "evaluate.compare": compare,
                "store": store and str(store),
                "tune.session": session,
                "tune.warm_start": warm_start,
                "tune.records_library": records_library,
                "guard.max_regression_pct": max_regression_pct,
                "guard.confirm_rounds": confirm_rounds,
                **_int8_overrides(
                    vta,
                    vta_config,
                    quantize,
                    global_scale,
                    skip_conv_layers,
                    calibrate_mode,
                    calibration_data,
                    pack,
                    pack_start,
                    pack_stop,
                    pack_start_idx,
                    pack_stop_idx,
                    bfactor,
                    cfactor,
                    pack_layout,
                    pad_channels,
                    quantize_dense,
                    pack_stem,
                    int8_activations,
                    depthwise_dot,
                    winograd,
                    winograd_small_below,
                ),
                **_opt_overrides(opt, blocked),
            },
        )
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
        from flows.tune_network import tune_network
        from tasks.dask_runner import with_task_runner
        from vta_pipeline.run_log import open_run_log

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
        from vta_pipeline.report import render

        typer.echo(render(result))
        if state.name == "Regressed":
            typer.secho(state.message, fg=typer.colors.YELLOW, bold=True)
        typer.echo(f"full log: {log_path}")

    _guard(go)


class _tuning_progress:
    """One rich progress bar per tuning task, fed by vta_pipeline.progress events."""

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from vta_pipeline import progress

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

    from tasks.local_api import LocalApi

    api = LocalApi(
        store_path,
        log_path,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(),
        api_url=PREFECT_API_URL.value() or None,
    )
    api.start()
    return api
