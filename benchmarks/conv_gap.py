"""Per conv: our tuned kernel beside ONNX Runtime's kernel for the same conv, and the peak.

`compare.py` says whether a tuned network beats ONNX Runtime; this says where the gap is.
For every conv task of a benchmark run it builds the task's best record from the run's store
and times it (the kernel alone, its weights already in the tuned layout) beside ONNX Runtime
on a one-conv model of the same shape (bias + ReLU, NCHW in and out), same threads, one
run of each in turn, in rounds, so both sides see the same host: on this shared 2-core VM
an engine moved 2x within minutes, and a tuning log's latency from an hour before compares
with nothing. Both are also given as a share of the machine's reachable fp32 peak (the best of
ONNX Runtime's and PyTorch's fp32 GEMMs, `compare.fp32_gemms`, timed in every round too).
ONNX Runtime's one-conv time includes its NCHW <-> NCHWc reorders of input and output
(inside a network it reorders once), so its number is a little slow, most for 1x1 convs.
So the same convs are also timed where they run: each engine's whole network, run in turn,
our kernels timed by the Relax VM's instrument hook and ONNX Runtime's by its own profiler
(`in_network`): the table that says which of our kernels lose to which of ORT's.

    uv run python -m benchmarks.conv_gap --run benchmarks/results/<dir> --store <its --store> \\
        --what "resnet18 fp32 packed"

Writes conv_gap.md / conv_gap.json into the run's directory (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.lib.kernels import (
    SPIN,
    InstrumentedVM,
    Kernel,
    alternating,
    conv_model,
    kept_record,
    ort_conv_key,
    ort_session,
    task_conv_key,
    tuned_tasks,
)
from benchmarks.lib.peaks import fp32_gemms
from vta_pipeline.boards import machine


def our_kernel(task: dict[str, Any]) -> Kernel:
    """The task's best tuned schedule, built for the record's target as the tuner measured it."""
    _, _, best, sch = kept_record(task)
    return Kernel(sch, best.target)


def newest_build(store: Path) -> Path:
    """The library of the store's newest build step (compare.py builds the largest budget last)."""
    libs = sorted((store / "pipeline" / "steps" / "build").glob("*/model.so"), key=lambda p: p.stat().st_mtime)
    if not libs:
        raise SystemExit(f"no build in {store}/pipeline/steps/build: is --store the run's store?")
    return libs[-1]


def networks(model: str, lib: Path, threads: int, work: Path) -> dict[str, Callable[[], Any]]:
    """The whole network both ways: our built library in a Relax VM, and ONNX Runtime on the
    same torchvision model (random weights, as compare.py exports it)."""
    import torch
    import tvm
    from compare import torch_model
    from tvm import relax

    torch.set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    onnx_path = work / f"{model}.onnx"
    torch.onnx.export(
        torch_model(model, 0),
        (torch.from_numpy(x),),
        str(onnx_path),
        input_names=["data"],
        output_names=["out"],
        opset_version=17,
        dynamo=False,
    )
    sess = ort_session(onnx_path, threads)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    main, xt = vm["main"], tvm.runtime.tensor(x)
    return {"ours": lambda: main(xt), "ort": lambda: sess.run(None, {"data": x})}


def kernel_times(lib: Path, runs: int) -> dict[str, dict[str, float]]:
    """Where our network's time goes, per function the VM calls (`InstrumentedVM`), over `runs`
    runs: ms per network run, and calls per run."""
    vm = InstrumentedVM(lib)
    total: dict[str, float] = {}
    calls: dict[str, int] = {}
    for _ in range(runs):
        for name, (sec, n) in vm.run().items():
            total[name], calls[name] = total.get(name, 0.0) + sec, n
    return {
        name: {"ms": 1e3 * total[name] / runs, "calls": calls[name]}
        for name in sorted(total, key=total.get, reverse=True)
    }


def ort_profiled(onnx_path: Path, threads: int, work: Path):
    """An `ort_session` with ONNX Runtime's profiler on (it times each node's kernel as ORT
    runs it, after its NCHWc rewrite: reorders and all), and a function that ends the
    profile and returns, per node in the order the network runs them, its op, its
    `ort_conv_key` and its kernel time in ms at every run."""
    sess = ort_session(onnx_path, threads, profile=work / "ort_profile")

    def nodes() -> list[dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for e in json.loads(Path(sess.end_profiling()).read_text()):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                node = found.setdefault(
                    e["name"][: -len("_kernel_time")],
                    {"op": e["args"]["op_name"], "key": ort_conv_key(e["args"]), "ms": []},
                )
                node["ms"].append(e["dur"] / 1e3)
        return list(found.values())

    return sess, nodes


def in_network(
    tasks: list[dict[str, Any]], lib: Path, onnx_path: Path, threads: int, runs: int, work: Path
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each conv's time inside its network, per call, both engines: our kernels through the
    VM's instrument hook, ONNX Runtime's through its profiler, the two networks run in turn
    (one run each, `runs` times: on this host a block of runs of one engine and then the
    other measured every kernel of one side 1.4x slower, the host's speed between the
    blocks), medians over runs. A one-conv model's time (`conv_model`) includes the NCHW <->
    NCHWc reorders ORT pays once per network, and a lone kernel starts with cold inputs; this
    is each kernel where it runs. Also each engine's time per run outside its convs."""
    vm = InstrumentedVM(lib)
    sess, ort_nodes = ort_profiled(onnx_path, threads, work)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    warm = 3  # ORT profiles from its session's start: these runs' events are dropped
    for _ in range(warm):
        sess.run(None, {"data": x})
    ours: list[dict[str, tuple[float, int]]] = []
    for _ in range(runs):
        ours.append(vm.run())
        sess.run(None, {"data": x})
    names = {task_conv_key(t): t["task"] for t in tasks}
    rows, nodes = [], ort_nodes()
    for key, task in names.items():
        theirs = [n["ms"][warm:] for n in nodes if n["key"] == key]
        per_call = [sec * 1e3 / n for run in ours for name, (sec, n) in run.items() if name.startswith(task)]
        if theirs and per_call:
            rows.append(
                {
                    "key": key,
                    "task": task,
                    "calls": sum(t["weight"] for t in tasks if task_conv_key(t) == key),
                    "ours_ms": float(np.median(per_call)),
                    "ort_ms": float(np.median(np.mean(theirs, axis=0))),
                }
            )
    rest = {
        "ours": float(np.median([sum(sec for name, (sec, _) in run.items() if "conv2d" not in name) for run in ours]))
        * 1e3,
        "ort": float(np.median(np.sum([n["ms"][warm:] for n in nodes if not n["key"]], axis=0))),
    }
    return rows, rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a compare.py --out directory")
    ap.add_argument("--store", type=Path, required=True, help="the --store that run tuned into")
    ap.add_argument("--what", default="resnet18 fp32 packed", help="which tuned network of the run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", type=Path, help="our network's model.so (default: the store's newest build)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per kernel and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, help="where conv_gap.{md,json} go (default: the --run directory)")
    args = ap.parse_args()
    out = args.out or args.run
    out.mkdir(parents=True, exist_ok=True)

    tasks = tuned_tasks(args.run, args.store, args.what)
    if not tasks:
        raise SystemExit(
            f"no conv task of {args.what!r} in {args.run}/compare.json has a workload and a tuning "
            f"work dir in {args.store}/pipeline: is --store the run's store?"
        )
    os.environ.update(SPIN, TVM_NUM_THREADS=str(args.threads))
    for t in tasks:
        model, t["x"], t["flops"] = conv_model(*t["workload"])
        t["ort"], t["ours"] = ort_session(model, args.threads), our_kernel(t)
    lib = args.build or newest_build(args.store)
    work = tempfile.TemporaryDirectory()  # the exported ONNX file and ORT's profiles (47 MB): not results
    net = networks(args.what.split()[0], lib, args.threads, Path(work.name))
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):  # every round times every kernel of both engines
        peaks = fp32_gemms(args.threads)
        row = {
            "peak": max(peaks.values()),
            "peaks": peaks,
            "ours": {},
            "ort": {},
            "network": alternating(net, 2 * args.runs),
        }
        for t in tasks:
            ms = alternating({"ort": lambda t=t: t["ort"].run(None, {"x": t["x"]}), "ours": t["ours"]}, args.runs)
            row["ort"][t["task"]], row["ours"][t["task"]] = ms["ort"], ms["ours"]
        rounds.append(row)
        print(f"round {r + 1}/{args.rounds}: peak {row['peak']:.0f} GFLOP/s", flush=True)
    peak = float(np.median([r["peak"] for r in rounds]))
    rows = []
    for t in tasks:
        ours = float(np.median([r["ours"][t["task"]] for r in rounds]))
        ort_ms = float(np.median([r["ort"][t["task"]] for r in rounds]))
        rows.append(
            {k: t[k] for k in ("task", "weight", "workload", "flops", "best_ms")}
            | {
                "ours_ms": ours,
                "ort_ms": ort_ms,
                "ours_gflops": t["flops"] / ours / 1e6,
                "ort_gflops": t["flops"] / ort_ms / 1e6,
                "ratio_per_round": [r["ours"][t["task"]] / r["ort"][t["task"]] for r in rounds],
            }
        )
    peaks = {"per round": [r["peaks"] for r in rounds]}
    network = [r["network"] for r in rounds]
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "run": str(args.run),
        "what": args.what,
        "peaks_gflops": peaks,
        "build": str(lib),
        "network_ms_per_round": network,
    }
    md = [
        f"{args.what}: each conv task's best tuned kernel (from {args.run.name}'s store) beside ONNX Runtime on a "
        f"one-conv model of the same shape, both timed now, one run of each in turn, {args.rounds} rounds of {args.runs} runs "
        f"(medians over rounds), on {meta.get('cpu', '?')} ({', '.join(meta.get('isa', []))}), {args.threads} "
        f"threads. Peak: {peak:.0f} GFLOP/s (the median over rounds of the best fp32 GEMM: "
        + "; ".join(", ".join(f"{k} {v:.0f}" for k, v in p.items()) for p in peaks["per round"])
        + ").",
        "",
        "| task | N,H,W,C,OC,kh,kw,ph,pw,sh,sw | weight | tuning's best ms | ours now ms | ORT now ms | ours/ORT "
        "(range over rounds) | ours % of peak | ORT % of peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = min(r["ratio_per_round"]), max(r["ratio_per_round"])
        md.append(
            f"| {r['task'][:44]} | {','.join(map(str, r['workload']))} | {r['weight']} | {r['best_ms']:.3f} | "
            f"{r['ours_ms']:.3f} | {r['ort_ms']:.3f} | {r['ours_ms'] / r['ort_ms']:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{100 * r['ours_gflops'] / peak:.0f}% | {100 * r['ort_gflops'] / peak:.0f}% |"
        )
    ours = sum(r["ours_ms"] * r["weight"] for r in rows)
    theirs = sum(r["ort_ms"] * r["weight"] for r in rows)
    md += [
        "",
        f"Sum over the network's convs (x weight): ours {ours:.2f} ms, ONNX Runtime's one-conv models "
        f"{theirs:.2f} ms ({ours / theirs:.2f}x).",
    ]
    md += [
        "",
        f"The whole network in the same rounds ({lib.parent.name}/{lib.name} in a Relax VM vs ONNX Runtime, "
        f"one run of each in turn, {2 * args.runs} runs each, per round): "
        + "; ".join(f"ours {n['ours']:.2f} ms vs ORT {n['ort']:.2f} ms ({n['ours'] / n['ort']:.2f}x)" for n in network)
        + ".",
    ]
    kernels = kernel_times(lib, 2 * args.runs)
    convs = sum(k["ms"] for name, k in kernels.items() if "conv2d" in name)
    others = {name: k for name, k in kernels.items() if "conv2d" not in name}
    md += [
        "",
        f"Our network per kernel (the VM's instrument hook around each call, {2 * args.runs} runs, after the "
        f"rounds): convs {convs:.2f} ms, everything else {sum(k['ms'] for k in others.values()):.2f} ms:",
        "",
        "| function | ms per run | calls |",
        "|---|---|---|",
    ]
    md += [f"| {name} | {k['ms']:.3f} | {k['calls']} |" for name, k in others.items()]
    meta["kernels"] = kernels
    inside, rest = in_network(
        tasks,
        lib,
        Path(work.name) / f"{args.what.split()[0]}.onnx",
        args.threads,
        2 * args.runs * args.rounds,
        Path(work.name),
    )
    work.cleanup()
    ours_in = sum(r["ours_ms"] * r["calls"] for r in inside)
    ort_in = sum(r["ort_ms"] * r["calls"] for r in inside)
    md += [
        "",
        f"Each conv inside its network, per call (our VM's instrument hook; ONNX Runtime's profiler, its "
        f"NCHWc kernels after its own layout rewrite), the two networks run in turn, "
        f"{2 * args.runs * args.rounds} runs each, medians: convs ours {ours_in:.2f} ms vs ORT {ort_in:.2f} ms per run ({ours_in / ort_in:.2f}x); "
        f"everything else ours {rest['ours']:.2f} ms vs ORT {rest['ort']:.2f} ms.",
        "",
        "| conv (input, channels, window/stride, +res: residual add fused) | calls | ours ms | ORT ms | ours/ORT |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {r['key']} | {r['calls']} | {r['ours_ms']:.3f} | {r['ort_ms']:.3f} | {r['ours_ms'] / r['ort_ms']:.2f} |"
        for r in sorted(inside, key=lambda r: -r["ours_ms"] * r["calls"])
    ]
    meta["in_network"] = {"convs": inside, "other_ms": rest}
    (out / "conv_gap.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "conv_gap.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
