"""Warm start vs cold start: how many trials a new night needs to reach the previous best.

For each conv2d task of a model: night A tunes it cold (its measurements go to the store's
Parquet history); then night B tunes it warm-started from A's best records and night C tunes
it cold again, with the same budget, on the same local board. Printed side by side: A's
best, the trial at which B's and C's own measurements first reached it (or "-"), and their
best-so-far latency at a few points. Results go to benchmarks/results/warm_start.{json,md}.

    uv run python -m benchmarks.warm_start --model tinynet --trials 32 --tasks 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from vta_pipeline import steps
from vta_pipeline.boards import (
    BoardSpec,
    LocalBoard,
)
from vta_pipeline.config import MeasureConfig, ModelConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.store import history
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target

OUT = Path(__file__).resolve().parent / "results"


def best_at(curve: list[list[float]], n: int) -> float | None:
    pts = [ms for i, ms in curve if i <= n and ms]
    return min(pts) if pts else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tinynet")
    ap.add_argument("--source", default="builtin")
    ap.add_argument("--trials", type=int, default=32, help="trials per task per night")
    ap.add_argument("--batch", type=int, default=8, help="trials per measured batch")
    ap.add_argument("--tasks", type=int, default=2, help="how many conv2d tasks (largest first)")
    ap.add_argument("--store", type=Path, default=Path("/tmp/vta-warm-start-store"))
    args = ap.parse_args()

    store = ArtifactStore(args.store)
    target = resolve_target("host")
    fetched = steps.fetch_step(store, ModelConfig(source=args.source, name=args.model))
    extracted = steps.extract_step(store, fetched, target)
    convs = sorted((t for t in load_tasks(extracted.path) if t.op == "conv2d"), key=lambda t: -t.flops)[: args.tasks]
    measure = MeasureConfig(number=5, repeat=1, timeout_s=60)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows = []
    with LocalBoard(key="warmstart", num_servers=2) as board:
        spec = BoardSpec(board.host, board.port, board.key, 2)

        def night(task, name, warm):
            cfg = TuneConfig(
                trials_per_task=args.trials, trials_per_batch=args.batch, session=f"{stamp}-{name}", warm_start=warm
            )
            t0 = time.time()
            art = steps.tune_step(store, extracted, task, target, spec, cfg, measure)
            s = json.loads((art.path / "summary.json").read_text())
            s["seconds"] = time.time() - t0
            return art, s

        for task in convs:
            a_art, a = night(task, "A", 0)
            history.record_measurements(
                store.root,
                {
                    "run_id": f"bench-{stamp}",
                    "night": "A",
                    "model": args.model,
                    "target": "host",
                    "target_id": target.id,
                    "board_key": board.key,
                },
                [a_art.path],
            )
            _, b = night(task, "B", 32)
            _, c = night(task, "C", 0)
            row = {
                "task": task.name,
                "flops": task.flops,
                "A_best_ms": a["best_latency_ms"],
                "B_seeds": b["warm_start"],
                "B_reached_at": b["reached_previous_best_at"],
                "B_session_best_ms": b["session_best_ms"],
                "C_reached_at": c["reached_previous_best_at"],
                "C_session_best_ms": c["session_best_ms"],
                "B_curve": b["curve"],
                "C_curve": c["curve"],
                "A_curve": a["curve"],
                "seconds": {"A": a["seconds"], "B": b["seconds"], "C": c["seconds"]},
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("curve")}), flush=True)

    checkpoints = sorted({max(1, args.trials // 4), args.trials // 2, args.trials})
    head = [
        "task",
        "night A best ms",
        "warm: reached A's best at trial",
        "cold: reached at trial",
        *[f"warm/cold best ms @{n}" for n in checkpoints],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["task"], f"{r['A_best_ms']:.4f}", str(r["B_reached_at"] or "-"), str(r["C_reached_at"] or "-")]
        for n in checkpoints:
            w, c = best_at(r["B_curve"], n), best_at(r["C_curve"], n)
            cells.append(f"{w:.4f} / {c:.4f}" if w and c else "-")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(f"\n{args.model}, {args.trials} trials per task per night, batch {args.batch}, 2 local boards\n")
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "warm_start.json").write_text(
        json.dumps({"model": args.model, "trials": args.trials, "rows": rows}, indent=1)
    )
    (OUT / "warm_start.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
