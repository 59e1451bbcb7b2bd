"""`vta-pipeline`: the command line. Thin: parse, validate, call the library or the flow.

User errors (bad options, unknown models, unreachable trackers) print one clear message
and exit with status 2, without a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from vta_pipeline.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
board_app = typer.Typer(no_args_is_help=True, help="A local board: RPC tracker + rpc_server processes on 127.0.0.1.")
app.add_typer(board_app, name="board")

BOARD_STATE = Path(os.environ.get("VTA_PIPELINE_BOARD_STATE", "~/.vta-pipeline/board.json")).expanduser()

# ---- shared options ------------------------------------------------------------------------------
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="JSON/TOML file with the same fields as the flags.")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model name (default: built-in tinynet).")]
SourceOpt = Annotated[Optional[str], typer.Option("--source", help="builtin | torchvision | gluon | onnx")]
OnnxOpt = Annotated[Optional[Path], typer.Option("--onnx-path", help="The .onnx file (source onnx).")]
ShapeOpt = Annotated[Optional[str], typer.Option("--input-shape", help="N,C,H,W (default by model).")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Preset name or TVM target JSON (default: host).")]
TrackerOpt = Annotated[Optional[str], typer.Option("--tracker", help="HOST:PORT of an RPC tracker (default: local board).")]
KeyOpt = Annotated[Optional[str], typer.Option("--key", help="Board key under the tracker.")]
StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Artifact store directory.")]
# the int8 VTA path: quantize + graph pack
VtaOpt = Annotated[bool, typer.Option("--vta", help="Quantize + pack with the recipe's defaults; tune the packed convs.")]
VtaConfigOpt = Annotated[Optional[Path], typer.Option("--vta-config", help="VTA's vta_config.json (block sizes).")]
QuantizeOpt = Annotated[Optional[bool], typer.Option("--quantize/--no-quantize", help="int8 quantization.")]
GlobalScaleOpt = Annotated[Optional[float], typer.Option(help="Activation bound (power of two).")]
SkipConvOpt = Annotated[Optional[str], typer.Option(help="conv2d indices kept float, e.g. 0 or 0,5 ('' = none).")]
CalibModeOpt = Annotated[Optional[str], typer.Option(help="global_scale | max | percentile")]
CalibDataOpt = Annotated[Optional[Path], typer.Option(help=".npy/.npz calibration inputs (B,C,H,W).")]
PackOpt = Annotated[Optional[bool], typer.Option("--pack/--no-pack", help="VTA graph pack.")]
PackStartOpt = Annotated[Optional[str], typer.Option(help="Operator packing starts after (nn.max_pool2d).")]
PackStopOpt = Annotated[Optional[str], typer.Option(help="Operator packing stops before (nn.global_avg_pool2d).")]
PackStartIdxOpt = Annotated[Optional[int], typer.Option(help="Which occurrence of --pack-start (0 = first).")]
PackStopIdxOpt = Annotated[Optional[int], typer.Option(help="Which occurrence of --pack-stop.")]
BfactorOpt = Annotated[Optional[int], typer.Option(help="Batch block (default: VTA BATCH).")]
CfactorOpt = Annotated[Optional[int], typer.Option(help="Channel block (default: VTA BLOCK_OUT).")]
PackLayoutOpt = Annotated[Optional[str], typer.Option(
    help="Packed weights: vta (OIHW16o16i, VTA's) | x86 (OIHW16o4i + uint8 activations: the CPU's int8 dot product).")]


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _shape(s: str | None):
    if s is None:
        return None
    try:
        return [int(x) for x in s.replace("x", ",").split(",")]
    except ValueError:
        _fail(f"--input-shape {s!r} is not N,C,H,W (e.g. 1,3,224,224)")


def _model_overrides(model, source, onnx_path, input_shape) -> dict:
    """The model options shared by `run` and `tasks`, as config overrides."""
    return {"model.name": model, "model.source": source, "model.path": onnx_path and str(onnx_path),
            "model.input_shape": _shape(input_shape)}


def _int8_overrides(vta, vta_config, quantize, global_scale, skip_conv_layers, calibrate_mode, calibration_data,
                    pack, pack_start, pack_stop, pack_start_idx, pack_stop_idx, bfactor, cfactor,
                    pack_layout=None) -> dict:
    """The quantize / pack options shared by `run`, `tasks` and `pack-points`, as overrides.
    `--vta` turns both on (an explicit --no-quantize/--no-pack still wins)."""
    skip = None
    if skip_conv_layers is not None:
        try:
            skip = [int(i) for i in skip_conv_layers.split(",") if i.strip()]
        except ValueError:
            _fail(f"--skip-conv-layers {skip_conv_layers!r} is not a comma-separated list of conv indices")
    out = {
        "quantize.enabled": quantize if quantize is not None else (True if vta else None),
        "quantize.global_scale": global_scale, "quantize.skip_conv_layers": skip,
        "quantize.calibrate_mode": calibrate_mode, "quantize.calibration_data": calibration_data and str(calibration_data),
        "pack.enabled": pack if pack is not None else (True if vta else None),
        "pack.start_name": pack_start, "pack.stop_name": pack_stop,
        "pack.start_name_idx": pack_start_idx, "pack.stop_name_idx": pack_stop_idx,
        "pack.bfactor": bfactor, "pack.cfactor": cfactor, "pack.layout": pack_layout,
    }
    if vta_config is not None:
        from vta_pipeline.vta_config import VTAConfig

        out["vta"] = _guard(lambda: VTAConfig.load(vta_config)).model_dump()
    return out


def _config(config, overrides):
    from vta_pipeline.config import build_config, load_config_file

    file_values = load_config_file(config) if config else None
    return build_config(file_values, overrides, source=str(config) if config else "")


def _guard(fn):
    """Run fn, turning user errors into one line and exit status 2."""
    try:
        return fn()
    except UserError as e:
        _fail(str(e))


# ---- run -----------------------------------------------------------------------------------------
@app.command()
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
    local_servers: Annotated[Optional[int], typer.Option(
        help="rpc servers of the local board (1: one measurement at a time on this machine's cores).")] = None,
    local_threads: Annotated[Optional[int], typer.Option(
        help="Threads the local board runs kernels with (default: the target's num-cores).")] = None,
    trials_per_task: Annotated[Optional[int], typer.Option(help="Measured trials per task.")] = None,
    trials_per_batch: Annotated[Optional[int], typer.Option(help="Candidates per measured batch.")] = None,
    allocation: Annotated[Optional[str], typer.Option(
        help="flat (trials-per-task each) | latency (half each, the rest to the tasks the network's "
             "time goes to)")] = None,
    cost_model: Annotated[Optional[str], typer.Option(help="xgb | random")] = None,
    search: Annotated[Optional[str], typer.Option(help="evolutionary | replay-trace")] = None,
    early_stopping: Annotated[Optional[int], typer.Option(help="Stop a task after N trials without improvement.")] = None,
    task_filter: Annotated[Optional[str], typer.Option(help="auto | all | conv2d | packed")] = None,
    number: Annotated[Optional[int], typer.Option(help="Runs per measurement while tuning.")] = None,
    repeat: Annotated[Optional[int], typer.Option(help="Measurements per candidate while tuning.")] = None,
    timeout: Annotated[Optional[int], typer.Option(help="RPC session timeout per measurement, s.")] = None,
    eval_repeat: Annotated[Optional[int], typer.Option(help="Timed repeats of the final evaluation.")] = None,
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
    session: Annotated[Optional[str], typer.Option(
        help="Tuning session (e.g. tonight's date): a new session tunes a full budget of its own.")] = None,
    warm_start: Annotated[Optional[int], typer.Option(
        help="Seed each task with up to N best records of earlier sessions (0 = cold).")] = None,
    max_regression_pct: Annotated[Optional[float], typer.Option(
        help="Regression guard: tuned latency this % worse than the best night keeps the old build.")] = None,
    dask: Annotated[Optional[str], typer.Option(
        "--dask", help="Run the tuning tasks on this Dask scheduler (tcp://HOST:8786); store on shared storage.")] = None,
):
    """Tune a network end to end (the Prefect flow `tune_network`) and print the result."""

    def go():
        from vta_pipeline.targets import resolve_target
        from vta_pipeline.importers import check_model
        from vta_pipeline.store import CachePolicy, check_store_path

        try:
            CachePolicy(cache)
        except ValueError:
            _fail(f"--cache {cache!r}: use one of on, off, redo, readonly")
        cfg = _config(config, {
            **_model_overrides(model, source, onnx_path, input_shape), "model.pretrained": pretrained,
            "target": target, "board.tracker": tracker, "board.key": key, "board.local_servers": local_servers,
            "board.local_threads": local_threads,
            "tune.trials_per_task": trials_per_task, "tune.trials_per_batch": trials_per_batch,
            "tune.allocation": allocation, "tune.cost_model": cost_model, "tune.search": search,
            "tune.early_stopping": early_stopping,
            "tune.task_filter": task_filter, "measure.number": number, "measure.repeat": repeat,
            "measure.timeout_s": timeout, "evaluate.repeat": eval_repeat, "store": store and str(store),
            "tune.session": session, "tune.warm_start": warm_start, "guard.max_regression_pct": max_regression_pct,
            **_int8_overrides(vta, vta_config, quantize, global_scale, skip_conv_layers, calibrate_mode,
                              calibration_data, pack, pack_start, pack_stop, pack_start_idx, pack_stop_idx,
                              bfactor, cfactor, pack_layout),
        })
        from vta_pipeline import steps

        tgt = resolve_target(cfg.target)
        steps.check_target(cfg, tgt)  # toolchain, layout: before Prefect starts
        steps.check_local_board(cfg, tgt)
        check_model(cfg.model)
        store_path = check_store_path(cfg.store)
        if cfg.board.tracker:  # a remote tracker: fail now, before Prefect starts, if it is down
            from vta_pipeline import boards

            boards.tracker_summary(*cfg.board.address())
        _prefect_env()
        from flows.runners import with_task_runner
        from flows.tune_network import tune_network
        from vta_pipeline.run_log import open_run_log

        log_path = open_run_log(store_path)
        _temporary_prefect_server()

        flow = with_task_runner(tune_network, dask, cfg)  # a bad cluster fails here, before any work
        if dask:  # progress events fire in the workers: the UI's progress artifact shows them
            typer.echo(f"tuning tasks run on the Dask cluster {dask}; progress: the run's artifacts in the Prefect UI")
            state = flow(cfg.model_dump(mode="json"), cache=cache, return_state=True)
        else:
            with _tuning_progress():
                state = tune_network(cfg.model_dump(mode="json"), cache=cache, return_state=True)
        result = state.result()
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

        self.bars = Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), transient=False)
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


def _prefect_env() -> None:
    """Settings that make a local, serverless run work on a slow machine."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "vta_pipeline")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _temporary_prefect_server() -> None:
    """Without PREFECT_API_URL, Prefect runs the flow against a temporary API server, a
    child process it stops at exit. A run killed with SIGKILL has no exit, and that server
    (and its SQLite database lock) would stay; start it here, watched by a reaper that stops
    it when this process dies."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    from vta_pipeline.watchdog import spawn_reaper

    server = SubprocessASGIServer()  # the instance Prefect's client will use (one per process)
    server.start()
    if server.server_process is not None:
        spawn_reaper([server.server_process.pid])


# ---- tasks ---------------------------------------------------------------------------------------
@app.command("tasks")
def tasks_cmd(
    config: ConfigOpt = None,
    model: ModelOpt = None,
    source: SourceOpt = None,
    onnx_path: OnnxOpt = None,
    input_shape: ShapeOpt = None,
    target: TargetOpt = None,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    task_filter: Annotated[Optional[str], typer.Option(help="auto | all | conv2d | packed")] = None,
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
):
    """Fetch (quantize, pack) the model and print its tuning tasks, cached in the store like a run's.
    The workload columns are the VTA recipe's; packed tasks count batch = N/b*b, in_filter = C/c*c."""

    def go():
        from vta_pipeline import steps
        from vta_pipeline.extract import WORKLOAD_FIELDS, load_tasks, select_tasks
        from vta_pipeline.store import ArtifactStore
        from vta_pipeline.targets import resolve_target

        cfg = _config(config, {
            **_model_overrides(model, source, onnx_path, input_shape), "target": target,
            "store": store and str(store), "tune.task_filter": task_filter,
            **_int8_overrides(vta, vta_config, quantize, global_scale, skip_conv_layers, calibrate_mode,
                              calibration_data, pack, pack_start, pack_stop, pack_start_idx, pack_stop_idx,
                              bfactor, cfactor, pack_layout),
        })
        tgt = resolve_target(cfg.target)
        st = ArtifactStore(cfg.store)
        fetched = steps.prepare_model(st, cfg)
        extracted = steps.extract_step(st, fetched, tgt)
        tasks = select_tasks(load_tasks(extracted.path), cfg.tune.task_filter,
                             packed_float=cfg.pack.enabled and not cfg.quantize.enabled)
        if as_json:
            out = []
            for t in tasks:
                d = {"name": t.name, "weight": t.weight, "op": t.op, "flops": t.flops}
                if t.workload is not None:
                    d["workload"] = t.workload
                out.append(d)
            typer.echo(json.dumps(out, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"tuning tasks of {cfg.model.display_name} for {tgt.name}")
        for h in ("#", "task", "weight", "MFLOP", *WORKLOAD_FIELDS):
            table.add_column(h)
        for t in tasks:
            wl = [str(v) for v in t.workload] if t.workload else ["-"] * len(WORKLOAD_FIELDS)
            table.add_row(str(t.index), t.name, str(t.weight), f"{t.flops / 1e6:.1f}", *wl)
        Console(width=None if sys.stdout.isatty() else 200).print(table)

    _guard(go)


@app.command("pack-points")
def pack_points_cmd(
    model: Annotated[Optional[str], typer.Argument(help="Model name (default: built-in tinynet).")] = None,
    config: ConfigOpt = None,
    source: SourceOpt = None,
    onnx_path: OnnxOpt = None,
    input_shape: ShapeOpt = None,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    vta_config: VtaConfigOpt = None,
    quantize: QuantizeOpt = None,
    global_scale: GlobalScaleOpt = None,
    skip_conv_layers: SkipConvOpt = None,
    pack_start: PackStartOpt = None,
    pack_stop: PackStopOpt = None,
    pack_start_idx: PackStartIdxOpt = None,
    pack_stop_idx: PackStopIdxOpt = None,
    bfactor: BfactorOpt = None,
    cfactor: CfactorOpt = None,
):
    """List the network's operators with their occurrence indices, mark the start/stop that the
    pack options select (default: first nn.max_pool2d, then the first global average pool), and
    say whether that region packs, or which operator stops it."""

    def go():
        from vta_pipeline import pack as pack_mod
        from vta_pipeline import steps
        from vta_pipeline.store import ArtifactStore

        cfg = _config(config, {
            **_model_overrides(model, source, onnx_path, input_shape), "store": store and str(store),
            **_int8_overrides(False, vta_config, quantize, global_scale, skip_conv_layers, None, None, None,
                              pack_start, pack_stop, pack_start_idx, pack_stop_idx, bfactor, cfactor),
        })
        st = ArtifactStore(cfg.store)
        art = steps.prepare_model(st, cfg, upto="quantize")
        res = pack_mod.pack_points(art.path, cfg.pack, cfg.vta)
        if as_json:
            typer.echo(json.dumps(res, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"operators of {cfg.model.display_name} (blocks b={res['bfactor']}, c={res['cfactor']})")
        for h in ("#", "operator", "occurrence", "inputs", "output", ""):
            table.add_column(h)
        for r in res["operators"]:
            mark = ""
            if r["index"] == res["start"]:
                mark = "START (packed after)"
            elif r["index"] == res["stop"]:
                mark = "STOP (unpacked before)"
            elif res["start"] is not None and res["start"] < r["index"] < (res["stop"] or 10**9):
                mark = "packed" if res["packable"] else "in region"
            name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
            ins = ", ".join("x".join(map(str, s)) if s else "?" for s in r["inputs"])
            out = "x".join(map(str, r["output"])) if r["output"] else "?"
            table.add_row(str(r["index"]), name, str(r["occurrence"]), ins, out, mark)
        console = Console(width=None if sys.stdout.isatty() else 150)
        console.print(table)
        if res["packable"]:
            console.print(f"region #{res['start']} -> #{res['stop']} packs: {res['packed_ops']} operators packed")
        else:
            console.print(f"[red]not packable:[/red] {res['error']}")

    _guard(go)


@app.command()
def models(source: Annotated[str, typer.Option(help="builtin | torchvision | gluon")] = "builtin"):
    """List the model names a source knows."""
    from vta_pipeline.importers import list_models

    if source not in ("builtin", "torchvision", "gluon"):
        _fail(f"--source {source!r}: use builtin, torchvision or gluon")
    typer.echo("\n".join(list_models(source)))


@app.command()
def targets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False):
    """List the target presets: TVM target and host JSON, RPC key, cross compiler, layout."""
    from vta_pipeline.targets import PRESETS

    presets = [make(None) for make in PRESETS.values()]
    if as_json:
        typer.echo(json.dumps([{k: v for k, v in dataclasses.asdict(p).items()} for p in presets], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="target presets (--target NAME; cuda:sm_XX picks the GPU architecture)", show_lines=True)
    for h in ("preset", "key", "target", "host", "cross compiler", "layout", "measure"):
        table.add_column(h, overflow="fold")
    for p in presets:
        cc = f"{p.cross_compiler} ({p.cross_package})" if p.cross_compiler else "native"
        table.add_row(p.name, p.key, json.dumps(p.target), json.dumps(p.host) if p.host else "-", cc, p.layout,
                      json.dumps(p.measure) if p.measure else "defaults")
    Console(width=None if sys.stdout.isatty() else 220).print(table)


@app.command("build")
def build_cmd(
    config: ConfigOpt = None,
    model: ModelOpt = None,
    source: SourceOpt = None,
    onnx_path: OnnxOpt = None,
    input_shape: ShapeOpt = None,
    target: TargetOpt = None,
    store: StoreOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Copy the library here too.")] = None,
    vta: VtaOpt = False,
    vta_config: VtaConfigOpt = None,
    quantize: QuantizeOpt = None,
    calibrate_mode: CalibModeOpt = None,
    pack: PackOpt = None,
):
    """Build the network untuned for a target, without a board (cross-compiled for the ARM
    presets), cached in the store like a run's steps; prints the library's path. Tuned
    builds come from `run`, which needs the boards."""

    def go():
        import shutil

        from vta_pipeline import steps
        from vta_pipeline.store import ArtifactStore
        from vta_pipeline.targets import resolve_target

        cfg = _config(config, {
            **_model_overrides(model, source, onnx_path, input_shape), "target": target,
            "store": store and str(store),
            **_int8_overrides(vta, vta_config, quantize, None, None, calibrate_mode, None, pack,
                              None, None, None, None, None, None),
        })
        tgt = resolve_target(cfg.target)
        steps.check_target(cfg, tgt)
        st = ArtifactStore(cfg.store)
        extracted = steps.extract_step(st, steps.prepare_model(st, cfg), tgt)
        built = steps.build_step(st, extracted, None, tgt)
        lib = built.file("model.so")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, out)
            lib = out
        typer.echo(f"{cfg.model.name} for {tgt.name} ({json.dumps(tgt.full_json)}): {lib} "
                   f"({lib.stat().st_size / 1e6:.1f} MB{', ' + tgt.cross_compiler if tgt.cross_compiler else ''})")

    _guard(go)


# ---- board ---------------------------------------------------------------------------------------
@board_app.command("up")
def board_up(
    key: Annotated[str, typer.Option(help="Key the servers register under.")] = "host",
    servers: Annotated[int, typer.Option(
        help="Number of rpc_server processes (more than 1 time candidates against each other on these cores).")] = 1,
    threads: Annotated[Optional[int], typer.Option(
        help="Threads each server runs kernels with (TVM_NUM_THREADS; default: this machine's logical CPUs).")] = None,
    port: Annotated[int, typer.Option(help="Tracker port.")] = 9190,
    host: Annotated[str, typer.Option(help="Bind address (keep 127.0.0.1 unless boards are remote).")] = "127.0.0.1",
):
    """Start a tracker and N servers in the background; `board down` stops them."""
    from vta_pipeline.boards import LocalBoard

    if BOARD_STATE.exists():
        _fail(f"a local board is already recorded in {BOARD_STATE}: run `vta-pipeline board down` first")
    b = _guard(lambda: LocalBoard(key=key, num_servers=servers, host=host, port=port, state_file=BOARD_STATE,
                                  detached=True, threads=threads).start())
    typer.echo(f"tracker {b.tracker}, {servers} server(s) under key {key!r}, {b.threads} thread(s) each; "
               f"use --tracker {b.tracker} --key {key}")


@board_app.command("status")
def board_status(tracker: TrackerOpt = None):
    """Show the tracker's servers and queue (like tvm.exec.query_rpc_tracker)."""
    from vta_pipeline.boards import format_summary, tracker_summary
    from vta_pipeline.config import parse_hostport

    if tracker is None:
        if not BOARD_STATE.exists():
            _fail("no local board is running and no --tracker was given")
        tracker = json.loads(BOARD_STATE.read_text())["tracker"]
    try:
        addr = parse_hostport(tracker)
    except ValueError as e:
        _fail(str(e))
    typer.echo(_guard(lambda: format_summary(tracker_summary(*addr))))


@board_app.command("down")
def board_down():
    """Stop the local board started by `board up`."""
    from vta_pipeline.boards import stop_from_state

    state = stop_from_state(BOARD_STATE)
    typer.echo("no local board was running" if state is None else f"stopped the board at {state['tracker']}")


# ---- report --------------------------------------------------------------------------------------
@app.command("report")
def report_cmd(store: StoreOpt = None, last: Annotated[int, typer.Option(help="How many runs.")] = 1):
    """Print the result tables of the last runs recorded in the store."""
    from vta_pipeline.report import load_results, render
    from vta_pipeline.store import ArtifactStore

    results = load_results(ArtifactStore(store or Path("vta-store")))
    if not results:
        _fail(f"no finished runs in {store or 'vta-store'}: run `vta-pipeline run` first")
    for r in results[-last:]:
        typer.echo(render(r))


# ---- history -------------------------------------------------------------------------------------
history_app = typer.Typer(no_args_is_help=True,
                          help="Questions to the store's Parquet history of measurements and evaluations.")
app.add_typer(history_app, name="history")
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON rows instead of a table.")]


def _history_store(store: Path | None) -> Path:
    from vta_pipeline.history import history_dir

    root = store or Path("vta-store")
    if not history_dir(root).exists():
        _fail(f"no history in {root}: runs append to {history_dir(root)} when they finish "
              f"(run `vta-pipeline run` or the nightly flow first, or pass --store)")
    return root


def _print_rows(rows: list[dict], title: str, as_json: bool, empty: str) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        _fail(empty)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for h in rows[0]:
        t.add_column(h, justify="right" if isinstance(rows[0][h], (int, float)) else "left")
    for r in rows:
        t.add_row(*("-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console(width=160).print(t)


@history_app.command("nights")
def history_nights(store: StoreOpt = None, model: ModelOpt = None, target: TargetOpt = None, as_json: JsonOpt = False):
    """Best (correct) tuned latency per model / target / board key, night by night."""
    from vta_pipeline import history

    rows = history.best_per_night(_history_store(store), model, target)
    _print_rows(rows, "best tuned latency per night (ms)", as_json, "no tuned evaluations match")


@history_app.command("trend")
def history_trend(model: Annotated[str, typer.Argument(help="Model name, as in the run's result.")],
                  store: StoreOpt = None, target: TargetOpt = None, as_json: JsonOpt = False):
    """One model night by night: untuned and tuned latency, speed-up, trials."""
    from vta_pipeline import history

    rows = history.trend(_history_store(store), model, target)
    _print_rows(rows, f"{model}: latency per night (ms)", as_json,
                f"no evaluations of model {model!r}: see `vta-pipeline history nights` for the models recorded")


@history_app.command("workloads")
def history_workloads(store: StoreOpt = None, target: TargetOpt = None, as_json: JsonOpt = False):
    """The best measurement of every workload across all nights."""
    from vta_pipeline import history

    rows = history.best_per_workload(_history_store(store), target)
    _print_rows(rows, "best record per workload (ms)", as_json, "no valid measurements recorded")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
