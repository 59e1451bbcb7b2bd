"""Networks nobody here tuned before, on the defaults: ours / ONNX Runtime fp32, timed in turn, cold.

What a new user gets: `vta-pipeline run` with a budget and nothing else (no layout flag: the
default preset, O2), from a store of its own and no records library, one network after the
other. The ratio is the run's own: its tuned build and ONNX Runtime fp32 on the same ONNX
model, input and cores, round by round in turn (`vta_pipeline.baseline`), so every row's two
numbers saw the same minutes of this shared host.

The networks cover the shapes a user brings: channel concats (squeezenet1_1, googlenet),
grouped convs (regnet_x_400mf), depthwise + squeeze-excitation + swish / hardswish
(efficientnet_b0, mobilenet_v3_small), channel split and shuffle with odd channel counts
(shufflenet_v2_x1_0), a backbone that ends in a conv (mnasnet0_5's trunk, as a detector takes
it, from an ONNX file written here), and the two-conv ONNX network whose 72 / 120 / 40
channels no block of 16 divides.

    uv run python -m benchmarks.unseen --trials 32 --out benchmarks/results/unseen_<cpu>_<commit>
    uv run python -m benchmarks.unseen --networks two_conv,squeezenet1_1 --trials 8   # a quick look

Results: unseen.json and unseen.md in --out (the CPU, LLVM mcpu, ISA flags, threads, commit
and budget with them); each network's store stays under --store for conv_gap.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from vta_pipeline.boards import machine

ROOT = Path(__file__).resolve().parent.parent


def _two_conv(path: Path) -> tuple[int, ...]:
    import torch
    from torch import nn

    class TwoConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(72, 120, 3, padding=1), nn.Conv2d(120, 40, 1)

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))))

    return _export(TwoConv(), (1, 72, 36, 36), path)


def _mnasnet_trunk(path: Path) -> tuple[int, ...]:
    import torchvision

    return _export(torchvision.models.mnasnet0_5(weights=None).layers, (1, 3, 224, 224), path)


def _export(model, shape: tuple[int, ...], path: Path) -> tuple[int, ...]:
    import torch

    torch.manual_seed(0)
    for p in model.parameters():  # random weights of a sensible scale, as the zoo models get
        torch.nn.init.normal_(p, std=0.05) if p.dim() > 1 else torch.nn.init.zeros_(p)
    torch.onnx.export(
        model.eval(),
        (torch.randn(shape),),
        str(path),
        input_names=["data"],
        output_names=["out"],
        opset_version=17,
        dynamo=False,
    )
    return shape


# name -> ("torchvision", None) or ("onnx", a writer of the file that returns its input shape)
NETWORKS: dict[str, tuple[str, Callable[[Path], tuple[int, ...]] | None]] = {
    "two_conv": ("onnx", _two_conv),
    "squeezenet1_1": ("torchvision", None),
    "regnet_x_400mf": ("torchvision", None),
    "mobilenet_v3_small": ("torchvision", None),
    "shufflenet_v2_x1_0": ("torchvision", None),
    "mnasnet_trunk": ("onnx", _mnasnet_trunk),
    "efficientnet_b0": ("torchvision", None),
    "googlenet": ("torchvision", None),
}


def run_network(name: str, trials: int, store: Path, threads: int, extra: list[str]) -> dict[str, Any]:
    """`vta-pipeline run` on one network, as a user runs it; its result and wall time."""
    source, writer = NETWORKS[name]
    store.mkdir(parents=True, exist_ok=True)
    model = ["--source", "torchvision", "--model", name]
    if source == "onnx":
        path = store / f"{name}.onnx"
        shape = writer(path)
        model = ["--source", "onnx", "--onnx-path", str(path), "--input-shape", ",".join(map(str, shape))]
    argv = [
        sys.executable,
        "-m",
        "vta_pipeline.cli",
        "run",
        *model,
        "--trials-per-task",
        str(trials),
        "--allocation",
        "latency",
        "--records-library",
        "off",
        "--store",
        str(store),
        *extra,
    ]
    t0 = time.time()
    log = store / f"run-{int(t0)}.log"
    with log.open("w") as f:
        done = subprocess.run(
            argv, env=dict(os.environ, TVM_NUM_THREADS=str(threads)), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT
        )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (exit {done.returncode}); see {log}")
    runs = sorted((store / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return {"result": json.loads(runs[-1].read_text()), "wall_s": time.time() - t0, "log": str(log)}


def row(name: str, r: dict[str, Any]) -> dict[str, Any]:
    res, b = r["result"], r["result"].get("baseline") or {}
    layout = (res.get("transforms") or {}).get("cpu_layout") or {}
    tasks = res["tasks"]
    return {
        "network": name,
        "tasks": len(tasks),
        "trials": sum(t.get("trials", 0) for t in tasks),
        "convs": layout.get("convs"),
        "blocked_convs": layout.get("blocked_convs"),
        "layout_transforms": layout.get("transforms"),
        "winograd_convs": layout.get("winograd_convs"),
        "tuned_ms": res["tuned"]["median_ms"],
        "correct": res["tuned"]["correct"],
        "in_turn_ours_ms": b.get("ours_ms"),
        "in_turn_ort_ms": b.get("ort_ms"),
        "ratio": b.get("ratio"),
        "ort_absent": b.get("absent"),
        "wall_min": r["wall_s"] / 60,
        "run_id": res["run_id"],
        "slowest_tasks": sorted(
            ({"task": t["task"], "ms": (t.get("best_latency_ms") or 0) * t.get("weight", 1)} for t in tasks),
            key=lambda t: -t["ms"],
        )[:5],
    }


def table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# Unseen networks on the defaults, cold ({meta['cpu']}, LLVM `{meta['mcpu']}`, {meta['threads']} "
        f"threads, commit {meta['commit']}, {meta['trials_per_task']} trials/task on average, latency "
        f"allocation, no records library)",
        "",
        f"ISA: {' '.join(meta['isa'])}. {meta['date']}. Command: `{meta['command']}`",
        "",
        "| network | tasks | convs blocked | layout transforms | Winograd convs | trials | tuning + run, min "
        "| ours ms | ORT fp32 ms | ours / ORT | output | commit, date |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        when = f"{r.get('commit', meta['commit'])}, {r.get('date', meta['date'])}"
        ratio = f"**{r['ratio']:.2f}x**" if r.get("ratio") else r.get("ort_absent") or "-"
        lines.append(
            f"| {r['network']} | {r['tasks']} | {r['blocked_convs']}/{r['convs']} | {r['layout_transforms']} "
            f"| {r['winograd_convs']} | {r['trials']} | {r['wall_min']:.1f} | "
            f"{r['in_turn_ours_ms'] or r['tuned_ms']:.3f} | "
            f"{r['in_turn_ort_ms']:.3f} | {ratio} | {'correct' if r['correct'] else 'WRONG'} | {when} |"
            if r.get("in_turn_ort_ms")
            else f"| {r['network']} | {r['tasks']} | - | - | - | {r['trials']} | {r['wall_min']:.1f} | "
            f"{r['tuned_ms']:.3f} | - | {ratio} | {'correct' if r['correct'] else 'WRONG'} | {when} |"
        )
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines += [
            "",
            f"Geometric mean of ours / ORT over {len(ratios)} networks: **{gm:.3f}x**; at or below ORT: "
            f"{sum(x <= 1 for x in ratios)} of {len(ratios)}.",
        ]
    lines += ["", "Where each network's tuned time goes (task best ms x weight, the five largest):", ""]
    for r in rows:
        lines.append(f"- {r['network']}: " + ", ".join(f"{t['task']} {t['ms']:.3f}" for t in r["slowest_tasks"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default=",".join(NETWORKS), help=f"comma-separated, of {', '.join(NETWORKS)}")
    ap.add_argument("--trials", type=int, default=32, help="trials per task, on average (latency allocation)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--store", type=Path, default=Path("/tmp/vta-unseen"), help="one store per network under it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "unseen")
    ap.add_argument("--extra", default="", help="more `vta-pipeline run` flags for every network (e.g. '--opt O0')")
    args = ap.parse_args()
    from tvm.target import codegen

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        **machine.cpu(),
        "mcpu": codegen.llvm_get_system_cpu(),
        "threads": args.threads,
        "commit": machine.source_commit(),
        "trials_per_task": args.trials,
        "extra": args.extra,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python", *sys.argv]),
    }
    previous = args.out / "unseen.json"
    saved = json.loads(previous.read_text()) if previous.exists() else {"rows": []}
    rows = saved["rows"]
    if "meta" in saved:  # rows measured before this resume keep the commit and date they ran at
        first = saved["meta"]
        for r in rows:
            r.setdefault("commit", first["commit"])
            r.setdefault("date", first["date"])
    for name in [n for n in args.networks.split(",") if n]:
        if any(r["network"] == name for r in rows):  # a stopped run keeps what it measured
            continue
        print(f"{name}: tuning ...", flush=True)
        r = row(name, run_network(name, args.trials, args.store / name, args.threads, args.extra.split()))
        r.update(commit=meta["commit"], date=time.strftime("%Y-%m-%d %H:%M"))
        rows.append(r)
        print(
            f"{name}: ours {r['in_turn_ours_ms']} ms, ORT {r['in_turn_ort_ms']} ms, ratio {r['ratio']}, "
            f"{r['wall_min']:.1f} min",
            flush=True,
        )
        previous.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (args.out / "unseen.md").write_text(table(rows, meta))
    print(table(rows, meta))


if __name__ == "__main__":
    main()
