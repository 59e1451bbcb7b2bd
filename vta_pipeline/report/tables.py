"""A run's result as tables: for the terminal (`vta-pipeline report`, rich) and for the
Prefect UI's table artifacts (the same rows under the same headers)."""

from __future__ import annotations

import io

from .result import RunResult
from .vta import VTA_HEADER, vta_rows

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


def _ms(v: float | None, digits: int = 4) -> str:
    return f"{v:.{digits}f}" if v else "-"


def latency_header(result: RunResult) -> list[str]:
    """LATENCY_HEADER, and a column "emulated" for a run on an emulated board."""
    return LATENCY_HEADER + (["emulated"] if result.emulated else [])


def emulated_line(result: RunResult) -> str | None:
    """What an emulated run's timings are (every table of such a run shows qemu's times)."""
    if not result.emulated:
        return None
    return (
        f"EMULATED: the board was {result.emulated}; every time above is qemu's, not the board's CPU's. "
        "What it shows: the build loads and runs on the board's TVM runtime, and whether its output is right "
        '("output correct").'
    )


def latency_rows(result: RunResult) -> list[list[str]]:
    """The latency table's rows (`latency_header`'s columns)."""
    rows = []
    untuned_ms = result.untuned.mean_ms
    for label, e in (("untuned", result.untuned), ("tuned", result.tuned)):
        rows.append(
            [
                label,
                f"{e.mean_ms:.3f}",
                f"{e.std_ms:.3f}",
                f"{e.median_ms:.3f}",
                f"{untuned_ms / e.mean_ms:.2f}x",
                "yes" if e.correct else f"NO (max err {e.max_abs_err:.2e})",
                str(e.threads or "-"),
                *([e.emulated or "-"] if result.emulated else []),
            ]
        )
    b = result.baseline or {}
    for row in ([b["fp32"]] if b.get("fp32") else []) + [b]:  # timed in turn with the tuned build: medians
        if not row.get("ort_ms"):
            continue
        if "ort_vs_float" in row:  # ORT's int8: as close to the float model as an int8 build is
            ok = f"cosine {row['ort_vs_float']['cosine']:.4f} to float"
        else:
            ok = "yes" if row.get("ort_output_matches") else "differs"
        rows.append(
            [
                f"{row['engine']} (in turn)",
                "-",
                "-",
                f"{row['ort_ms']:.3f}",
                f"{untuned_ms / row['ort_ms']:.2f}x",
                ok,
                str(b.get("threads") or "-"),
                *(["no (this machine)"] if result.emulated else []),
            ]
        )
    return rows


def baseline_line(result: RunResult) -> str | None:
    """Whether tuning beat the runtime the user already has, in one line."""
    b = result.baseline
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


def task_rows(result: RunResult) -> list[list[str]]:
    return [
        [
            str(i),
            t.task,
            str(t.weight),
            ",".join(map(str, t.workload)) if t.workload else "-",
            str(t.trials),
            str(t.errors),
            _ms(t.best_latency_ms),
            f"{t.best_gflops:.2f}" if t.best_gflops else "-",
            _ms(t.default_ms),
            "default" if t.keeps_default else "tuned",
            t.stopped or "",
        ]
        for i, t in enumerate(result.tasks)
    ]


def _best_so_far(t, points: int = 4) -> str:
    """Best GFLOPS so far at evenly spaced trials, like the recipe's `Current/Best` lines."""
    curve = [(n, ms) for n, ms in t.curve or [] if ms]
    flops = t.flops or 0.0
    if not curve or not flops:
        return "-"
    picks = sorted({curve[min(len(curve) - 1, round(i * (len(curve) - 1) / (points - 1)))] for i in range(points)})
    return " → ".join(f"{flops / (ms * 1e6):.1f}@{n}" for n, ms in picks)


def recipe_rows(result: RunResult) -> list[list[str]]:
    rows = []
    for i, t in enumerate(result.tasks):
        warm = "-"
        if t.warm_start:
            reached = t.reached_previous_best_at
            warm = f"{t.warm_start} records" + (f", previous best at trial {reached}" if reached else "")
        elif t.library:
            lib = t.library
            warm = f"library: {lib.get('records')} records ({lib.get('cpu')}, {lib.get('commit')})"
        rows.append(
            [
                str(i),
                t.task,
                _ms(t.best_latency_ms),
                f"{t.best_gflops:.2f}" if t.best_gflops else "-",
                str(t.trials),
                _best_so_far(t),
                _ms(t.default_ms),
                "default" if t.keeps_default else "tuned",
                warm,
            ]
        )
    return rows


def render(result: RunResult) -> str:
    """Plain-text tables (rich), for the terminal and for logs."""
    from rich.console import Console
    from rich.table import Table

    # recorded into a string only: printing to stdout too would show every table twice
    console = Console(file=io.StringIO(), record=True, width=140, force_terminal=False)
    title = f"{result.model} on {result.board_key} ({result.target}), run {result.run_id}"
    for table_title, header, rows in (
        (title, latency_header(result), latency_rows(result)),
        ("tuning tasks", TASK_HEADER, task_rows(result)),
    ):
        t = Table(title=table_title)
        for h in header:
            t.add_column(h, justify="left" if h in ("build", "task") or header is TASK_HEADER else "right")
        for r in rows:
            t.add_row(*r)
        console.print(t)
    if result.vta:
        v = result.vta
        vt = Table(title=f"VTA, simulated at {v['clock_mhz']:.0f} MHz (peak {v['peak_gops']:.1f} GOPS)")
        for h in VTA_HEADER:
            vt.add_column(h)
        for r in vta_rows(v):
            vt.add_row(*r)
        console.print(vt)
    for line in (baseline_line(result), emulated_line(result)):
        if line:
            console.print(line)
    console.print(f"speed-up {result.speedup:.2f}x, run took {result.seconds:.0f} s")
    return console.export_text()
