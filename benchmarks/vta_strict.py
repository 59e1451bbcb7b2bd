"""Our VTA streams against the hardware's rules: which compiled convs a VTA bitstream would run.

For each conv workload of resnet18 and of mobilenet_v2's packed region (its depthwise convs
included), with the plain epilogue (bias, requantize, ReLU) and, for the workloads whose convs
add a residual, with the residual epilogue: the
untuned config and every config of the knob space (or `--sample` of them), compiled and run
under the simulator's hardware rules (`simulator.STRICT`: in-order dispatch into 512-entry
command queues, no ACC_8BIT load, VerifyDep, the shift range, the Chisel micro-op memory).
Prints, per workload and epilogue, how many configs pass and which rule the others break;
writes `vta_strict.json` / `vta_strict.md` to --out.

    uv run python -m benchmarks.vta_strict --sample 64 --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

from benchmarks.lib.vta import EPILOGUE, MOBILENET_V2, RESIDUAL_EPILOGUE, RESNET18
from vta_pipeline.boards import machine
from vta_pipeline.vta import conv
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.conv import ConvWorkload
from vta_pipeline.vta.simulator import STRICT, DeadlockError, Dram, HardwareRuleError, Simulator, StreamError

RULES = [  # (rule, what its message says)
    ("in-order dispatch", r"command queue"),
    ("no ACC_8BIT load", r"no ACC_8BIT load"),
    ("VerifyDep", r"VerifyDep"),
    ("shift range", r"shift immediate"),
    ("micro-op memory", r"micro-op memory"),
]


def rule_of(e: StreamError) -> str:
    for name, pattern in RULES:
        if re.search(pattern, str(e)):
            return name
    return "deadlock (tokens)" if isinstance(e, DeadlockError) else f"other: {str(e)[:80]}"


def verdict(wl: ConvWorkload, k: conv.Knobs, epi: conv.Epilogue, cfg: VTAConfig) -> str:
    dram = Dram()
    prog = conv.compile_conv(wl, k, epi, cfg, dram)
    try:
        Simulator(cfg, functional=False, rules=STRICT).run(prog.instructions, dram)
    except (HardwareRuleError, StreamError) as e:
        return rule_of(e)
    return "passes"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=64, help="configs per workload and epilogue (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg, rng, t0 = VTAConfig(), random.Random(args.seed), time.time()
    rows = []
    workloads = [("resnet18", spec, spec[5] == 3 and spec[9] == 1) for spec in RESNET18]  # residual: 3x3 s1
    workloads += [("mobilenet_v2", spec, residual) for spec, residual in MOBILENET_V2]
    for network, spec, residual in workloads:
        wl = ConvWorkload(*spec)
        for name, epi in [("plain", EPILOGUE)] + ([("residual", RESIDUAL_EPILOGUE)] if residual else []):
            space = conv.knob_space(wl, cfg, epi)
            picked = space if not args.sample or len(space) <= args.sample else rng.sample(space, args.sample)
            default = verdict(wl, conv.default_knobs(wl, cfg, epi), epi, cfg)
            counts = Counter(verdict(wl, k, epi, cfg) for k in picked)
            rows.append(
                {
                    "network": network,
                    "workload": "x".join(map(str, spec[1:7])) + (f" g{wl.groups}" if wl.groups > 1 else ""),
                    "epilogue": name,
                    "untuned": default,
                    "configs": len(picked),
                    "space": len(space),
                    "passes": counts.pop("passes", 0),
                    "broken": dict(counts),
                }
            )
            r = rows[-1]
            print(
                f"{r['workload']:>20} {name:>8}: untuned {default}; {r['passes']}/{r['configs']} configs pass"
                + (f"; {r['broken']}" if r["broken"] else ""),
                flush=True,
            )
    res = {
        "commit": machine.source_commit(),
        **machine.cpu(),
        "threads": 1,  # pass/fail, not a timing: one process, numpy on one thread
        "sample": args.sample,
        "seconds": round(time.time() - t0, 1),
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vta_strict.json").write_text(json.dumps(res, indent=1))
        lines = [
            "| network | workload (H W Ci Co kh kw) | epilogue | untuned | configs passing | broken by |",
            "|---|---|---|---|---|---|",
            *(
                f"| {r['network']} | {r['workload']} | {r['epilogue']} | {r['untuned']} | {r['passes']} of {r['configs']} "
                f"(space {r['space']}) | {', '.join(f'{k} {v}' for k, v in r['broken'].items()) or '-'} |"
                for r in rows
            ),
        ]
        (args.out / "vta_strict.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
