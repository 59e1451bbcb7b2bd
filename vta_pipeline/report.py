"""The result of a run: untuned vs tuned latency, speed-up, per-task tuning results.

A run's result is one JSON file in the store (`runs/<run-id>.json`); the CLI prints it as
tables (`vta-pipeline report`) and the flow publishes it as a Prefect table artifact.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .records import keeps_default
from .store import ArtifactStore, atomic_write_text


def make_result(run_id: str, config: dict[str, Any], fetched_meta: dict[str, Any], tasks: list[dict[str, Any]],
                untuned: dict[str, Any], tuned: dict[str, Any], seconds: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "finished": time.time(),
        "seconds": round(seconds, 1),
        "model": fetched_meta.get("model"),
        "source": fetched_meta.get("source"),
        "target": config.get("target"),
        "board_key": config.get("board", {}).get("key"),
        "config": config,
        "untuned": untuned,
        "tuned": tuned,
        "speedup": untuned["mean_ms"] / tuned["mean_ms"] if tuned.get("mean_ms") else None,
        "tasks": tasks,
    }


def save_result(store: ArtifactStore, result: dict[str, Any]) -> Path:
    p = store.root / "runs" / f"{result['run_id']}.json"
    atomic_write_text(p, json.dumps(result, indent=1))
    return p


def load_results(store: ArtifactStore) -> list[dict[str, Any]]:
    out = []
    for p in sorted((store.root / "runs").glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return sorted(out, key=lambda r: r.get("finished", 0))


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for label in ("untuned", "tuned"):
        e = result[label]
        rows.append([
            label, f"{e['mean_ms']:.3f}", f"{e['std_ms']:.3f}", f"{e['median_ms']:.3f}",
            f"{result['untuned']['mean_ms'] / e['mean_ms']:.2f}x",
            "yes" if e["correct"] else f"NO (max err {e['max_abs_err']:.2e})",
        ])
    return rows


LATENCY_HEADER = ["build", "mean ms", "std ms", "median ms", "speed-up", "output correct"]
TASK_HEADER = ["#", "task", "weight", "workload", "trials", "errors", "best ms", "GFLOPS", "default ms", "build uses",
               "stopped"]


def task_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for i, t in enumerate(result["tasks"]):
        rows.append([
            str(i), t["task"], str(t.get("weight", 1)),
            ",".join(map(str, t["workload"])) if t.get("workload") else "-",
            str(t["trials"]), str(t["errors"]),
            f"{t['best_latency_ms']:.4f}" if t.get("best_latency_ms") else "-",
            f"{t['best_gflops']:.2f}" if t.get("best_gflops") else "-",
            f"{t['default_ms']:.4f}" if t.get("default_ms") else "-",
            "default" if keeps_default(t) else "tuned",
            t.get("stopped", ""),
        ])
    return rows


def render(result: dict[str, Any]) -> str:
    """Plain-text tables (rich), for the terminal and for logs."""
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=140, force_terminal=False)
    title = f"{result['model']} on {result['board_key']} ({result['target']}), run {result['run_id']}"
    t = Table(title=title)
    for h in LATENCY_HEADER:
        t.add_column(h, justify="right" if h != "build" else "left")
    for r in latency_rows(result):
        t.add_row(*r)
    console.print(t)
    tt = Table(title="tuning tasks")
    for h in TASK_HEADER:
        tt.add_column(h)
    for r in task_rows(result):
        tt.add_row(*r)
    console.print(tt)
    console.print(f"speed-up {result['speedup']:.2f}x, run took {result['seconds']:.0f} s")
    return console.export_text()
