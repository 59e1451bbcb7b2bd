"""Tuned TVM side by side with PyTorch and ONNX Runtime, in one run, on this CPU.

Same machine, same thread count, batch 1, random weights (fixed seed). For each model:
PyTorch eager fp32 (inference mode), ONNX Runtime fp32 (CPU provider), ONNX Runtime int8
(static QDQ, uint8 activations x int8 weights per channel, calibrated on random data; its
quantizer runs in its own pinned environment, see vta_pipeline/tools/ort_quantize_requirements.txt); and TVM
built by our pipeline (`vta-pipeline run`, one network after the other in this process as
the nightly flow tunes them, on the local RPC board on this CPU): untuned,
tuned fp32, tuned int8 in the x86 dot-product layout (`--pack-layout x86`) and in VTA's
layout, each with the stated trial budget per task and the board's reference check. The
table gives median and p90 latency, the ratio to PyTorch eager, achieved GFLOP/s (the
model's FLOPs as TVM counts them, over the median) and its share of this machine's peak,
measured in the same run (a 2048^3 fp32 GEMM; the faster of torch._int_mm and ONNX
Runtime's MatMulInteger for int8). Then where the tuned time goes (task latency x weight),
the goals of issue 6 checked against the numbers, and the tuning cost: trials per minute
of the pipeline vs a bare MetaSchedule `tune_tasks` loop over the same tasks and budget
(the orchestration overhead), and the pipeline's throughput with one vs two local boards.

    uv run python -m benchmarks.compare                          # benchmarks/README.md's table (budgets there)
    uv run python -m benchmarks.compare --models resnet18 --trials 8,32 --skip-overhead   # a curve

`--trials 8,32` tunes to 8 trials per task, builds and measures, then tunes on to 32 (from
the same records) and measures again. Every run also gives the latency-vs-trials curve up to
its budget, estimated from the tasks' best-so-far curves and anchored at the measured
latency, with the budget at which it meets ONNX Runtime (or an extrapolation). Results:
benchmarks/results/compare.json, compare.md and latency_vs_trials.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.curves import curve_plot, curve_tables, estimated_curve, in_turn_points, time_split
from benchmarks.lib.models import MODELS, STEM, STEM_INT8, WIDE_BLOCK, fp32_block, set_block
from benchmarks.lib.peaks import peaks
from benchmarks.lib.pipeline import PREFECT_ENV, evaluation_stats, model_gflop, pipeline_run, side_by_side, unsettled
from benchmarks.lib.references import References, frameworks, references
from vta_pipeline.boards import machine

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results"

BARE = "bare tune_tasks, 2 boards"
BARE_OUR_POOLS = "bare tune_tasks, 2 boards, our pools and population"
ALLOCATION = {
    "flat": "each task that many",
    "latency": "on average: half each, the rest by each task's share of the network's latency",
}
INT8_LAYOUTS = {"x86": "TVM tuned int8, x86 dot-product layout", "vta": "TVM tuned int8, VTA-packed layout"}
# fp32 rows: the network as imported (NCHW, MetaSchedule's generic space), and packed to
# NCHW{c}c where graph pack packs it (NeoCPU's space for its convs, vta_pipeline/packed_conv_space.py).
FP32_LAYOUTS = {"nchw": "TVM tuned fp32", "packed": "TVM tuned fp32, packed NCHW{block}c"}


def goals(rows: list[dict[str, Any]], overhead: dict[str, Any]) -> list[str]:
    """The issue's goals, checked against this run's numbers (the best budget of each engine)."""

    def best(model: str, prefix: str) -> dict[str, Any] | None:
        """The fastest correct row of the model whose engine starts with `prefix`."""
        ok = [
            r for r in rows if r["model"] == model and r["engine"].startswith(prefix) and r.get("correct") is not False
        ]
        return min(ok, key=lambda r: r["median_ms"], default=None)

    out = ["Goals:", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        fp, i8 = best(model, "TVM tuned fp32"), best(model, INT8_LAYOUTS["x86"])
        ort_fp, ort_i8 = best(model, References.FP32), best(model, "ONNX Runtime int8")
        for what, ours, theirs, factor in (
            ("tuned fp32 faster than ONNX Runtime fp32", fp, ort_fp, 1.0),
            ("tuned int8 faster than ONNX Runtime int8 U8S8", i8, ort_i8, 1.0),
            ("tuned int8 at least 2.5x faster than tuned fp32", i8, fp, 2.5),
        ):
            if ours is None or theirs is None:
                continue
            a, b = ours["median_ms"], theirs["median_ms"]
            line = (
                f"- {model}: {what}: {'MET' if a * factor < b else 'not met'} "
                f"({a:.2f} ms vs {b:.2f} ms{f' / {factor}' if factor != 1 else ''})"
            )
            after = ours.get("timed_right_after", {}).get(theirs["engine"])
            if after is not None:  # results before side_by_side: the reference timed right after the row
                line += (
                    f"; against the reference timed right after that row: {'MET' if a < after else 'not met'} "
                    f"({a:.2f} ms vs {after:.2f} ms)"
                )
            pair = ours.get("side_by_side")
            if pair and pair["engine"] == theirs["engine"]:
                o, t = pair["ours_ms"], pair["reference_ms"]
                wait = f", each turn {pair['settle_s']:g} s after the other's" if pair.get("settle_s") else ""
                line += (
                    f"; **side by side** (timed in turn, {pair['rounds']} rounds{wait}): "
                    f"{'MET' if o * factor < t else 'not met'} ({o:.2f} ms vs {t:.2f} ms)"
                )
            out.append(line)
    ours = overhead.get("pipeline, 2 board(s)")
    for label in (BARE, BARE_OUR_POOLS):
        bare = overhead.get(label)
        if bare and ours:
            cost = 100 * (bare["trials_per_min"] / ours["trials_per_min"] - 1)
            out.append(
                f"- pipeline overhead under 5% of tuning time, vs {label}: {'MET' if cost < 5 else 'not met'} "
                f"({cost:+.1f}%: {ours['trials_per_min']:.1f} vs {bare['trials_per_min']:.1f} trials/min)"
            )
    return out


# ---- orchestration overhead ---------------------------------------------------------------------
def bare_loop(
    store: Path, trials: int, threads: int, tracker: str, key: str, our_pools: bool = False
) -> dict[str, float]:
    """The same tasks and budget through a plain MetaSchedule tune_tasks call: no store, no
    Prefect, no records of our own, on the same two-server board as the pipeline's run.

    `our_pools`: with the pipeline's builder/runner pools, intrinsic-registry import and
    search population and generations (sized to the round) instead of MetaSchedule's stock
    ones, so that the difference to the pipeline is its orchestration alone (Prefect, the
    store, one tune_tasks per task, the default-lowering measurement)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.boards import BoardSpec, pools
    from vta_pipeline.boards.builder import make_builder
    from vta_pipeline.config import MeasureConfig, TuneConfig, parse_hostport
    from vta_pipeline.extract import load_tasks, select_tasks
    from vta_pipeline.store.artifacts import ArtifactStore
    from vta_pipeline.targets import resolve_target
    from vta_pipeline.tir import intrin_registry
    from vta_pipeline.tune import genetic_iters, population_size

    st = ArtifactStore(store)
    extracted = st.find("extract")[0]
    tasks = select_tasks(load_tasks(extracted.path), "conv2d")
    target = resolve_target("host").tvm_target()
    os.environ["TVM_NUM_THREADS"] = str(threads)
    host, port = parse_hostport(tracker)
    with tempfile.TemporaryDirectory() as work:
        # From the first TuneContext on, like the pipeline's span (first tune step started to last
        # computed): in a fresh process (the stock loop) the first one imports MetaSchedule's
        # intrinsic registry (~30 s here).
        t0 = time.time()
        if our_pools:
            intrin_registry.load()
        ctxs = [
            ms.TuneContext(
                mod=tvm.ir.load_json((extracted.path / t.file).read_text()),
                target=target,
                space_generator="post-order-apply",
                search_strategy=ms.search_strategy.EvolutionarySearch(
                    population_size=population_size(min(trials, 8)), genetic_num_iters=genetic_iters(min(trials, 8))
                )
                if our_pools
                else "evolutionary",
                task_name=t.name,
                num_threads="physical",
            )
            for t in tasks
        ]
        with contextlib.ExitStack() as stack:
            if our_pools:  # the pipeline's own settings, so that in one process it leases the same pools
                builder = stack.enter_context(pools.builder(TuneConfig().builder_timeout_s))
                runner = stack.enter_context(pools.runner(BoardSpec(host, port, key, 2), MeasureConfig()))
            else:
                builder = make_builder(600)
                runner = ms.runner.RPCRunner(
                    rpc_config=ms.runner.RPCConfig(
                        tracker_host=host, tracker_port=port, tracker_key=key, session_timeout_sec=60
                    ),
                    evaluator_config=ms.runner.EvaluatorConfig(number=5, repeat=1),
                    max_workers=2,
                )
            db = ms.tune_tasks(
                tasks=ctxs,
                task_weights=[1.0] * len(ctxs),
                work_dir=work,
                max_trials_global=trials * len(ctxs),
                num_trials_per_iter=min(trials, 8),
                builder=builder,
                runner=runner,
                database=ms.database.JSONDatabase(work_dir=work),
                cost_model=ms.cost_model.CostModel.create("xgb", num_tuning_cores=1),
            )
        secs = time.time() - t0
        valid = sum(1 for r in db.get_all_tuning_records() if r.run_secs and min(float(s) for s in r.run_secs) < 1e9)
    return {"tune_s": secs, "trials": valid}


# ---- report -------------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]], peak: dict[str, float]) -> str:
    head = ["model", "engine", "median ms", "p90 ms", "vs PyTorch", "GFLOP/s", "% of peak", "output"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        int8 = "int8" in r["engine"]
        p = peak.get("int8_gops") if int8 else peak["fp32_gflops"]
        gf = r["gflop"] / (r["median_ms"] / 1e3)
        out.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    r["engine"],
                    f"{r['median_ms']:.2f}",
                    f"{r['p90_ms']:.2f}",
                    f"{r['eager_ms'] / r['median_ms']:.2f}x",
                    f"{gf:.1f}",
                    f"{100 * gf / p:.1f}%" if p else "-",
                    {True: "checked", False: "WRONG", None: "-"}[r.get("correct")],
                ]
            )
            + " |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--int8-models", default="resnet18,mobilenet_v2", help="models also tuned int8 ('' = none)")
    ap.add_argument("--int8-layouts", default="x86,vta", help="int8 pack layouts to tune (x86, vta)")
    ap.add_argument(
        "--fp32-layouts",
        default="packed",
        help="fp32 layouts to tune: packed (--pack: NCHW16c, mobilenet_v2 NCHW8c; the packed-conv "
        "space), nchw (as imported)",
    )
    ap.add_argument(
        "--trials",
        default="2",
        help="trials per tuning task; a list (4,16,64) tunes on from one budget to the next and "
        "measures each: the latency-vs-trials curve",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=30, help="timed runs per framework (TVM: evaluation repeats)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", type=Path, default=Path(tempfile.gettempdir()) / "vta-compare-store")
    ap.add_argument("--overhead-model", default="tinynet", help="built-in model for the tuning-cost runs")
    ap.add_argument(
        "--overhead-trials",
        type=int,
        default=None,
        help="trials per task of the tuning-cost runs (default: the first --trials budget)",
    )
    ap.add_argument(
        "--allocation",
        default="latency",
        choices=["flat", "latency"],
        help="how each TVM row's budget is spread over its tasks (the pipeline's --allocation)",
    )
    ap.add_argument(
        "--records-library",
        default="off",
        help="where workloads the store never measured start (the pipeline's --records-library): off "
        "(default: the curve from a cold start), builtin (the records shipped for this CPU class), "
        "or a directory",
    )
    ap.add_argument(
        "--block",
        action="append",
        default=[],
        metavar="MODEL=C",
        help="the model's channel block in both its fp32 and int8 packs, channels it does not divide "
        "padded (--pad-channels); default: MODELS' --cfactor, and WIDE_BLOCK on AVX-512 "
        "(mobilenet_v2=16)",
    )
    ap.add_argument(
        "--int8-dense",
        default="int8",
        choices=["int8", "float"],
        help="the int8 rows' classifier: int8 (--quantize-dense, as ORT's QGemm) or float (relay's default)",
    )
    ap.add_argument(
        "--int8-activations",
        default="int8",
        choices=["int8", "int32"],
        help="the x86 int8 rows' activations between layers: int8 (--int8-activations: residual adds "
        "read int8, as ORT's QLinearAdd) or int32 (relay's default)",
    )
    ap.add_argument(
        "--stem",
        default="packed",
        choices=["packed", "plain"],
        help="the packed rows' stem conv (fp32 packed, int8 x86): packed, its image one channel block "
        "(graph pack's --pack-stem; int8 rows quantize it and run it on the dot product), or plain "
        "(NCHW; int8 rows keep it float, relay's skip_conv_layers=[0])",
    )
    ap.add_argument(
        "--depthwise-dot",
        default="auto",
        choices=["auto", "on", "off"],
        help="the x86 int8 rows' depthwise convs on the dot product (graph pack's --depthwise-dot: "
        "vpermb + vpdpbusd); auto: on where the CPU has AVX512-VNNI and AVX512-VBMI",
    )
    ap.add_argument(
        "--winograd",
        default="off",
        choices=["on", "off"],
        help="the fp32 packed rows' 3x3 stride-1 convs (output at least 14 wide) as Winograd F(4x4, 3x3) "
        "(the pipeline's --winograd)",
    )
    ap.add_argument(
        "--winograd-small-below",
        type=int,
        default=None,
        help="with --winograd on: convs narrower than this as F(2x2, 3x3) (the pipeline's "
        "--winograd-small-below; default: the pipeline's, 28)",
    )
    ap.add_argument(
        "--retime-caches",
        default="warm",
        choices=["warm", "flushed", "auto"],
        help="how each task's best records are re-timed after its search (the pipeline's --retime-caches)",
    )
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument(
        "--stock-bare",
        action="store_true",
        help="also time a bare loop with MetaSchedule's stock builder, runner and search (4 min "
        "here: what the pipeline's pools save, not its orchestration cost)",
    )
    ap.add_argument("--skip-tvm", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT, help="where compare.json and compare.md go")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the store, and --out's compare.json if there; measure only what is not in it "
        "yet (a new --out: every row measured again, the tuning reused from the store)",
    )
    args = ap.parse_args()
    if "avx512f" in machine.cpu()["isa"]:
        for name, block in WIDE_BLOCK.items():
            set_block(name, str(block))
    for spec in args.block:
        set_block(*spec.split("="))
    # `kill` / a CI timeout: unwind, so that the Prefect server and the boards (children) stop too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    if args.depthwise_dot == "auto":
        args.depthwise_dot = "on" if {"avx512_vnni", "avx512vbmi"} <= set(machine.cpu()["isa"]) else "off"

    t_start = time.time()
    meta = {
        "commit": machine.source_commit(),
        "threads": args.threads,
        "trials_per_task": args.trials,
        "runs": args.runs,
        "allocation": args.allocation,
        "records_library": args.records_library,
        "retime_caches": args.retime_caches,
        "blocks": {m: fp32_block(m) for m in MODELS},
        "int8_dense": args.int8_dense,
        "stem": args.stem,
        "int8_activations": args.int8_activations,
        "depthwise_dot": args.depthwise_dot,
        "winograd": args.winograd,
        "winograd_small_below": args.winograd_small_below,
        **machine.cpu(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    previous = args.out / "compare.json"
    if args.resume and previous.exists():
        res: dict[str, Any] = json.loads(previous.read_text())
        res["meta"].setdefault("resumed_at", []).append(meta["commit"])
        res["meta"]["trials_per_task"] = args.trials  # a resumed curve's budgets
        in_turn_points(res)  # before this run's budgets add theirs: a run from before 8725573 has none
        t_start -= res["meta"].get("seconds", 0)
    else:
        if not args.resume:  # a resumed run into a new --out keeps the store's records
            shutil.rmtree(args.store, ignore_errors=True)
        res = {
            "meta": meta,
            "peak": peaks(args.threads),
            "rows": [],
            "pipeline_runs": {},
            "overhead": {},
            "where_the_time_goes": {},
        }
    peak, rows = res["peak"], res["rows"]
    print(f"peak: fp32 {peak['fp32_gflops']:.0f} GFLOP/s, int8 {peak.get('int8_gops') or 0:.0f} GOP/s", flush=True)
    models = [m for m in args.models.split(",") if m]
    budgets = [int(t) for t in args.trials.split(",")]
    layouts = [x for x in args.int8_layouts.split(",") if x]
    info: dict[str, dict[str, float]] = {}

    def add(model: str, engine: str, s: dict[str, Any]) -> None:
        rows.append(
            {"model": model, "engine": engine, "gflop": info[model]["gflop"], "eager_ms": info[model]["eager_ms"], **s}
        )
        print(f"{model:<14} {engine:<52} {s['median_ms']:8.2f} ms", flush=True)
        write(res, time.time() - t_start, args.out)  # a stopped run keeps what it measured

    # The frameworks first (minutes), then TVM, most telling first: fp32 and the x86 int8
    # layout for every model, the tuning cost, and VTA's layout last.
    with tempfile.TemporaryDirectory() as work:
        for name in models:
            done = [r for r in rows if r["model"] == name]
            if done:  # resumed
                info[name] = {"gflop": done[0]["gflop"], "eager_ms": done[0]["eager_ms"]}
                continue
            info[name] = {"gflop": model_gflop(args.store / "pipeline", name, "torchvision")}
            base = frameworks(name, MODELS[name]["shape"], args.threads, args.runs, Path(work), args.seed)
            info[name]["eager_ms"] = base["PyTorch eager fp32"]["median_ms"]
            for engine, s in base.items():
                add(name, engine, s)
    if args.skip_tvm:
        return
    int8_models = [m for m in models if m in args.int8_models.split(",")]
    fp32_layouts = [x for x in args.fp32_layouts.split(",") if x]
    first = (
        [(m, "fp32") for m in models if "nchw" in fp32_layouts]
        + [(m, "fp32-packed") for m in models if "packed" in fp32_layouts]
        + [(m, "x86") for m in int8_models if "x86" in layouts]
    )
    # One board (tracker + 1 rpc server, TVM_NUM_THREADS=threads) for every TVM row: started
    # once, as a rack stays up between runs, instead of once per pipeline run (26 s here). One
    # server: two on one machine time candidates against each other on the same cores.
    import importlib.util

    from vta_pipeline.boards import LocalBoard

    spec = importlib.util.spec_from_file_location("prefect_server", ROOT / "tests" / "prefect_server.py")
    prefect_server = importlib.util.module_from_spec(spec)
    sys.modules["prefect_server"] = prefect_server
    spec.loader.exec_module(prefect_server)  # the tests' real-server helper (tests/ is no package)
    PrefectServer = prefect_server.PrefectServer

    with PrefectServer(services=False) as server:
        PREFECT_ENV.update(server.env())
        os.environ.update(PREFECT_ENV)  # the rows run in this process (before it first imports prefect)
        with LocalBoard(key="bench", num_servers=1, threads=args.threads) as board:
            for name, kind in first:
                tvm_runs(args, res, name, kind, budgets, add, board)
            if not args.skip_overhead and not res["overhead"]:
                overhead_runs(args, res, board, args.overhead_trials or budgets[0])
                write(res, time.time() - t_start, args.out)
            for name in int8_models if "vta" in layouts else []:
                tvm_runs(args, res, name, "vta", budgets, add, board)
        if "prefect" in sys.modules:  # send the runs' last log lines while the server is still up
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)
    print(write(res, time.time() - t_start, args.out))


def tvm_runs(args, res: dict[str, Any], name: str, kind: str, budgets: list[int], add, board) -> None:
    """The pipeline on one model: fp32 (conv2d tasks), or int8 in a pack layout (packed tasks).

    Every model and variant is tuned into one store, as a user tuning several networks for
    one board keeps one: a workload two of them share (resnet18's float stem conv, in fp32
    and in int8) is tuned once, and the cost model learns from all of them. Each task still
    gets exactly the stated number of its own trials."""
    dense = [] if kind.startswith("fp32") or args.int8_dense == "float" else ["--quantize-dense"]
    stem = [] if args.stem == "plain" else STEM if kind == "fp32-packed" else STEM_INT8 if kind == "x86" else []
    acts = ["--int8-activations"] if kind == "x86" and args.int8_activations == "int8" else []
    dwdot = ["--depthwise-dot"] if kind == "x86" and args.depthwise_dot == "on" else []
    wino = ["--winograd"] if kind == "fp32-packed" and args.winograd == "on" else []
    if wino and args.winograd_small_below is not None:
        wino += ["--winograd-small-below", str(args.winograd_small_below)]
    extra = [
        "--records-library",
        args.records_library,
        "--retime-caches",
        args.retime_caches,
        *(
            []
            if kind == "fp32"
            else ["--pack", *MODELS[name]["pack"], *stem, *wino]
            if kind == "fp32-packed"
            else ["--vta", "--pack-layout", kind, *MODELS[name]["int8"], *dense, *stem, *acts, *dwdot]
        ),
    ]
    label = {"fp32": FP32_LAYOUTS["nchw"], "fp32-packed": FP32_LAYOUTS["packed"].format(block=fp32_block(name))}.get(
        kind
    ) or INT8_LAYOUTS.get(kind)
    key = {"fp32": "fp32", "fp32-packed": "fp32 packed"}.get(kind, f"int8 {kind}")
    # the int8 classifier, the int8 stem and int8 activations: rows (and curves) of their own
    kind_key = (
        kind
        + "+dense" * bool(dense)
        + "+stem" * bool(stem)
        + "+int8act" * bool(acts)
        + "+dwdot" * bool(dwdot)
        + "+winograd" * bool(wino)
    )
    if dense:
        label, key = f"{label}, int8 classifier", f"{key} int8-dense"
    if stem:
        label, key = f"{label}, {'int8 ' * (kind == 'x86')}stem packed", f"{key} stem-packed"
    if acts:
        label, key = f"{label}, int8 activations", f"{key} int8-act"
    if dwdot:
        label, key = f"{label}, depthwise on the dot product", f"{key} dw-dot"
    if wino:
        label, key = f"{label}, Winograd 3x3", f"{key} winograd"
    for j, trials in enumerate(budgets):  # later budgets continue from the earlier records
        if f"{name}/{kind_key}/{trials}" in res["pipeline_runs"]:  # resumed
            continue
        # fp32 NCHW: its conv2d tasks (as before); packed fp32: every task (auto), since all
        # of it runs on the CPU and its layout transforms are tasks too; int8: auto.
        r = pipeline_run(
            name,
            "torchvision",
            args.store / "pipeline",
            trials,
            args.threads,
            args.runs,
            extra,
            task_filter="conv2d" if kind == "fp32" else "auto",
            board=board,
            allocation=args.allocation,
            in_process=True,
        )
        res["pipeline_runs"][f"{name}/{kind_key}/{trials}"] = {k: v for k, v in r.items() if k != "result"}
        res["where_the_time_goes"][f"{name} {key}"] = time_split(r["result"])
        if (
            key.startswith("fp32")
            and j == 0
            and not any(x["model"] == name and x["engine"] == "TVM untuned" for x in res["rows"])
        ):
            add(name, "TVM untuned", evaluation_stats(r["result"]["untuned"]))
        tuned = evaluation_stats(r["result"]["tuned"])
        ref_engine = References.FP32 if key.startswith("fp32") else References.INT8
        tuned["side_by_side"] = side_by_side(
            args.store / "pipeline",
            r["result"],
            board,
            references(name, args.threads, args.seed),
            ref_engine,
            args.runs,
        )
        curve = res.setdefault("curves", {}).setdefault(f"{name} {key}", {"measured": [], "estimated": []})
        curve["measured"].append([trials, tuned["median_ms"]])
        sbs = tuned["side_by_side"]
        curve.setdefault("in_turn", []).append([trials, sbs["ours_ms"], sbs["reference_ms"]])
        # the tuning wall time behind each measured point: the budgets' tuning phases added up
        so_far = (curve.get("tuning_s") or [[0, 0.0]])[-1][1] + (r.get("tune_s") or 0.0)
        curve.setdefault("tuning_s", []).append([trials, so_far])
        curve["estimated"] = estimated_curve(r["result"], tuned["median_ms"], flat=args.allocation == "flat")
        avg = " on average" if args.allocation == "latency" else ""
        row = f"{label}{winograd_taken(r['result'])}" if wino else label
        lib = library_note(r["result"])
        if lib:  # a point that started from the records library stands on the trials behind it too
            curve.setdefault("library", []).append([trials, lib])
            avg += f" + records library: {lib['trials_behind']:.0f} trials/task from {', '.join(lib['commits'])}"
        add(name, f"{row} ({trials} trials/task{avg})", tuned)


def winograd_taken(result: dict[str, Any]) -> str:
    """How many convs a `--winograd` run computed as Winograd, for its row's label: the flag
    asks, the pack pass decides (mobilenet_v2's 3x3 convs are depthwise or strided: none)."""
    n = ((result.get("transforms") or {}).get("pack") or {}).get("winograd_convs")
    return "" if n is None else f" on {n} convs" if n else " on no conv"


def library_note(result: dict[str, Any]) -> dict[str, Any] | None:
    """Which of a run's tasks started from the records library, and the trials behind them
    (measured where the library was built: a curve built over sessions counts them)."""
    seeded = [t["library"] for t in result["tasks"] if t.get("library")]
    if not seeded:
        return None
    return {
        "tasks_seeded": len(seeded),
        "tasks": len(result["tasks"]),
        "trials_behind": sum(x.get("measured") or 0 for x in seeded) / len(result["tasks"]),
        "commits": sorted({str(x.get("commit")) for x in seeded}),
        "cpus": sorted({str(x.get("cpu")) for x in seeded}),
    }


def overhead_runs(args, res: dict[str, Any], one: Any, trials: int) -> None:
    """Tuning cost: the pipeline with one and two local boards, and a bare tune_tasks loop on
    the two-server board (`one` is the benchmark's one-server board; the other is started here).
    Flat budgets, as the bare loop has. All in this process, after the first rows: imports
    and pools are warm for the pipeline and the bare loop alike, as through most of a night,
    so the difference is the orchestration (the one-server board's runner worker starts cold:
    one TVM import, ~5 s here). The stock bare loop (opt-in) runs in a fresh process, with
    MetaSchedule's own pools."""
    from vta_pipeline.boards import LocalBoard

    def record(label: str, tune_s: float, n_trials: int) -> None:
        res["overhead"][label] = {"tune_s": tune_s, "trials": n_trials, "trials_per_min": 60 * n_trials / tune_s}
        print(f"{label}: {res['overhead'][label]}", flush=True)

    with LocalBoard(key="bench2", num_servers=2, threads=args.threads) as two_servers:
        boards = {1: one, 2: two_servers}
        for servers in (1, 2):
            st = args.store / f"overhead-{servers}"
            r = pipeline_run(
                args.overhead_model,
                "builtin",
                st,
                trials,
                args.threads,
                5,
                [],
                task_filter="conv2d",
                board=boards[servers],
                in_process=True,
            )
            record(f"pipeline, {servers} board(s)", r["tune_s"], r["trials"])
        b = bare_loop(
            args.store / "overhead-2", trials, args.threads, two_servers.tracker, two_servers.key, our_pools=True
        )
        record(BARE_OUR_POOLS, b["tune_s"], b["trials"])
        if args.stock_bare:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.compare",
                    "--bare-loop",
                    str(args.store / "overhead-2"),
                    str(trials),
                    str(args.threads),
                    two_servers.tracker,
                    two_servers.key,
                    "0",
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            if out.returncode != 0:
                raise RuntimeError(f"bare loop failed:\n{out.stderr[-3000:]}")
            b = json.loads(out.stdout.strip().splitlines()[-1])
            record(BARE, b["tune_s"], b["trials"])


def write(res: dict[str, Any], seconds: float, out: Path = OUT) -> str:
    """compare.json and compare.md from what has been measured so far; returns the markdown."""
    meta, peak, rows, overhead, where = (res[k] for k in ("meta", "peak", "rows", "overhead", "where_the_time_goes"))
    meta["seconds"] = round(seconds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(res, indent=1))
    int8_src = ", ".join(f"{k} {v:.0f}" for k, v in peak["int8_sources"].items() if v)
    fp32_src = ", ".join(f"{k} {v:.0f}" for k, v in peak.get("fp32_sources", {}).items())
    resumed = f" (resumed at {', '.join(meta['resumed_at'])})" if meta.get("resumed_at") else ""
    md = [
        f"Measured at commit {meta['commit']}{resumed} on {meta['date']}, {meta.get('cpu', '?')} "
        f"({', '.join(meta.get('isa', [])) or 'ISA flags not recorded'}; {meta.get('logical_cpus', '?')} logical "
        f"CPUs): {meta['threads']} threads (TVM boards and frameworks alike), batch 1, "
        f"{meta['runs']} timed runs, TVM tuned with {meta['trials_per_task']} trials per task "
        f"({ALLOCATION[meta.get('allocation', 'flat')]}); peak fp32 "
        f"{peak['fp32_gflops']:.0f} GFLOP/s{f' ({fp32_src})' if fp32_src else ''}, int8 {peak.get('int8_gops') or 0:.0f} GOP/s ({int8_src}); "
        f"the benchmark took {meta['seconds'] / 60:.1f} min.",
        "",
        table(rows, peak),
    ]
    after = [(r["model"], r["engine"], e, ms) for r in rows for e, ms in r.get("timed_right_after", {}).items()]
    if after:
        md += [
            "",
            "The reference timed again right after each TVM row (the host drifts within a run):",
            "",
            "| model | TVM row | reference | ms right after |",
            "|---|---|---|---|",
        ]
        md += [f"| {model} | {row} | {e} | {ms:.2f} |" for model, row, e, ms in after]
    pairs = [(r["model"], r["engine"], r["median_ms"], r["side_by_side"]) for r in rows if r.get("side_by_side")]
    if pairs:
        md += [
            "",
            "Each tuned build timed again on the board in turn with its reference in this process "
            f"({pairs[0][3]['rounds']} rounds; the host drifts within a run, and the pipeline's own evaluation "
            "runs inside its flow, minutes from the reference's timing):",
            "",
            "| model | TVM row | pipeline's evaluation ms | in turn: ours ms | in turn: reference | ms "
            "| ours / reference | no wait between turns: ours ms | reference ms | ours / reference |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        md += [
            f"| {m} | {row} | {ev:.2f} | {p['ours_ms']:.2f} | {p['engine']} | {p['reference_ms']:.2f} | "
            f"{p['ours_ms'] / p['reference_ms']:.3f} | {unsettled(p)} |"
            for m, row, ev, p in pairs
        ]
    md += ["", *goals(rows, overhead)]
    md += curve_tables(res)
    if res.get("curves"):
        refs = {
            f"{m} {e}": r["median_ms"]
            for r in rows
            for m, e in [(r["model"], r["engine"])]
            if e.startswith("ONNX Runtime") and any(k.startswith(m + " ") for k in res["curves"])
        }
        curve_plot(res["curves"], refs, out / "latency_vs_trials.png")
    for what, tasks in where.items():
        total = sum(t["ms_x_weight"] for t in tasks) or 1.0
        md += [
            "",
            f"Where the time goes, {what} (best tuned latency x weight, top 5 of {len(tasks)} tuned tasks):",
            "",
            "| task | weight | best ms | ms x weight | share |",
            "|---|---|---|---|---|",
        ]
        md += [
            f"| {t['task'][:60]} | {t['weight']} | {t['best_ms']:.3f} | {t['ms_x_weight']:.3f} | "
            f"{100 * t['ms_x_weight'] / total:.0f}% |"
            for t in tasks[:5]
        ]
    if overhead:
        md += ["", "| tuning | trials | tuning s | trials/min |", "|---|---|---|---|"]
        md += [f"| {k} | {v['trials']} | {v['tune_s']:.0f} | {v['trials_per_min']:.1f} |" for k, v in overhead.items()]
    text = "\n".join(md) + "\n"
    (out / "compare.md").write_text(text)
    return text


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bare-loop"]:  # overhead_runs' stock child: store trials threads tracker key our_pools
        store_, trials_, threads_, tracker_, key_, ours_ = sys.argv[2:8]
        print(json.dumps(bare_loop(Path(store_), int(trials_), int(threads_), tracker_, key_, bool(int(ours_)))))
    else:
        main()
