"""Every schedule of the packed-conv design space for one conv task, beside what the search kept.

`conv_gap.py` says our tuned kernel and ONNX Runtime's are even when each runs alone; this
says whether the search found the best its design space (`vta_pipeline.spaces.packed_conv`)
holds. The space is small enough to walk whole for a conv (for a 7x7 512->512 conv: 168
schedules that fit the vector registers): every combination of its sampled decisions (tile
over output channels, rows, width or pixels, unroll depth) is replayed, built and timed
once (hot, as the tuner times: `time_evaluator` best of 3 x 10 runs). Then the fastest few,
the search's kept record and ONNX Runtime's one-conv model of the same shape are timed
one run of each in turn, in rounds (as `conv_gap.py` does: the host moves 1.5x within
minutes), and each is also timed hot and with its weights and output flushed from the
caches (MetaSchedule's `cache_flush_cpu_non_first_arg`, the tuner's `enable_cpu_cache_flush`).

    uv run python -m benchmarks.space_sweep --run benchmarks/results/<dir> --store <its --store> \\
        --what "resnet18 fp32 packed stem-packed" --conv "7x7x512->512 3x3/1"

`--conv` is a `conv_gap.conv_key` (input HxWxC->OC, window/stride, "+res" for a fused
residual add). Writes space_sweep_<conv>.{md,json} into --out (default: the --run directory).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.lib.kernels import (
    SPIN,
    Kernel,
    alternating,
    conv_model,
    kept_record,
    ort_session,
    task_conv_key,
    tuned_tasks,
)
from vta_pipeline.boards import machine


def decision_choices(inst, decision) -> list[Any]:
    """Every value a sampling instruction of the space could have drawn: a categorical's
    indices, or a two-level perfect tile's (outer, inner) pairs up to its innermost limit."""
    if inst.kind.name == "SampleCategorical":
        return list(range(len(inst.attrs[0])))
    extent, most = int(np.prod([int(d) for d in decision])), int(inst.attrs[1])
    return [[extent // f, f] for f in range(1, min(most, extent) + 1) if extent % f == 0]


def every_schedule(workload, target) -> list[tuple[str, Any]]:
    """(label, schedule) for every point of the task's packed-conv design spaces that passes
    the space's postprocessors (the register limit among them), in the tuner's own form."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.spaces import packed_conv as packed_conv_space

    ctx = ms.TuneContext(
        mod=workload,
        target=target,
        task_name="sweep",
        space_generator=packed_conv_space.space_generator(target, "float"),
    )
    out = []
    for s, space in enumerate(ctx.space_generator.generate_design_space(workload)):
        trace = space.trace
        insts = [i for i in trace.insts if i.kind.name in ("SampleCategorical", "SamplePerfectTile")]
        for combo in itertools.product(*(decision_choices(i, trace.decisions[i]) for i in insts)):
            point = trace
            for inst, value in zip(insts, combo):
                point = point.with_decision(inst, value, remove_postproc=True)
            sch = Schedule(workload)
            point.apply_to_schedule(sch, remove_postproc=True)
            if all(p.apply(sch) for p in ctx.space_generator.postprocs):
                out.append((f"space {s} decisions {[str(c) for c in combo]}", sch))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a compare.py --out directory")
    ap.add_argument("--store", type=Path, required=True, help="the --store that run tuned into")
    ap.add_argument("--what", default="resnet18 fp32 packed stem-packed", help="which tuned network of the run")
    ap.add_argument("--conv", required=True, help='the conv task, as conv_gap.py names it ("7x7x512->512 3x3/1")')
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=4, help="the sweep's fastest schedules timed again in turn")
    ap.add_argument("--runs", type=int, default=20, help="runs per engine and round, in turn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, help="where space_sweep_<conv>.{md,json} go (default: --run)")
    args = ap.parse_args()
    os.environ.update(SPIN, TVM_NUM_THREADS=str(args.threads))

    tasks = tuned_tasks(args.run, args.store, args.what)
    found = [t for t in tasks if task_conv_key(t) == args.conv]
    if not found:
        keys = sorted({task_conv_key(t) for t in tasks})
        raise SystemExit(f"no tuned conv task {args.conv!r} of {args.what!r} in {args.run}; its convs: {keys}")
    task = found[0]
    workload, db, best, kept = kept_record(task)
    searched = Kernel(kept, best.target)
    trials = len(db.get_all_tuning_records())

    swept: list[dict[str, Any]] = []
    for label, sch in every_schedule(workload, best.target):
        try:
            kernel = Kernel(sch, best.target)
        except Exception as err:  # noqa: BLE001 - a schedule that does not build is a row, not an abort
            swept.append({"schedule": label, "error": str(err).splitlines()[0][:200]})
            continue
        swept.append({"schedule": label, "hot_ms": kernel.hot_ms(), "kernel": kernel})
        print(f"{label}: {swept[-1]['hot_ms']:.3f} ms", flush=True)
    built = sorted((s for s in swept if "kernel" in s), key=lambda s: s["hot_ms"])

    model, x, flops = conv_model(*task["workload"])
    sess = ort_session(model, args.threads)
    ort = "ONNX Runtime one-conv"
    fns: dict[str, Callable[[], Any]] = {
        ort: lambda: sess.run(None, {"x": x}),
        f"search's kept record (best of {trials} records)": searched,
    }
    fns.update({f"sweep #{i + 1}: {s['schedule']}": s["kernel"] for i, s in enumerate(built[: args.top])})
    rounds = [alternating(fns, args.runs) for _ in range(args.rounds)]
    rows = []
    for name, fn in fns.items():
        row = {
            "name": name,
            "in_turn_ms": float(np.median([r[name] for r in rounds])),
            "vs_ort_per_round": [r[name] / r[ort] for r in rounds],
        }
        if isinstance(fn, Kernel):
            row |= {
                "hot_ms": float(np.median([fn.hot_ms() for _ in range(3)])),
                "cold_ms": float(np.median([fn.cold_ms() for _ in range(3)])),
            }
        rows.append(row)

    hots = [s["hot_ms"] for s in built]
    meta = {
        **machine.cpu(),
        "threads": args.threads,
        "run": str(args.run),
        "what": args.what,
        "conv": args.conv,
        "task": task["task"],
        "workload": task["workload"],
        "gflop": flops / 1e9,
        "search_trials": trials,
        "schedules": len(swept),
        "failed": sum("error" in s for s in swept),
        "hot_ms_min_median_max": [min(hots), float(np.median(hots)), max(hots)],
    }
    md = [
        f"{args.what}, conv {args.conv} (`{task['task']}`): every schedule of the packed-conv space "
        f"({len(swept)} that fit the registers, {meta['failed']} failed to build) timed hot once (min "
        f"{min(hots):.3f}, median {np.median(hots):.3f}, max {max(hots):.3f} ms), then the fastest {args.top}, the "
        f"search's kept record and ONNX Runtime's one-conv model one run of each in turn, {args.rounds} rounds of "
        f"{args.runs} runs, on {meta.get('cpu', '?')} ({', '.join(meta.get('isa', []))}), {args.threads} threads.",
        "",
        "| kernel | in turn ms (median over rounds) | / ORT (range over rounds) | hot ms | weights flushed ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = min(r["vs_ort_per_round"]), max(r["vs_ort_per_round"])
        md.append(
            f"| {r['name']} | {r['in_turn_ms']:.3f} | {np.median(r['vs_ort_per_round']):.2f} "
            f"({lo:.2f}-{hi:.2f}) | {r.get('hot_ms', float('nan')):.3f} | {r.get('cold_ms', float('nan')):.3f} |"
        )
    out = args.out or args.run
    out.mkdir(parents=True, exist_ok=True)
    stem = "space_sweep_" + re.sub(r"[^0-9a-z+]+", "_", args.conv.lower()).strip("_")
    swept_json = [{k: v for k, v in s.items() if k != "kernel"} for s in swept]
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "swept": swept_json}, indent=1))
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
