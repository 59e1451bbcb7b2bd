"""The cycle model fitted to, and checked against, a Pynq-Z1's measured VTA latencies (TopHub).

Replays TopHub's tuned configs (`vta.tophub`) through our compiler and the simulator under the
hardware's rules, with the epilogue AutoTVM measured, and:
1. fits: a grid over the DRAM rate (input loads and stores), the weight-load rate and the
   per-row DMA set-up, minimising the largest per-conv error on resnet18's ten workloads on the
   1x16x16 Pynq core (`pynq_1x16_i8w8a32_15_15_18_17`), the 19 convs' total beside it;
2. checks, unfitted, under `CycleModel()` as it ships: resnet18 on the 4x8x8 core, the grouped
   MobileNet-G and Resnet-50 on the 1x16x16 core.
Writes `vta_calibrate.json` / `vta_calibrate.md` to --out. Simulated cycles: the host and its
threads do not change them.

    uv run python -m benchmarks.vta_calibrate --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import asdict
from pathlib import Path

from vta_pipeline.boards import machine
from vta_pipeline.vta import conv, tophub
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.simulator import STRICT, CycleModel, Dram, Simulator

GRID = {
    "dram_bytes_per_cycle": [3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7, 8],
    "wgt_bytes_per_cycle": [2.5, 3, 3.25, 3.5, 3.75, 4, 4.5],
    "dma_setup_cycles": [0, 16, 24, 32, 40, 48, 64],
}


def replay_ms(record: tophub.TophubRecord, model: CycleModel) -> float:
    cfg = tophub.config_of(record.vta_model)
    dram = Dram()
    prog = conv.compile_conv(record.workload, record.knobs, tophub.MEASURED_EPILOGUE, cfg, dram)
    stats = Simulator(cfg, model, functional=False, rules=STRICT).run(prog.instructions, dram)
    return stats.cycles / model.clock_hz * 1e3


def rows_of(records: list[tophub.TophubRecord], model: CycleModel) -> list[dict]:
    return [
        {
            "workload": "x".join(map(str, r.key)) + (f" g{r.workload.groups}" if r.workload.groups > 1 else ""),
            "count": tophub.RESNET18_COUNTS.get(r.key, 1) if r.network == "Resnet-18" else 1,
            "measured_ms": r.seconds * 1e3,
            "model_ms": (ms := replay_ms(r, model)),
            "error": ms / (r.seconds * 1e3) - 1,
            "knobs": r.knobs.to_dict(),
        }
        for r in records
    ]


def summary(rows: list[dict]) -> dict:
    measured = sum(r["measured_ms"] * r["count"] for r in rows)
    model = sum(r["model_ms"] * r["count"] for r in rows)
    return {
        "convs": len(rows),
        "measured_total_ms": measured,
        "model_total_ms": model,
        "total_error": model / measured - 1,
        "max_abs_error": max(abs(r["error"]) for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.time()
    fit_set = tophub.resnet18(VTAConfig())
    fits = []
    for values in itertools.product(*GRID.values()):
        model = CycleModel(**dict(zip(GRID, values)))
        rows = rows_of(fit_set, model)
        fits.append({**dict(zip(GRID, values)), **summary(rows)})
    fits.sort(key=lambda f: (f["max_abs_error"], abs(f["total_error"])))
    print("best fits (largest per-conv error, total error):")
    for f in fits[:5]:
        print(f"  {f['dram_bytes_per_cycle']} B/cycle, weights {f['wgt_bytes_per_cycle']}, setup "
              f"{f['dma_setup_cycles']}: {f['max_abs_error']:.1%}, total {f['total_error']:+.1%}")  # fmt: skip

    shipped = CycleModel()
    checks = {
        "Resnet-18, 1x16x16 (fitted)": fit_set,
        "Resnet-18, 4x8x8 (held out)": tophub.resnet18(tophub.config_of("pynq_4x8_i8w8a32_15_16_16_18")),
        "MobileNet-G, 1x16x16, grouped (held out)": [r for r in tophub.records() if r.network == "MobileNet-G"],
        "Resnet-50, 1x16x16 (held out)": [r for r in tophub.records() if r.network == "Resnet-50"],
    }
    sets = {}
    for name, records in checks.items():
        rows = rows_of(records, shipped)
        sets[name] = {"summary": summary(rows), "rows": rows}
        s = sets[name]["summary"]
        print(f"{name}: {s['convs']} convs, model {s['model_total_ms']:.1f} ms vs measured "
              f"{s['measured_total_ms']:.1f} ({s['total_error']:+.1%}), largest per-conv error "
              f"{s['max_abs_error']:.1%}")  # fmt: skip
    res = {
        "commit": machine.source_commit(),
        **machine.cpu(),
        "threads": 1,
        "cycle_model": asdict(shipped),
        "grid": GRID,
        "best_fits": fits[:10],
        "sets": sets,
        "seconds": round(time.time() - t0, 1),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vta_calibrate.json").write_text(json.dumps(res, indent=1))
        lines = [f"Cycle model as shipped: {asdict(shipped)}", ""]
        for name, s in sets.items():
            lines += [
                f"### {name}",
                "",
                "| workload (H Ci Co k s) | x | measured ms | model ms | error |",
                "|---|---|---|---|---|",
                *(
                    f"| {r['workload']} | {r['count']} | {r['measured_ms']:.3f} | {r['model_ms']:.3f} | "
                    f"{r['error']:+.1%} |"
                    for r in s["rows"]
                ),
                f"| **total** | | **{s['summary']['measured_total_ms']:.2f}** | **{s['summary']['model_total_ms']:.2f}** "
                f"| **{s['summary']['total_error']:+.1%}** |",
                "",
            ]
        (args.out / "vta_calibrate.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
