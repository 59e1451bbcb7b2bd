"""The store-wide shared cost model against random scoring, on one network's conv tasks.

Before `vta_pipeline.search.cost_model`, every tuning task (and every resumed round of one) built a
fresh XGBoost model, which scores candidates at random until it has seen 100 measurements:
at a night's budgets the search was a random one. This tunes every conv2d task of a network
twice, same seed, same budget, same board, each arm in a fresh store: with random scores
(what the per-task model amounted to below 100 measurements) and with the shared model.
It prints each task's best latency and the network's conv time (best x weight, summed).

    uv run python -m benchmarks.cost_model --model resnet18 --trials 8

Results: benchmarks/results/cost_model.json and cost_model.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results"
ARMS = {
    "random": "random scores (the per-task model below 100 measurements: before)",
    "xgb": "shared XGBoost model (now)",
}


def tune_arm(model: str, source: str, cost: str, trials: int, batch: int, store_dir: Path) -> dict:
    from vta_pipeline import steps
    from vta_pipeline.boards import BoardSpec, LocalBoard
    from vta_pipeline.config import MeasureConfig, ModelConfig, TuneConfig
    from vta_pipeline.extract import load_tasks, select_tasks
    from vta_pipeline.store.artifacts import ArtifactStore
    from vta_pipeline.targets import resolve_target

    store = ArtifactStore(store_dir)
    target = resolve_target("host")
    extracted = steps.extract_step(store, steps.fetch_step(store, ModelConfig(source=source, name=model)), target)
    tasks = select_tasks(load_tasks(extracted.path), "conv2d")
    tune = TuneConfig(trials_per_task=trials, trials_per_batch=batch, cost_model=cost, task_filter="conv2d")
    rows, t0 = [], time.time()
    with LocalBoard(key="bench", num_servers=2) as b:
        for i, task in enumerate(tasks):
            art = steps.tune_step(
                store, extracted, task, target, BoardSpec(b.host, b.port, b.key, 2), tune, MeasureConfig(number=5)
            )
            s = json.loads((art.path / "summary.json").read_text())
            rows.append(
                {
                    "task": task.name,
                    "weight": task.weight,
                    "best_ms": s["best_latency_ms"],
                    "default_ms": s["default_ms"],
                }
            )
            print(f"  [{cost}] {i + 1}/{len(tasks)} {task.name:<40} best {s['best_latency_ms']:.3f} ms", flush=True)
    return {"tasks": rows, "tune_s": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--source", default="torchvision")
    ap.add_argument("--trials", type=int, default=8, help="trials per task")
    ap.add_argument("--batch", type=int, default=4, help="trials per search round")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    from vta_pipeline.boards import machine

    res = {
        "meta": {
            "commit": machine.source_commit(),
            "model": args.model,
            "trials_per_task": args.trials,
            "batch": args.batch,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "arms": {},
    }
    for cost in ARMS:
        with tempfile.TemporaryDirectory() as d:
            res["arms"][cost] = tune_arm(args.model, args.source, cost, args.trials, args.batch, Path(d))
    a, b = (res["arms"][k]["tasks"] for k in ARMS)
    md = [
        f"Measured at commit {res['meta']['commit']} on {res['meta']['date']}: {args.model}, every conv2d task, "
        f"{args.trials} trials per task in rounds of {args.batch}, seed 0, local board with 2 servers.",
        "",
        f"| task | weight | {ARMS['random']} ms | {ARMS['xgb']} ms |",
        "|---|---|---|---|",
    ]
    md += [f"| {x['task'][:50]} | {x['weight']} | {x['best_ms']:.3f} | {y['best_ms']:.3f} |" for x, y in zip(a, b)]
    sums = {
        k: sum(t["weight"] * min(t["best_ms"], t["default_ms"] or t["best_ms"]) for t in res["arms"][k]["tasks"])
        for k in ARMS
    }
    md += [
        f"| **conv time (best or default x weight)** | | **{sums['random']:.2f}** | **{sums['xgb']:.2f}** |",
        f"| tuning time, s | | {res['arms']['random']['tune_s']:.0f} | {res['arms']['xgb']['tune_s']:.0f} |",
    ]
    wins = sum(y["best_ms"] < x["best_ms"] for x, y in zip(a, b))
    md += [
        "",
        f"The shared model found the faster schedule on {wins} of {len(a)} tasks; conv time "
        f"{sums['random']:.2f} -> {sums['xgb']:.2f} ms ({100 * (sums['xgb'] / sums['random'] - 1):+.0f}%).",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost_model.json").write_text(json.dumps(res, indent=1))
    (args.out / "cost_model.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
