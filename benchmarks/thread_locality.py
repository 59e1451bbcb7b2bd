"""Whether the host's threads pay for reading what another thread wrote: a chain of kernels
whose threads split the data the same way each time (by rows) against one whose threads
split it by channels, while the next kernel reads every channel (as a 1x1 conv does).

Each kernel writes Y[c, h, w] = (X[c, h, w] + X[C-1-c, h, w]) / 2 over a C x H x W float
tensor and the chain ping-pongs between two buffers. Split by rows, a thread reads only rows
it wrote itself one kernel earlier; split by channels, half of what it reads (the mirror
channels) the other thread wrote. On one CCD of a Zen 5 host the two threads share an L3 and
the difference is small; across two CCDs every such read crosses the Infinity Fabric.

Each round prints the host's two-thread copy bandwidth (the same probe as
`builds_in_turn.py`: on the Zen 5 VM it sat near 40 GB/s with both vCPUs on one CCD and near
65-75 across two) and the microseconds per kernel of each chain, best of 5 x 200 kernels:

    uv run python -m benchmarks.thread_locality --rounds 20 --out benchmarks/results/<run>

Writes thread_locality.{md,json} into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.lib.peaks import copy_gbps
from vta_pipeline.boards import machine


def kernels(channels: int, size: int):
    """The two kernels over [channels, size, size], compiled for this host: (by rows, by channels)."""
    import tvm
    from tvm.script import tirx as T

    C, H, W = channels, size, size

    @T.prim_func
    def rows(X: T.Buffer((C, H, W), "float32"), Y: T.Buffer((C, H, W), "float32")):
        for h in T.parallel(H):
            for c in range(C):
                for w in T.vectorized(W):
                    Y[c, h, w] = (X[c, h, w] + X[C - 1 - c, h, w]) * T.float32(0.5)

    @T.prim_func
    def chans(X: T.Buffer((C, H, W), "float32"), Y: T.Buffer((C, H, W), "float32")):
        for c in T.parallel(C):
            for h in range(H):
                for w in T.vectorized(W):
                    Y[c, h, w] = (X[c, h, w] + X[C - 1 - c, h, w]) * T.float32(0.5)

    from vta_pipeline.targets import resolve_target

    target = tvm.target.Target(resolve_target("host").target_json)
    return tuple(tvm.compile(tvm.IRModule({"main": f}), target=target)["main"] for f in (rows, chans))


def chain_us(kernel, a, b, n: int = 200, repeat: int = 5) -> float:
    """Microseconds per kernel of a chain of 2n kernels ping-ponging between `a` and `b`."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            kernel(a, b)
            kernel(b, a)
        best = min(best, (time.perf_counter() - t) / (2 * n))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--size", type=int, default=56, help="H = W of the tensor")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import torch
    import tvm

    torch.set_num_threads(args.threads)
    rows, chans = kernels(args.channels, args.size)
    dev = tvm.cpu()
    shape = (args.channels, args.size, args.size)
    a = tvm.runtime.tensor(np.random.default_rng(0).random(shape, dtype=np.float32), dev)
    b = tvm.runtime.tensor(np.zeros(shape, np.float32), dev)
    out: dict[str, list[float]] = {"host_copy_gbps": [], "rows_us": [], "channels_us": []}
    for r in range(args.rounds):
        out["host_copy_gbps"].append(copy_gbps())
        time.sleep(0.5)
        out["rows_us"].append(chain_us(rows, a, b))
        out["channels_us"].append(chain_us(chans, a, b))
        print(
            f"round {r}: host copy {out['host_copy_gbps'][-1]:.0f} GB/s, by rows {out['rows_us'][-1]:.1f} us, "
            f"by channels {out['channels_us'][-1]:.1f} us per kernel",
            flush=True,
        )
        time.sleep(0.5)
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "shape": list(shape),
        "commit": machine.source_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    gbps = np.array(out["host_copy_gbps"])
    mid = (gbps.max() + gbps.min()) / 2
    md = [
        f"A chain of {shape} float kernels, each reading a channel and its mirror, split between {args.threads} "
        f"threads by rows or by channels; {args.rounds} rounds, {meta['date']}, {meta.get('cpu', '?')} "
        f"({', '.join(meta.get('isa', []))}), commit {meta['commit']}.",
        "",
        "| host copy GB/s (median) | rounds | by rows, us per kernel | by channels, us per kernel |",
        "|---|---|---|---|",
    ]
    for part in (gbps <= mid, gbps > mid) if gbps.max() / gbps.min() >= 1.3 else (gbps > 0,):
        if part.any():
            md.append(
                f"| {np.median(gbps[part]):.0f} | {int(part.sum())} | "
                f"{np.median(np.array(out['rows_us'])[part]):.1f} | "
                f"{np.median(np.array(out['channels_us'])[part]):.1f} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "thread_locality.json").write_text(json.dumps({"meta": meta, **out}, indent=1))
    (args.out / "thread_locality.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
