"""Per conv: our tuned kernel beside ONNX Runtime's kernel for the same conv, and the peak.

`compare.py` says whether a tuned network beats ONNX Runtime; this says where the gap is.
For every conv task of a benchmark run it builds the task's best record from the run's store
and times it (the kernel alone, its weights already in the tuned layout) beside ONNX Runtime
on a one-conv model of the same shape (bias + ReLU, NCHW in and out), same threads,
interleaved in rounds, so both sides see the same host: on this shared 2-core VM an engine
moved 2x within minutes, and a tuning log's latency from an hour before compares with
nothing. Both are also given as a share of the machine's reachable fp32 peak (the best of
ONNX Runtime's and PyTorch's fp32 GEMMs, `compare.fp32_gemms`, timed in every round too).
ONNX Runtime's one-conv time includes its NCHW <-> NCHWc reorders of input and output
(inside a network it reorders once), so its number is a little slow, most for 1x1 convs.

    uv run python benchmarks/conv_gap.py --run benchmarks/results/<dir> --store <its --store> \\
        --what "resnet18 fp32 packed"

Writes conv_gap.md / conv_gap.json into the run's directory.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from compare import fp32_gemms, stats, timed

from vta_pipeline import machine

# Both engines' thread pools spin-wait for the next job after each one; timed alternately in
# one process, each engine's spinning threads took the cores from the other (our kernels
# measured 3-4x slower than in tuning). Neither spins here.
SPIN = {"TVM_THREAD_POOL_SPIN_COUNT": "0"}


def ort_session(model, threads: int):
    """An ONNX Runtime session of `model` (an ONNX ModelProto or a file path) on `threads`
    threads, all graph optimizations on, its thread pool not spinning (see SPIN)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def conv_model(n: int, h: int, w: int, c: int, oc: int, kh: int, kw: int, ph: int, pw: int, sh: int, sw: int):
    """A one-conv ONNX model (bias, ReLU) of a task's workload, and its input."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((oc, c, kh, kw)) * 0.05).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "b")
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw]),
         helper.make_node("Relu", ["y"], ["z"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, oc, oh, ow])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, rng.standard_normal((n, c, h, w)).astype(np.float32), 2.0 * n * oc * oh * ow * c * kh * kw


def tuned_tasks(run: Path, store: Path, what: str) -> list[dict[str, Any]]:
    """The run's conv tasks of `what` (a key of its where_the_time_goes), each with its conv
    workload, its TIR file and its tuning work dir, read from the store that tuned them."""
    res = json.loads((run / "compare.json").read_text())
    tasks = res["where_the_time_goes"][what]
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((store / "pipeline" / "steps" / "extract").glob("*/tasks.json")):
        for t in json.loads(path.read_text()):
            if t.get("workload") and t["op"] in ("packed_conv2d", "conv2d"):
                dirs = sorted((store / "pipeline" / "work" / "tune").glob(f"*/{t['workload_hash']}"))
                if dirs:
                    found.setdefault(t["name"], {"workload": t["workload"], "tir": str(path.parent / t["file"]),
                                                 "work_dir": str(dirs[0])})
    return [{**t, **found[t["task"]]} for t in tasks if t["task"] in found]


def our_kernel(task: dict[str, Any]) -> Callable[[], Any]:
    """The task's best tuned schedule, built for the record's target as the tuner measured it
    (weights taken in the tuned layout, as the network's build pre-packs them): a function
    that runs it once."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.ms_build import fast_build

    workload = tvm.ir.load_json(Path(task["tir"]).read_text())
    db = ms.database.JSONDatabase(work_dir=task["work_dir"])
    (best,) = db.get_top_k(db.commit_workload(workload), 1)
    sch = Schedule(workload)
    best.trace.apply_to_schedule(sch, remove_postproc=False)
    lib = fast_build(sch.mod, best.target, None)
    name = sch.mod.get_global_vars()[0].name_hint
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.random.default_rng(0).random([int(d) for d in a.shape]).astype(str(a.dtype)), dev)
            for a in ms.arg_info.ArgInfo.from_prim_func(tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(
                skip_tensor_rewrite=True)(sch.mod)[name])]
    fn = lib[name]
    return lambda: fn(*args)


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
    from tvm import relax

    from compare import torch_model

    torch.set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    onnx_path = work / f"{model}.onnx"
    torch.onnx.export(torch_model(model, 0), (torch.from_numpy(x),), str(onnx_path), input_names=["data"],
                      output_names=["out"], opset_version=17, dynamo=False)
    sess = ort_session(onnx_path, threads)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    main, xt = vm["main"], tvm.runtime.tensor(x)
    return {"ours": lambda: main(xt), "ort": lambda: sess.run(None, {"data": x})}


def kernel_times(lib: Path, runs: int) -> dict[str, dict[str, float]]:
    """Where our network's time goes, per kernel: each function the Relax VM calls (kernels
    and VM builtins), timed around the call by the VM's instrument hook over `runs` runs
    (ms per network run, and calls per run). The hook's own Python round trip adds a few
    microseconds to every call, so the sum is a little above the network's latency."""
    import time
    from collections import defaultdict

    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32))
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    started = [0.0]

    def hook(func, name, before_run, ret, *args):
        if before_run:
            started[0] = time.perf_counter()
        else:
            total[name] += time.perf_counter() - started[0]
            calls[name] += 1
        return 0  # relax.VMInstrumentReturnKind.NO_OP

    for _ in range(3):
        vm["main"](x)
    vm.set_instrument(hook)
    for _ in range(runs):
        vm["main"](x)
    return {name: {"ms": 1e3 * total[name] / runs, "calls": calls[name] // runs}
            for name in sorted(total, key=total.get, reverse=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a compare.py --out directory")
    ap.add_argument("--store", type=Path, required=True, help="the --store that run tuned into")
    ap.add_argument("--what", default="resnet18 fp32 packed", help="which tuned network of the run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", type=Path, help="our network's model.so (default: the store's newest build)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per kernel and round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    tasks = tuned_tasks(args.run, args.store, args.what)
    if not tasks:
        raise SystemExit(f"no conv task of {args.what!r} in {args.run}/compare.json has a workload and a tuning "
                         f"work dir in {args.store}/pipeline: is --store the run's store?")
    os.environ.update(SPIN, TVM_NUM_THREADS=str(args.threads))
    for t in tasks:
        model, t["x"], t["flops"] = conv_model(*t["workload"])
        t["ort"], t["ours"] = ort_session(model, args.threads), our_kernel(t)
    lib = args.build or newest_build(args.store)
    with tempfile.TemporaryDirectory() as work:  # the exported ONNX file is loaded, then not needed (47 MB)
        net = networks(args.what.split()[0], lib, args.threads, Path(work))
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):  # interleaved: every round times every kernel of both engines
        peaks = fp32_gemms(args.threads)
        row = {"peak": max(peaks.values()), "peaks": peaks, "ours": {}, "ort": {},
               "network": {k: stats(timed(fn, 2 * args.runs))["median_ms"] for k, fn in net.items()}}
        for t in tasks:
            row["ort"][t["task"]] = stats(timed(lambda t=t: t["ort"].run(None, {"x": t["x"]}), args.runs))["median_ms"]
            row["ours"][t["task"]] = stats(timed(t["ours"], args.runs))["median_ms"]
        rounds.append(row)
        print(f"round {r + 1}/{args.rounds}: peak {row['peak']:.0f} GFLOP/s", flush=True)
    peak = float(np.median([r["peak"] for r in rounds]))
    rows = []
    for t in tasks:
        ours = float(np.median([r["ours"][t["task"]] for r in rounds]))
        ort_ms = float(np.median([r["ort"][t["task"]] for r in rounds]))
        rows.append({k: t[k] for k in ("task", "weight", "workload", "flops", "best_ms")}
                    | {"ours_ms": ours, "ort_ms": ort_ms, "ours_gflops": t["flops"] / ours / 1e6,
                       "ort_gflops": t["flops"] / ort_ms / 1e6,
                       "ratio_per_round": [r["ours"][t["task"]] / r["ort"][t["task"]] for r in rounds]})
    peaks = {"per round": [r["peaks"] for r in rounds]}
    network = [r["network"] for r in rounds]
    meta = {**machine.cpu(), "threads": args.threads, "run": str(args.run), "what": args.what, "peaks_gflops": peaks,
            "build": str(lib), "network_ms_per_round": network}
    md = [f"{args.what}: each conv task's best tuned kernel (from {args.run.name}'s store) beside ONNX Runtime on a "
          f"one-conv model of the same shape, both timed now, interleaved in {args.rounds} rounds of {args.runs} runs "
          f"(medians over rounds), on {meta.get('cpu', '?')} ({', '.join(meta.get('isa', []))}), {args.threads} "
          f"threads. Peak: {peak:.0f} GFLOP/s (the median over rounds of the best fp32 GEMM: "
          + "; ".join(", ".join(f"{k} {v:.0f}" for k, v in p.items()) for p in peaks["per round"]) + ").", "",
          "| task | N,H,W,C,OC,kh,kw,ph,pw,sh,sw | weight | tuning's best ms | ours now ms | ORT now ms | ours/ORT "
          "(range over rounds) | ours % of peak | ORT % of peak |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = min(r["ratio_per_round"]), max(r["ratio_per_round"])
        md.append(f"| {r['task'][:44]} | {','.join(map(str, r['workload']))} | {r['weight']} | {r['best_ms']:.3f} | "
                  f"{r['ours_ms']:.3f} | {r['ort_ms']:.3f} | {r['ours_ms'] / r['ort_ms']:.2f} ({lo:.2f}-{hi:.2f}) | "
                  f"{100 * r['ours_gflops'] / peak:.0f}% | {100 * r['ort_gflops'] / peak:.0f}% |")
    ours = sum(r["ours_ms"] * r["weight"] for r in rows)
    theirs = sum(r["ort_ms"] * r["weight"] for r in rows)
    md += ["", f"Sum over the network's convs (x weight): ours {ours:.2f} ms, ONNX Runtime's one-conv models "
           f"{theirs:.2f} ms ({ours / theirs:.2f}x)."]
    md += ["", f"The whole network in the same rounds ({lib.parent.name}/{lib.name} in a Relax VM vs ONNX Runtime, "
           f"{2 * args.runs} runs each): " + "; ".join(f"ours {n['ours']:.2f} ms vs ORT {n['ort']:.2f} ms "
                                                       f"({n['ours'] / n['ort']:.2f}x)" for n in network) + "."]
    kernels = kernel_times(lib, 2 * args.runs)
    convs = sum(k["ms"] for name, k in kernels.items() if "conv2d" in name)
    others = {name: k for name, k in kernels.items() if "conv2d" not in name}
    md += ["", f"Our network per kernel (the VM's instrument hook around each call, {2 * args.runs} runs, after the "
           f"rounds): convs {convs:.2f} ms, everything else {sum(k['ms'] for k in others.values()):.2f} ms:", "",
           "| function | ms per run | calls |", "|---|---|---|"]
    md += [f"| {name} | {k['ms']:.3f} | {k['calls']} |" for name, k in others.items()]
    meta["kernels"] = kernels
    (args.run / "conv_gap.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.run / "conv_gap.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
