"""Our knob search against the recipe's own tuned configs, on the calibrated cycle model.

For each of resnet18's ten packed conv workloads, with the epilogue AutoTVM measured (the conv,
a shift by 8, the clip, the cast): TopHub's tuned config (its latency measured on a Pynq-Z1,
and the same config on our calibrated model), then our knob search (`vta.tuner.KnobTuner`, xgb)
twice in turn: cold (no TopHub: from the smallest legal tile) and warm (TopHub's configs
measured first, as the pipeline runs by default). Every config runs under the hardware's rules.
The totals weight each workload by how often resnet18 has it (19 convs). Writes
`vta_tophub.json` / `vta_tophub.md` to --out.

    uv run python -m benchmarks.vta_tophub --trials 64 --out DIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from vta_pipeline.boards import machine
from vta_pipeline.vta import tophub
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.simulator import CycleModel
from vta_pipeline.vta.tuner import KnobTuner, local_measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64, help="knob configs measured per workload and search")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg, model, epi, t0 = VTAConfig(), CycleModel(), tophub.MEASURED_EPILOGUE, time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rec in tophub.resnet18(cfg):
            wl, count = rec.workload, tophub.RESNET18_COUNTS[rec.key]
            (tophub_model,) = local_measure(wl, epi, cfg, model)([rec.knobs])
            row = {
                "workload": "x".join(map(str, rec.key)),
                "count": count,
                "tophub_measured_ms": rec.seconds * 1e3,
                "tophub_model_ms": tophub_model.ms,
                "tophub_knobs": rec.knobs.to_dict(),
            }
            for name, warm in (("cold", False), ("warm", True)):
                tuner = KnobTuner(
                    wl, epi, cfg, Path(tmp) / f"{row['workload']}-{name}", local_measure(wl, epi, cfg, model),
                    seed=args.seed, warm_start=warm,
                )  # fmt: skip
                start = time.time()
                knobs, ms = tuner.tune(args.trials)
                row[f"{name}_ms"], row[f"{name}_knobs"] = ms, knobs.to_dict()
                row[f"{name}_untuned_ms"] = tuner.default_ms()
                row[f"{name}_seconds"] = round(time.time() - start, 1)
            rows.append(row)
            print(
                f"{row['workload']:>18} x{count}: TopHub measured {row['tophub_measured_ms']:.2f} ms, on the model "
                f"{row['tophub_model_ms']:.2f}; ours cold {row['cold_ms']:.2f}, warm {row['warm_ms']:.2f} ms",
                flush=True,
            )
    totals = {
        k: sum(r[k] * r["count"] for r in rows)
        for k in ("tophub_measured_ms", "tophub_model_ms", "cold_ms", "warm_ms", "cold_untuned_ms")
    }
    print("19 convs:", {k: round(v, 2) for k, v in totals.items()})
    res = {
        "commit": machine.source_commit(),
        **machine.cpu(),
        "threads": 1,  # simulated cycles: the host's threads do not change them
        "trials": args.trials,
        "seed": args.seed,
        "cycle_model": CycleModel().__dict__,
        "seconds": round(time.time() - t0, 1),
        "totals_ms": totals,
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vta_tophub.json").write_text(json.dumps(res, indent=1))
        lines = [
            f"resnet18's 19 packed convs, AutoTVM's measured epilogue; calibrated model; {args.trials} trials per "
            "search (xgb); ms at 100 MHz",
            "",
            "| workload (H Ci Co k s) | x | TopHub measured | TopHub on the model | ours cold | ours warm | "
            "untuned (cold start) |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {r['workload']} | {r['count']} | {r['tophub_measured_ms']:.2f} | {r['tophub_model_ms']:.2f} | "
                f"{r['cold_ms']:.2f} | {r['warm_ms']:.2f} | {r['cold_untuned_ms']:.2f} |"
                for r in rows
            ),
            f"| **19 convs** | | **{totals['tophub_measured_ms']:.1f}** | **{totals['tophub_model_ms']:.1f}** | "
            f"**{totals['cold_ms']:.1f}** | **{totals['warm_ms']:.1f}** | {totals['cold_untuned_ms']:.1f} |",
        ]
        (args.out / "vta_tophub.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
