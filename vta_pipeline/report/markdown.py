"""The run's report for the Prefect UI: latency, output check, regression verdict, and the
plots (embedded PNGs, also written to `runs/<run-id>/` in the store)."""

from __future__ import annotations

from pathlib import Path

from ..store import history, variant
from . import plots
from .result import RunResult
from .tables import emulated_line
from .vta import vta_markdown


def _float_line(result: RunResult) -> str:
    vs = result.tuned.vs_float
    if not vs:
        return ""
    top1 = f", top-1 agreement {vs['top1_agree']:.0%}" if "top1_agree" in vs else ""
    return f"\n\nint8 vs the float model: cosine {vs['cosine']:.5f}, max abs error {vs['max_abs_error']:.3e}{top1}"


def markdown(result: RunResult, store_root: Path) -> str:
    out = Path(store_root) / "runs" / result.run_id
    out.mkdir(parents=True, exist_ok=True)
    tasks = [t.model_dump() for t in result.tasks]
    curves = plots.tuning_curves(tasks, f"{result.model}: best GFLOPS so far per task")
    (out / "tuning_curves.png").write_bytes(curves)
    mine = result.of_variant
    trend = [
        r
        for r in history.trend(Path(store_root), result.model, result.target)
        if r["board_key"] == result.board_key and r["variant"] == mine
    ]
    nights = plots.latency_per_night(
        trend, f"{result.model} {variant.label(result.config)} on {result.board_key} ({result.target})"
    )
    (out / "latency_per_night.png").write_bytes(nights)
    guard = result.guard or {}
    verdict = ""
    if guard:
        verdict = ("\n\n> **" + guard["message"] + "**") if guard.get("regressed") else f"\n\n{guard['message']}"
    lines = [
        f"# {result.model} on {result.board_key} ({result.target}), night {result.night or '-'}",
        "",
        *([f"> **{emulated_line(result)}**", ""] if result.emulated else []),
        "| build | mean ms | median ms | std ms | output check |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {e.mean_ms:.3f} | {e.median_ms:.3f} | {e.std_ms:.3f} | "
            f"{'passed' if e.correct else 'FAILED'} (cosine {e.cosine:.6f}, max abs error {e.max_abs_err:.2e}) |"
            for k, e in (("untuned", result.untuned), ("tuned", result.tuned))
        ),
        "",
        f"Speed-up **{result.speedup:.2f}x** over {len(result.tasks)} tuning tasks, "
        f"{result.trials} trials, run took {result.seconds:.0f} s." + _float_line(result) + verdict,
        "",
        *vta_markdown(result.vta),
        "## Tuning curves",
        "",
        f"![tuning curves]({plots.data_uri(curves)})",
        "",
        "## Latency per night",
        "",
        f"![latency per night]({plots.data_uri(nights)})",
    ]
    return "\n".join(lines)
