"""The recipe's ten resnet18 conv workloads on the VTA simulator: untuned vs knob-tuned.

For each workload (with the epilogue our quantize pass fuses: bias, requantize, ReLU), the
untuned config (AutoTVM's fallback) and the best of a knob search, each compiled to VTA
instructions and timed by the simulator's cycle model at the Pynq's 100 MHz; GOPS against
VTA's peak (BATCH x BLOCK_IN x BLOCK_OUT x 2 ops per cycle). The best config of each is then
run functionally and checked bit for bit against numpy. Prints a table and writes
`vta_knobs.json` / `vta_knobs.md` to --out.

    uv run python -m benchmarks.vta_knobs --trials 32 --strategy xgb --out DIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.lib.vta import EPILOGUE, RESNET18
from vta_pipeline.boards import machine
from vta_pipeline.vta import conv
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.conv import ConvWorkload
from vta_pipeline.vta.simulator import CycleModel, Dram, Simulator
from vta_pipeline.vta.tuner import KnobTuner, local_measure

ROOT = Path(__file__).resolve().parent.parent


def check_exact(wl: ConvWorkload, k: conv.Knobs, cfg: VTAConfig) -> bool:
    rng = np.random.default_rng(0)
    cib, cob = wl.in_filter // 16, wl.out_filter // 16
    t = {
        "data": rng.integers(-127, 128, (1, cib, wl.height, wl.width, 1, 16)).astype(np.int8),
        "kernel": rng.integers(-127, 128, (cob, cib, wl.kh, wl.kw, 16, 16)).astype(np.int8),
        "bias": rng.integers(-4000, 4000, (1, cob, 1, 1, 1, 16)).astype(np.int32),
    }
    dram = Dram()
    prog = conv.compile_conv(wl, k, EPILOGUE, cfg, dram)
    out, _ = conv.run_conv(prog, dram, Simulator(cfg), t)
    return bool(np.array_equal(out, conv.reference(wl, EPILOGUE, t["data"], t["kernel"], t["bias"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--strategy", default="xgb", choices=["grid", "random", "xgb"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg, model = VTAConfig(), CycleModel()
    peak = cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT * 2 * model.clock_hz / 1e9
    rows, t0 = [], time.time()
    with tempfile.TemporaryDirectory() as work:
        for i, spec in enumerate(RESNET18):
            wl = ConvWorkload(*spec)
            ts = time.time()
            tuner = KnobTuner(
                wl,
                EPILOGUE,
                cfg,
                Path(work) / str(i),
                local_measure(wl, EPILOGUE, cfg, model),
                strategy=args.strategy,
                seed=args.seed,
            )
            untuned = tuner.default_ms()
            best, ms = tuner.tune(args.trials)
            gops = wl.ops() / (ms / 1e3) / 1e9
            rows.append(
                {
                    "workload": spec,
                    "gop": wl.ops() / 1e9,
                    "space": len(tuner.space),
                    "untuned_ms": untuned,
                    "tuned_ms": ms,
                    "speedup": untuned / ms,
                    "gops": gops,
                    "of_peak": gops / peak,
                    "knobs": asdict(best),
                    "tune_s": time.time() - ts,
                    "bit_exact": check_exact(wl, best, cfg),
                }
            )
            r = rows[-1]
            print(
                f"{str(spec):<44} space {r['space']:5d}  untuned {untuned:9.3f} ms  tuned {ms:7.3f} ms "
                f"({r['speedup']:5.1f}x)  {gops:5.1f} GOPS ({100 * r['of_peak']:4.1f}% of {peak:.1f})  "
                f"exact {r['bit_exact']}  {r['tune_s']:.0f} s",
                flush=True,
            )
    total_u, total_t = sum(r["untuned_ms"] for r in rows), sum(r["tuned_ms"] for r in rows)
    gop = sum(r["gop"] for r in rows)
    meta = {
        "commit": machine.source_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **machine.cpu(),
        "trials": args.trials,
        "strategy": args.strategy,
        "cycle_model": asdict(model),
        "peak_gops": peak,
        "seconds": time.time() - t0,
    }
    summary = {
        "untuned_ms": total_u,
        "tuned_ms": total_t,
        "gops": gop / (total_t / 1e3),
        "of_peak": gop / (total_t / 1e3) / peak,
    }
    print(
        f"all ten: untuned {total_u:.2f} ms, tuned {total_t:.2f} ms ({total_u / total_t:.1f}x), "
        f"{summary['gops']:.1f} GOPS ({100 * summary['of_peak']:.1f}% of peak); {meta['seconds']:.0f} s in all"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vta_knobs.json").write_text(json.dumps({"meta": meta, "rows": rows, "all": summary}, indent=1))
        lines = [
            f"VTA simulator (cycle model at {model.clock_hz / 1e6:.0f} MHz, peak {peak:.1f} GOPS), "
            f"{args.strategy} search, {args.trials} trials per workload; commit {meta['commit']}, "
            f"{meta['date']}, simulated on {meta['cpu']} (the cycles do not depend on it).",
            "",
            "| workload | GOP | configs | untuned ms | tuned ms | speed-up | GOPS | % of peak | bit-exact |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['workload']} | {r['gop']:.3f} | {r['space']} | {r['untuned_ms']:.3f} | "
                f"{r['tuned_ms']:.3f} | {r['speedup']:.1f}x | {r['gops']:.1f} | {100 * r['of_peak']:.1f} | "
                f"{r['bit_exact']} |"
            )
        lines.append(
            f"| all ten | {gop:.3f} | | {total_u:.2f} | {total_t:.2f} | {total_u / total_t:.1f}x | "
            f"{summary['gops']:.1f} | {100 * summary['of_peak']:.1f} | |"
        )
        (args.out / "vta_knobs.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
