"""Two or more of our builds of one network, timed in turn with ONNX Runtime's: an A/B of a
change to the pipeline, on this host's noisy minutes.

`compare.py` times one build per row beside ONNX Runtime; when a change is about a few
percent (a kernel of 0.1 ms in a network of 3 ms), a build from before it and one from after
must be timed in the same minutes as each other and as the reference, or the host's drift
(1.4x within minutes here) says more than the change. Each round times every build (the
best of `--repeat` x `--number` runs through the Relax VM's time evaluator), then ONNX
Runtime (the best of as many runs, wall clock per run), 0.5 s apart so that no engine's
thread pool is still spinning when the next starts. The reference is `compare.py`'s own
(`References`: its export, input and quantization), and both thread pools spin between
kernels as they do by default (as in `compare.py`'s side-by-side timing): with spinning
off, every kernel of ours waits for its threads to wake, a cost a deployed network does
not pay. The medians over rounds, and each build's ratio to ONNX Runtime per round, are
what to read.

Each round also measures the host: a copy of 256 MB on the same threads (`host_copy_gbps`).
On the shared Zen 5 VM here it sat at one of two levels, about 45 or 80 GB/s, switching every
few minutes, and our resnet18 fp32 builds ran 1.12-1.26x slower at the higher one while ONNX
Runtime's moved 1% (40 rounds, `results/zen5_all_f010123/host`): the host moves the two vCPUs
between placements that our kernels feel and MLAS's hardly do. When the rounds fall into two such levels, the report
gives each build's ratio in each.

    uv run python -m benchmarks.builds_in_turn --model mobilenet_v2 --int8 \\
        --build before=/store/pipeline/steps/build/<key>/model.so \\
        --build after=/store/pipeline/steps/build/<key2>/model.so --out benchmarks/results/<run>

Writes builds_in_turn_<model>[_int8].{md,json} into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.lib.models import MODELS
from benchmarks.lib.peaks import HOST_PROBE_BYTES, copy_gbps
from benchmarks.lib.references import References, references
from vta_pipeline.boards import machine

PAUSE_S = 0.5
HOST_STATES_APART = 1.3  # the probe's fastest and slowest rounds this far apart: two host states


def best_wall_ms(fn: Callable[[], Any], number: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return 1e3 * min(times)


def in_turn(
    builds: dict[str, Path], refs: References, engine: str, rounds: int, number: int, repeat: int
) -> dict[str, list]:
    """ms per round of each build and of `engine` (compare.py's reference sessions: the same
    export, input, quantization and session options the goals are judged with)."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    xt = tvm.runtime.tensor(refs.feed["data"], dev)
    timers = {}
    for name, lib in builds.items():
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
        timers[name] = vm.time_evaluator("main", dev, number=number, repeat=repeat)
    sess = refs.session(engine)
    ort = lambda: sess.run(None, refs.feed)  # noqa: E731
    ort()
    times: dict[str, list[float]] = {k: [] for k in (*builds, "ort", "host_copy_gbps")}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(1e3 * min(timer(xt).results))
            time.sleep(PAUSE_S)
        times["ort"].append(best_wall_ms(ort, number, repeat))
        time.sleep(PAUSE_S)
        times["host_copy_gbps"].append(copy_gbps())
        time.sleep(PAUSE_S)
    return times


def report(times: dict[str, list[float]], meta: dict[str, Any]) -> list[str]:
    ref = References.INT8 if meta["int8"] else References.FP32
    md = [
        f"{meta['model']}{' int8' if meta['int8'] else ' fp32'}: our builds in turn with {ref}, {meta['rounds']} "
        f"rounds (each turn the best of {meta['repeat']} x {meta['number']} runs; ours by the Relax VM's time "
        f"evaluator, ONNX Runtime wall clock per run), {meta['date']}, on {meta.get('cpu', '?')} "
        f"({', '.join(meta.get('isa', []))}), {meta['threads']} threads, thread pools spinning (their defaults).",
        "",
        "| engine | median ms | fastest round ms | / ORT per round (median) | faster than ORT in |",
        "|---|---|---|---|---|",
    ]
    ort = times["ort"]
    builds = [name for name in times if name not in ("ort", "host_copy_gbps")]
    for name in builds:
        ms = times[name]
        ratio = [a / b for a, b in zip(ms, ort)]
        wins = sum(a < b for a, b in zip(ms, ort))
        md.append(
            f"| {name} ({meta['builds'][name]}) | {np.median(ms):.3f} | {min(ms):.3f} | "
            f"{np.median(ratio):.3f} | {wins} of {len(ms)} rounds |"
        )
    md.append(f"| {ref} | {np.median(ort):.3f} | {min(ort):.3f} | 1 | - |")
    return md + by_host_state(times, builds)


def by_host_state(times: dict[str, list[float]], builds: list[str]) -> list[str]:
    """The rounds split at the middle of the host probe's range, when it spans two states."""
    gbps = np.array(times["host_copy_gbps"])
    if gbps.size == 0 or gbps.max() / gbps.min() < HOST_STATES_APART:
        return []
    mid = (gbps.max() + gbps.min()) / 2
    md = [
        "",
        f"The host's copy bandwidth ({HOST_PROBE_BYTES >> 20} MB, each round) took two levels; the rounds at each:",
        "",
        "| host copy GB/s (median) | rounds | " + " | ".join(f"{b} ms / ORT ms" for b in builds) + " |",
        "|---|---|" + "---|" * len(builds),
    ]
    for part in (gbps <= mid, gbps > mid):
        ort = np.median(np.array(times["ort"])[part])
        ours = [np.median(np.array(times[b])[part]) for b in builds]
        cells = [f"{ms:.3f} / {ort:.3f} = {ms / ort:.3f}" for ms in ours]
        md.append(f"| {np.median(gbps[part]):.0f} | {int(part.sum())} | " + " | ".join(cells) + " |")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="mobilenet_v2",
        choices=sorted(MODELS),
        help="the torchvision model the builds were made from",
    )
    ap.add_argument(
        "--build",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a build's model.so, named (repeat: two or more)",
    )
    ap.add_argument("--int8", action="store_true", help="compare with ONNX Runtime int8 (U8S8 QDQ), not fp32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    builds = {}
    for item in args.build:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            ap.error(f"--build {item!r}: give NAME=PATH of a built model.so that exists")
        builds[name] = Path(path)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    refs = references(args.model, args.threads, seed=0)
    engine = References.INT8 if args.int8 else References.FP32
    times = in_turn(builds, refs, engine, args.rounds, args.number, args.repeat)
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "model": args.model,
        "int8": args.int8,
        "builds": {k: str(v) for k, v in builds.items()},
        "rounds": args.rounds,
        "number": args.number,
        "repeat": args.repeat,
        "commit": machine.source_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    md = report(times, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"builds_in_turn_{args.model}{'_int8' if args.int8 else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "ms": times}, indent=1))
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
