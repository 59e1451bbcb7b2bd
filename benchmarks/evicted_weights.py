"""Each conv kernel of two or more pick-best artifacts, warm and with its weights evicted.

The tuner times a candidate back to back: its weights stay in the caches from one run to
the next. Inside a network they do not: resnet18 fp32 streams about 50 MB of weights per
inference, and the layers between two runs of a conv evict its weights from L2 and, on a
shared host, from this VM's share of L3. So the same kernel is timed here both ways: warm,
and after a copy of `--evict` MB on this thread between runs (what the other layers do to
its weights; the copy also lets the pool's threads go idle, which the warm row does not
show). A nest that reads its weights from memory at a few FMAs per cache line loses most
when evicted; the table says by how much, per kernel, for each artifact side by side, all
timed in turn in the same rounds (this host drifts by tens of percent within minutes).

Artifacts are pick-best step directories of a pipeline store (each holds the best record of
every task of one build: `<store>/pipeline/steps/pick_best/<key>`, its build's manifest names
it as `inputs.best`); kernels are matched by workload, so two stores of one network line up.

    uv run python -m benchmarks.evicted_weights \\
        --records before=/store/pipeline/steps/pick_best/<key> --records after=<key2 dir> \\
        --out benchmarks/results/<run>

Writes evicted_weights.{md,json} into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.kernels import Kernel
from vta_pipeline.boards import machine
from vta_pipeline.passes.packed_ops import PACKED_CONV
from vta_pipeline.passes.winograd import GEMM
from vta_pipeline.spaces.packed_conv import NCHW_CONV

CONVS = (PACKED_CONV, GEMM, NCHW_CONV)  # a conv task's reduction block


def conv_records(pick_best: Path) -> dict[str, Any]:
    """{workload key: (task name, record)} of the artifact's conv tasks (the names from its
    best.json, by the pipeline's own key, `workload_keys.workload_key`)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.store.workload_keys import workload_key

    tasks = {t["workload_hash"]: t["task"] for t in json.loads((pick_best / "best.json").read_text())}
    db = ms.database.JSONDatabase(
        str(pick_best / "database_workload.json"), str(pick_best / "database_tuning_record.json"), allow_missing=False
    )
    found = {}
    for record in db.get_all_tuning_records():
        sch = Schedule(record.workload.mod)
        names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
        if names & set(CONVS):
            key = workload_key(record.workload.mod)
            found[key] = (tasks.get(key, key), record)
    return found


def built(record) -> Kernel:
    """The record's schedule built for its target, with arguments in the tuned layout."""
    from tvm.s_tir import Schedule

    sch = Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return Kernel(sch, record.target)


def evicted_ms(kernel: Kernel, evict: tuple[np.ndarray, np.ndarray] | None, runs: int) -> float:
    """Median ms of `runs` runs of the kernel, each after a copy of `evict` (None: back to back)."""
    times = []
    for _ in range(runs + 3):
        if evict is not None:
            np.copyto(evict[1], evict[0])
        start = time.perf_counter()
        kernel()
        times.append(time.perf_counter() - start)
    return float(np.median(times[3:])) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--records",
        action="append",
        required=True,
        metavar="LABEL=DIR",
        help="a pick-best step directory, and the label of its column (two or more)",
    )
    ap.add_argument("--evict", default="0,64,256", help="MB copied between runs, comma-separated (0: back to back)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20, help="timed runs per kernel, eviction and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    artifacts = dict(item.split("=", 1) for item in args.records)
    if len(artifacts) < 2:
        raise SystemExit("give --records at least twice (LABEL=DIR): the artifacts to put side by side")
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    sizes = [int(s) for s in args.evict.split(",")]
    buffers = {mb: (np.ones(mb << 18, np.float32), np.empty(mb << 18, np.float32)) if mb else None for mb in sizes}
    records = {label: conv_records(Path(path)) for label, path in artifacts.items()}
    shared = [h for h in next(iter(records.values())) if all(h in r for r in records.values())]
    if not shared:
        raise SystemExit("the artifacts have no conv workload in common: are they of one network?")
    kernels = {h: {label: built(records[label][h][1]) for label in artifacts} for h in shared}
    times: dict[str, dict[str, dict[int, list[float]]]] = {
        h: {label: {mb: [] for mb in sizes} for label in artifacts} for h in shared
    }
    for r in range(args.rounds):
        for h in shared:
            for mb in sizes:
                for label in artifacts:  # in turn: the artifacts see the same minutes
                    times[h][label][mb].append(evicted_ms(kernels[h][label], buffers[mb], args.runs))
        print(f"round {r + 1}/{args.rounds}", flush=True)
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "artifacts": artifacts,
        "evict_mb": sizes,
        "runs": args.runs,
        "rounds": args.rounds,
    }
    rows = []
    for h in shared:
        name = records[next(iter(artifacts))][h][0]
        rows.append(
            {
                "task": name,
                "ms": {label: {mb: float(np.median(v)) for mb, v in per.items()} for label, per in times[h].items()},
            }
        )
    labels = list(artifacts)
    head = [f"{label} {mb} MB" if mb else f"{label} warm" for mb in sizes for label in labels]
    md = [
        f"Each conv kernel of {', '.join(labels)} (pick-best records), timed warm (back to back) and after a copy "
        f"of {', '.join(str(s) for s in sizes if s)} MB between runs, the artifacts in turn, medians over "
        f"{args.rounds} rounds of {args.runs} runs, ms; on {meta.get('cpu', '?')} "
        f"({', '.join(meta.get('isa', []))}), {args.threads} threads.",
        "",
        "| task | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    for row in sorted(rows, key=lambda r: -max(r["ms"][labels[0]].values())):
        md.append(
            f"| {row['task'][:48]} | "
            + " | ".join(f"{row['ms'][label][mb]:.3f}" for mb in sizes for label in labels)
            + " |"
        )
    md += [
        "",
        "Sums: "
        + "; ".join(
            f"{'warm' if not mb else f'{mb} MB'}: "
            + ", ".join(f"{label} {sum(r['ms'][label][mb] for r in rows):.3f}" for label in labels)
            for mb in sizes
        )
        + " ms "
        "(each kernel once, not weighted by its calls in the network).",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "evicted_weights.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "evicted_weights.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
