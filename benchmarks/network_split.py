"""Where each engine's network time goes, by kind of operator: our built network beside ONNX
Runtime's (fp32, or int8 U8S8 QDQ), both run in turn in one process.

`compare.py` says which network is faster; `conv_gap.py` compares fp32 conv kernels one by
one. This splits both whole networks into what runs inside them: our functions through the
Relax VM's instrument hook, ONNX Runtime's nodes through its profiler, one run of each
engine in turn (`runs` times; this host's speed moved 1.5x within minutes, so only times
taken side by side compare). Our kinds: the int8 convs of the x86 layout (the dot product),
packed float convs, packed depthwise convs, the stem conv (an unpacked conv), and every
other function by name; ORT's: its op types, its stem conv apart. A tuning log's
per-task best (`compare.md`'s "where the time goes") is each kernel with warm caches, alone;
this is each where it runs, and when --build lies in a pipeline store (its manifest names
the pick-best artifact) the two stand side by side, kernel by kernel.

    uv run python -m benchmarks.network_split --model resnet18 --int8 \\
        --build /work/store-int8all/pipeline/steps/build/<key>/model.so --out benchmarks/results/<run>

Both engines run with spinning thread pools off (as in `conv_gap.py`: one engine's spinning
threads took the cores from the other), and the hook's Python round trip adds a few
microseconds per call to ours: the sums are above `compare.py`'s latencies, on both sides.
Writes network_split_<model>[_int8].{md,json} into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.kernels import SPIN, InstrumentedVM, alternating, ort_session
from benchmarks.lib.references import ort_quantize, torch_model
from vta_pipeline.boards import machine


def our_kind(name: str) -> str:
    """The kind of one of our network's functions (a fused kernel or a VM builtin)."""
    if "depthwise_conv2d_dot_packed" in name:
        return "depthwise conv (dot product)"
    if "dot_packed" in name:
        return "int8 conv (dot product)"
    if "depthwise_conv2d_packed" in name:
        return "depthwise conv (packed)"
    if "conv2d_winograd_packed" in name:
        return "float conv (packed, Winograd)"
    if "conv2d_packed" in name:
        return "float conv (packed)"
    if "conv2d" in name:
        return "stem conv (unpacked)"
    if name.startswith("vm.builtin"):
        return "VM builtins (allocation, tuples)"
    return re.sub(r"\d+(_prepacked)?$", "", name)


def ort_kind(event_args: dict[str, Any]) -> str:
    """The kind of one of ONNX Runtime's profiled nodes: its op, the conv on 3 channels apart."""
    op = event_args["op_name"]
    if op in ("Conv", "QLinearConv", "FusedConv"):
        shapes = [next(iter(s.values())) for s in event_args["input_type_shape"]]
        return f"{op} (stem)" if len(shapes[0]) == 4 and 3 in (shapes[0][1], shapes[0][3]) else op  # NCHW or NHWC
    return op


def split(model: str, lib: Path, int8: bool, threads: int, runs: int) -> dict[str, Any]:
    import torch

    work = Path(tempfile.mkdtemp())
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
    if int8:
        quantized = work / f"{model}.u8s8.onnx"
        ort_quantize(onnx_path, quantized, x.shape, 1)
        onnx_path = quantized
    import tvm
    from tvm import relax

    plain_vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    plain_sess, xt = ort_session(onnx_path, threads), tvm.runtime.tensor(x)
    plain = alternating(
        {"ours": lambda: plain_vm["main"](xt), "ort": lambda: plain_sess.run(None, {"data": x})}, 2 * runs
    )  # the networks as they run, neither instrumented
    vm = InstrumentedVM(lib)
    sess = ort_session(onnx_path, threads, profile=work / "ort_profile")
    warm = 3  # ORT profiles from its session's start: these runs' events are dropped
    for _ in range(warm):
        sess.run(None, {"data": x})
    ours: dict[str, list[float]] = {}
    functions: dict[str, list[float]] = {}
    ncalls: dict[str, int] = {}
    wall: dict[str, list[float]] = {"ours": [], "ort": []}
    for _ in range(runs):
        t = time.perf_counter()
        calls = vm.run()
        wall["ours"].append(1e3 * (time.perf_counter() - t))
        per_kind: dict[str, float] = {}
        for name, (sec, n) in calls.items():
            per_kind[our_kind(name)] = per_kind.get(our_kind(name), 0.0) + 1e3 * sec
            functions.setdefault(name, []).append(1e3 * sec)
            ncalls[name] = n
        for kind, ms in per_kind.items():
            ours.setdefault(kind, []).append(ms)
        t = time.perf_counter()
        sess.run(None, {"data": x})
        wall["ort"].append(1e3 * (time.perf_counter() - t))
    theirs: dict[str, np.ndarray] = {}
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            theirs.setdefault(e["name"], {"kind": ort_kind(e["args"]), "ms": []})["ms"].append(e["dur"] / 1e3)
    ort_kinds: dict[str, np.ndarray] = {}
    for node in theirs.values():
        ms = np.array(node["ms"][warm:])
        ort_kinds[node["kind"]] = ort_kinds.get(node["kind"], 0) + ms
    return {
        "ours_ms": {k: float(np.median(v)) for k, v in sorted(ours.items(), key=lambda kv: -np.median(kv[1]))},
        "ort_ms": {k: float(np.median(v)) for k, v in sorted(ort_kinds.items(), key=lambda kv: -np.median(kv[1]))},
        "functions": {
            k: {"ms": float(np.median(v)), "calls": ncalls[k]}
            for k, v in sorted(functions.items(), key=lambda kv: -np.median(kv[1]))
        },
        "network_ms": {k: float(np.median(v)) for k, v in wall.items()},
        "network_plain_ms": plain,
    }


def tuned_best(lib: Path) -> dict[str, float] | None:
    """Each tuned task's best latency (ms, measured alone while tuning), by task name, when
    `lib` is a build in a pipeline store: the build's manifest names its pick_best artifact."""
    manifest = lib.parent / "manifest.json"
    if not manifest.exists():
        return None
    best_id = json.loads(manifest.read_text())["inputs"].get("best")
    for m in lib.parent.parent.parent.glob("pick_best/*/manifest.json"):
        if json.loads(m.read_text()).get("artifact_id") == best_id:
            return {e["task"]: e["best_latency_ms"] for e in json.loads((m.parent / "best.json").read_text())}
    return None


def in_network_vs_alone(functions: dict[str, dict[str, float]], best: dict[str, float]) -> list[str]:
    """Each kernel's time inside the network beside its tuning's best (alone, warm caches) x its
    calls: what the tuner measured and what the network gets. A VM function is its task's
    kernel; `_prepacked` is the same kernel taking its weights pre-laid-out."""
    md = [
        "",
        "Each kernel inside the network (instrumented, per run) beside what tuning measured for it "
        "alone (best ms x calls per run):",
        "",
        "| function | calls | in network ms | tuned alone ms | ratio |",
        "|---|---|---|---|---|",
    ]
    inside = alone = 0.0
    for name, f in functions.items():
        task = re.sub(r"_prepacked$", "", name)
        b = best.get(task)
        if b is None:
            md.append(f"| {name} | {f['calls']} | {f['ms']:.3f} | - | - |")
            continue
        inside, alone = inside + f["ms"], alone + b * f["calls"]
        ratio = f["ms"] / (b * f["calls"])
        md.append(f"| {name} | {f['calls']} | {f['ms']:.3f} | {b * f['calls']:.3f} | {ratio:.2f} |")
    md.append(f"| **tuned kernels** | | **{inside:.2f}** | **{alone:.2f}** | **{inside / max(alone, 1e-9):.2f}** |")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", help="the torchvision model the build was made from")
    ap.add_argument("--build", type=Path, required=True, help="our network's model.so")
    ap.add_argument("--int8", action="store_true", help="compare with ONNX Runtime int8 (U8S8 QDQ), not fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    os.environ.update(SPIN, TVM_NUM_THREADS=str(args.threads))
    res = split(args.model, args.build, args.int8, args.threads, args.runs)
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "model": args.model,
        "build": str(args.build),
        "int8": args.int8,
        "runs": args.runs,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    ref = "ONNX Runtime int8 (U8S8 QDQ)" if args.int8 else "ONNX Runtime fp32"
    md = [
        f"{args.model}: our build ({args.build}) beside {ref}, one run of each in turn, {args.runs} runs "
        f"(medians), {meta['date']}, on {meta.get('cpu', '?')} ({', '.join(meta.get('isa', []))}), "
        f"{args.threads} threads, thread pools not spinning.",
        "",
        f"Network, neither instrumented, run in turn ({2 * args.runs} runs each): ours "
        f"{res['network_plain_ms']['ours']:.2f} ms, ORT {res['network_plain_ms']['ort']:.2f} ms. "
        f"Instrumented / profiled (below): ours {res['network_ms']['ours']:.2f} ms, "
        f"ORT {res['network_ms']['ort']:.2f} ms.",
        "",
        "| ours: kind | ms | | ORT: op | ms |",
        "|---|---|---|---|---|",
    ]
    a, b = list(res["ours_ms"].items()), list(res["ort_ms"].items())
    for i in range(max(len(a), len(b))):
        left = f"{a[i][0]} | {a[i][1]:.3f}" if i < len(a) else " | "
        right = f"{b[i][0]} | {b[i][1]:.3f}" if i < len(b) else " | "
        md.append(f"| {left} | | {right} |")
    md.append(
        f"| **sum** | **{sum(res['ours_ms'].values()):.2f}** | | **sum** | **{sum(res['ort_ms'].values()):.2f}** |"
    )
    best = tuned_best(args.build.resolve())
    if best:
        md += in_network_vs_alone(res["functions"], best)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"network_split_{args.model}{'_int8' if args.int8 else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, **res}, indent=1))
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
