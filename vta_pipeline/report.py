"""The result of a run: untuned vs tuned latency, speed-up, per-task tuning results.

A run's result is one JSON file in the store (`runs/<run-id>.json`); the CLI prints it as
tables (`vta-pipeline report`) and the flow publishes it as a Prefect table artifact.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from . import variant
from .pick_best import keeps_default
from .store.artifacts import ArtifactStore, atomic_write_text

log = logging.getLogger(__name__)


def task_results(
    tasks: list[Any], refs: dict[str, Any], first_refs: dict[str, Any], summary: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each task's tuning summary for a run's result, under this run's task name and weight.

    `refs` / `first_refs`: each task's tuning outcome (by this run's task name) after all
    rounds / after the first; `summary` reads an outcome's summary. Tuning outcomes are
    stored by workload, so a cached one may come from another network, or another version
    of this one, that named the same workload differently (resnet18's classifier was
    `fused_matmul_add201` in one store's int8 run, `fused_matmul_add2` in its fp32 run):
    the run reports it under its own name, and keeps the other as `tuned_as`. A task tuned
    in both rounds counts both rounds' trials as this run's."""
    out = []
    for t in tasks:
        s = dict(summary(refs[t.name]))
        if s.get("task") != t.name:
            s["tuned_as"] = s.get("task")
        s["task"] = t.name
        if refs[t.name] != first_refs[t.name]:
            s["trials_this_run"] += summary(first_refs[t.name])["trials_this_run"]
        s.update(weight=t.weight, workload=t.workload)
        out.append(s)
    return out


def make_result(
    run_id: str,
    config: dict[str, Any],
    fetched_meta: dict[str, Any],
    tasks: list[dict[str, Any]],
    untuned: dict[str, Any],
    tuned: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "finished": time.time(),
        "seconds": round(seconds, 1),
        "model": fetched_meta.get("model"),
        "source": fetched_meta.get("source"),
        "target": config.get("target"),
        "board_key": config.get("board", {}).get("key"),
        "config": config,
        "variant": variant.of(config),
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
        except ValueError as e:  # torn or edited: named, the other runs listed
            log.warning("run result %s does not parse (%s): left out of the report", p, str(e)[:120])
            continue
    return sorted(out, key=lambda r: r.get("finished", 0))


def latency_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for label in ("untuned", "tuned"):
        e = result[label]
        rows.append(
            [
                label,
                f"{e['mean_ms']:.3f}",
                f"{e['std_ms']:.3f}",
                f"{e['median_ms']:.3f}",
                f"{result['untuned']['mean_ms'] / e['mean_ms']:.2f}x",
                "yes" if e["correct"] else f"NO (max err {e['max_abs_err']:.2e})",
                str(e.get("threads") or "-"),
            ]
        )
    b = result.get("baseline") or {}
    for row in ([b["fp32"]] if b.get("fp32") else []) + [b]:  # timed in turn with the tuned build: medians
        if not row.get("ort_ms"):
            continue
        if "ort_vs_float" in row:  # ORT's int8: as close to the float model as an int8 build is
            agree = row["ort_vs_float"]
            ok = f"cosine {agree['cosine']:.4f} to float"
        else:
            ok = "yes" if row.get("ort_output_matches") else "differs"
        rows.append(
            [
                f"{row['engine']} (in turn)",
                "-",
                "-",
                f"{row['ort_ms']:.3f}",
                f"{result['untuned']['mean_ms'] / row['ort_ms']:.2f}x",
                ok,
                str(b.get("threads") or "-"),
            ]
        )
    return rows


def baseline_line(result: dict[str, Any]) -> str | None:
    """Whether tuning beat the runtime the user already has, in one line."""
    b = result.get("baseline")
    if not b:
        return None
    if b.get("absent"):
        return f"no {b['engine']} row: {b['absent']}"
    verdict = "faster than" if b["ratio"] < 1 else "slower than"
    line = (
        f"in turn with {b['engine']} ({b['rounds']} rounds, {b['threads']} threads): tuned {b['ours_ms']:.3f} ms, "
        f"ORT {b['ort_ms']:.3f} ms: {b['ratio']:.2f}x, {verdict} it"
    )
    if b.get("fp32"):
        line += f"; {b['fp32']['ratio']:.2f}x {b['fp32']['engine']}"
    if b.get("int8_absent"):
        line += f" (this run is int8; no ORT int8 row: {b['int8_absent']})"
    return line


LATENCY_HEADER = ["build", "mean ms", "std ms", "median ms", "speed-up", "output correct", "board threads"]
TASK_HEADER = [
    "#",
    "task",
    "weight",
    "workload",
    "trials",
    "errors",
    "best ms",
    "GFLOPS",
    "default ms",
    "build uses",
    "stopped",
]


def task_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for i, t in enumerate(result["tasks"]):
        rows.append(
            [
                str(i),
                t["task"],
                str(t.get("weight", 1)),
                ",".join(map(str, t["workload"])) if t.get("workload") else "-",
                str(t["trials"]),
                str(t["errors"]),
                f"{t['best_latency_ms']:.4f}" if t.get("best_latency_ms") else "-",
                f"{t['best_gflops']:.2f}" if t.get("best_gflops") else "-",
                f"{t['default_ms']:.4f}" if t.get("default_ms") else "-",
                "default" if keeps_default(t) else "tuned",
                t.get("stopped", ""),
            ]
        )
    return rows


# ---- VTA ----------------------------------------------------------------------------------------
VTA_HEADER = ["VTA task", "convs", "GOPs", "untuned ms", "tuned ms", "speed-up", "GOPS", "of peak", "knobs"]


def vta_result(
    tuned: list[dict[str, Any]],
    ev_untuned: dict[str, Any],
    ev_tuned: dict[str, Any],
    vta: Any,
    clock_hz: float | None = None,
) -> dict[str, Any]:
    """Simulated latency per VTA task (untuned config vs tuned) and for the network (the
    offloaded convs' simulated time + the rest on the board's CPU), GOPS against VTA's peak
    at the board's clock (BATCH x BLOCK_IN x BLOCK_OUT multiply-adds per cycle)."""
    from .vta.simulator import CycleModel

    clock = clock_hz or CycleModel().clock_hz
    peak = vta.BATCH * vta.BLOCK_IN * vta.BLOCK_OUT * 2 * clock / 1e9
    tasks = []
    for t in tuned:
        gops = t["ops"] / (t["best_ms"] / 1e3) / 1e9
        tasks.append(
            {
                "task": t["task"],
                "count": t["count"],
                "ops": t["ops"],
                "untuned_ms": t["default_ms"],
                "tuned_ms": t["best_ms"],
                "gops": gops,
                "of_peak": gops / peak,
                "knobs": t["best_knobs"],
                "trials": t["trials"],
            }
        )
    ops = sum(t["ops"] * t["count"] for t in tuned)
    network = {}
    for label, ev in (("untuned", ev_untuned), ("tuned", ev_tuned)):
        network[label] = {
            "vta_ms": ev.get("vta_ms"),
            "cpu_ms": ev.get("cpu_ms"),
            "total_ms": ev["mean_ms"],
            "vta_gops": ops / (ev["vta_ms"] / 1e3) / 1e9 if ev.get("vta_ms") else None,
        }
    return {"clock_mhz": clock / 1e6, "peak_gops": peak, "tasks": tasks, "network": network}


def vta_rows(v: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            t["task"],
            str(t["count"]),
            f"{t['ops'] / 1e9:.3f}",
            f"{t['untuned_ms']:.3f}" if t["untuned_ms"] is not None else "-",
            f"{t['tuned_ms']:.3f}",
            f"{t['untuned_ms'] / t['tuned_ms']:.1f}x" if t["untuned_ms"] else "-",
            f"{t['gops']:.1f}",
            f"{t['of_peak']:.0%}",
            " ".join(f"{k}={n}" for k, n in t["knobs"].items() if n != 1) or "all 1",
        ]
        for t in v["tasks"]
    ]
    u, t = v["network"]["untuned"], v["network"]["tuned"]
    if u.get("vta_ms") and t.get("vta_ms"):
        rows.append(
            [
                "network: convs on VTA",
                str(sum(x["count"] for x in v["tasks"])),
                "",
                f"{u['vta_ms']:.3f}",
                f"{t['vta_ms']:.3f}",
                f"{u['vta_ms'] / t['vta_ms']:.1f}x",
                f"{t['vta_gops']:.1f}",
                f"{t['vta_gops'] / v['peak_gops']:.0%}",
                "",
            ]
        )
        rows.append(
            ["network: the rest, on the CPU", "", "", f"{u['cpu_ms']:.3f}", f"{t['cpu_ms']:.3f}", "", "", "", ""]
        )
        rows.append(
            [
                "network: total",
                "",
                "",
                f"{u['total_ms']:.3f}",
                f"{t['total_ms']:.3f}",
                f"{u['total_ms'] / t['total_ms']:.1f}x",
                "",
                "",
                "",
            ]
        )
    return rows


def _vta_markdown(v: dict[str, Any] | None) -> list[str]:
    if not v:
        return []
    return [
        f"## VTA, simulated at {v['clock_mhz']:.0f} MHz (peak {v['peak_gops']:.1f} GOPS)",
        "",
        "| " + " | ".join(VTA_HEADER) + " |",
        "|" + "---|" * len(VTA_HEADER),
        *("| " + " | ".join(r) + " |" for r in vta_rows(v)),
        "",
    ]


def vta_lines(v: dict[str, Any]) -> list[str]:
    """The VTA table as log lines (simulated at the clock, peak stated)."""
    head = f"VTA (simulated at {v['clock_mhz']:.0f} MHz, peak {v['peak_gops']:.1f} GOPS): " + " | ".join(VTA_HEADER)
    return [head] + [" | ".join(r) for r in vta_rows(v)]


def render(result: dict[str, Any]) -> str:
    """Plain-text tables (rich), for the terminal and for logs."""
    from rich.console import Console
    from rich.table import Table

    # recorded into a string only: printing to stdout too would show every table twice
    console = Console(file=io.StringIO(), record=True, width=140, force_terminal=False)
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
    if result.get("vta"):
        v = result["vta"]
        vt = Table(title=f"VTA, simulated at {v['clock_mhz']:.0f} MHz (peak {v['peak_gops']:.1f} GOPS)")
        for h in VTA_HEADER:
            vt.add_column(h)
        for r in vta_rows(v):
            vt.add_row(*r)
        console.print(vt)
    line = baseline_line(result)
    if line:
        console.print(line)
    console.print(f"speed-up {result['speedup']:.2f}x, run took {result['seconds']:.0f} s")
    return console.export_text()


# ---- the Prefect artifacts ------------------------------------------------------------------------
RECIPE_HEADER = [
    "#",
    "task",
    "latency ms",
    "GFLOPS",
    "trials",
    "best-so-far GFLOPS",
    "default ms",
    "build uses",
    "warm start",
]


def _best_so_far(t: dict[str, Any], points: int = 4) -> str:
    """Best GFLOPS so far at evenly spaced trials, like the recipe's `Current/Best` lines."""
    curve = [(n, ms) for n, ms in t.get("curve") or [] if ms]
    flops = t.get("flops") or 0.0
    if not curve or not flops:
        return "-"
    picks = sorted({curve[min(len(curve) - 1, round(i * (len(curve) - 1) / (points - 1)))] for i in range(points)})
    return " → ".join(f"{flops / (ms * 1e6):.1f}@{n}" for n, ms in picks)


def recipe_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for i, t in enumerate(result["tasks"]):
        warm = "-"
        if t.get("warm_start"):
            reached = t.get("reached_previous_best_at")
            warm = f"{t['warm_start']} records" + (f", previous best at trial {reached}" if reached else "")
        elif t.get("library"):
            lib = t["library"]
            warm = f"library: {lib.get('records')} records ({lib.get('cpu')}, {lib.get('commit')})"
        rows.append(
            [
                str(i),
                t["task"],
                f"{t['best_latency_ms']:.4f}" if t.get("best_latency_ms") else "-",
                f"{t['best_gflops']:.2f}" if t.get("best_gflops") else "-",
                str(t["trials"]),
                _best_so_far(t),
                f"{t['default_ms']:.4f}" if t.get("default_ms") else "-",
                "default" if keeps_default(t) else "tuned",
                warm,
            ]
        )
    return rows


def _float_line(result: dict[str, Any]) -> str:
    vs = result["tuned"].get("vs_float")
    if not vs:
        return ""
    top1 = f", top-1 agreement {vs['top1_agree']:.0%}" if "top1_agree" in vs else ""
    return f"\n\nint8 vs the float model: cosine {vs['cosine']:.5f}, max abs error {vs['max_abs_error']:.3e}{top1}"


def markdown(result: dict[str, Any], store_root: Path) -> str:
    """The run's report: latency, output check, regression verdict, plots (embedded PNGs,
    also written to `runs/<run-id>/` in the store)."""
    from . import history, plots

    out = Path(store_root) / "runs" / result["run_id"]
    out.mkdir(parents=True, exist_ok=True)
    curves = plots.tuning_curves(result["tasks"], f"{result['model']}: best GFLOPS so far per task")
    (out / "tuning_curves.png").write_bytes(curves)
    trend = history.trend(Path(store_root), result["model"], result["target"])
    mine = variant.of_result(result)
    trend = [r for r in trend if r["board_key"] == result["board_key"] and r["variant"] == mine]
    nights = plots.latency_per_night(
        trend,
        f"{result['model']} {variant.label(result.get('config') or {})} on {result['board_key']} ({result['target']})",
    )
    (out / "latency_per_night.png").write_bytes(nights)
    u, t = result["untuned"], result["tuned"]
    guard = result.get("guard") or {}
    verdict = ""
    if guard:
        verdict = ("\n\n> **" + guard["message"] + "**") if guard.get("regressed") else f"\n\n{guard['message']}"
    lines = [
        f"# {result['model']} on {result['board_key']} ({result['target']}), night {result.get('night', '-')}",
        "",
        "| build | mean ms | median ms | std ms | output check |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {e['mean_ms']:.3f} | {e['median_ms']:.3f} | {e['std_ms']:.3f} | "
            f"{'passed' if e['correct'] else 'FAILED'} (cosine {e['cosine']:.6f}, max abs error {e['max_abs_err']:.2e}) |"
            for k, e in (("untuned", u), ("tuned", t))
        ),
        "",
        f"Speed-up **{result['speedup']:.2f}x** over {len(result['tasks'])} tuning tasks, "
        f"{sum(x['trials'] for x in result['tasks'])} trials, run took {result['seconds']:.0f} s."
        + _float_line(result)
        + verdict,
        "",
        *_vta_markdown(result.get("vta")),
        "## Tuning curves",
        "",
        f"![tuning curves]({plots.data_uri(curves)})",
        "",
        "## Latency per night",
        "",
        f"![latency per night]({plots.data_uri(nights)})",
    ]
    return "\n".join(lines)
