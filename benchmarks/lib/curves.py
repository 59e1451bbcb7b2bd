"""Latency against trials: the tasks' best-so-far curves turned into the network's, anchored
at measured points, and the budget at which it meets a reference."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np


def time_split(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per tuned task: its best latency x its weight (how often the network runs it), largest first."""
    out = []
    for t in result["tasks"]:
        best = t.get("best_latency_ms") or t.get("default_ms")
        if best:
            w = int(t.get("weight", 1))
            out.append({"task": t["task"], "weight": w, "best_ms": best, "ms_x_weight": best * w})
    return sorted(out, key=lambda r: -r["ms_x_weight"])


def estimated_curve(result: dict[str, Any], measured_ms: float, flat: bool = True) -> list[list[float]]:
    """Network latency vs trials per task, from one pipeline run's per-task tuning curves.

    Each tuned task contributes weight x the latency the build would use after n trials
    (its best so far, or its default lowering when that is faster, as pick best decides);
    the sum is anchored at the network latency measured after the last trial, so the
    untuned tasks and the glue between kernels are counted as measured. Best-so-far at n
    is what a run with a budget of n would have found with the same seed (the search does
    not look ahead), so one deep run gives the whole curve. A run whose budget was steered by
    latency (not `flat`) gave its tasks different budgets: only the part every task reached,
    its flat first round, is a flat budget's curve."""
    from vta_pipeline.search.allocation import used_ms

    tasks = [t for t in result["tasks"] if t.get("curve")]
    if not tasks:
        return []
    n_max = (max if flat else min)(len(t["curve"]) for t in tasks)

    def used(t: dict[str, Any], n: int) -> float:
        curve = t["curve"]
        best = curve[min(n, len(curve)) - 1][1] if n >= 1 else None
        return used_ms(best, t.get("default_ms")) or 0.0

    final = sum(int(t.get("weight", 1)) * used(t, len(t["curve"])) for t in tasks)  # what was measured
    return [
        [n, measured_ms + sum(int(t.get("weight", 1)) * used(t, n) for t in tasks) - final] for n in range(1, n_max + 1)
    ]


def budget_to_reach(curve: list[list[float]], target_ms: float, measured: list[list[float]] = ()) -> str:
    """Where the built networks (`measured` points) or else the estimated curve meet
    `target_ms`, or an extrapolation from the curve's last doubling of trials (latency
    shrinking by the same factor per doubling): a rough guide, marked as such. Under the
    latency allocation the estimated curve ends at the first round's budget, so a measured
    point beyond it is the only evidence there."""
    built = next((int(n) for n, ms in sorted(measured) if ms < target_ms), None)
    if built is not None:
        return f"reached by the network built at {built} trials/task"
    hit = next((n for n, ms in curve if ms < target_ms), None)
    if hit is not None:
        return f"reached at {hit} trials/task"
    n = len(curve)
    if n < 4:
        return "not reached (curve too short to extrapolate)"
    last, half = curve[-1][1], curve[n // 2 - 1][1]
    if last >= half:
        return f"not reached by {n} trials/task, and the last doubling gained nothing"
    doublings = np.log(target_ms / last) / np.log(last / half)
    if not np.isfinite(doublings) or doublings > 20:  # a gain too small to extrapolate from
        return f"not reached by {n} trials/task, and the last doubling gained {100 * (1 - last / half):.1f}%"
    return (
        f"not reached by {n} trials/task; at the last doubling's rate ({100 * (1 - last / half):.0f}% less per "
        f"doubling) about {int(n * 2**doublings):,} trials/task (extrapolated)"
    )


TRIALS_IN_LABEL = re.compile(r"\((\d+) trials/task")


def in_turn_points(res: dict[str, Any]) -> None:
    """Each curve's points timed in turn with the reference: [trials, ours ms, reference ms].

    Runs record them as they go (since 8725573); for a run written before, they are read back
    from its rows' side-by-side timings where the model has a single curve (its rows are then
    unambiguous)."""
    curves = res.get("curves", {})
    for label, c in curves.items():
        model = label.split(" ", 1)[0]
        if "in_turn" in c or sum(k.split(" ", 1)[0] == model for k in curves) != 1:
            continue
        points = {}
        for r in res["rows"]:
            m = TRIALS_IN_LABEL.search(r["engine"])
            if r["model"] == model and r.get("side_by_side") and m:
                points[int(m.group(1))] = [
                    int(m.group(1)),
                    r["side_by_side"]["ours_ms"],
                    r["side_by_side"]["reference_ms"],
                ]
        if points:
            c["in_turn"] = [points[n] for n in sorted(points)]


def curve_plot(curves: dict[str, Any], refs: dict[str, float], path: Path) -> None:
    """latency_vs_trials.png: the estimated curves, the measured points, the reference engines;
    and, where the run timed its builds in turn with their reference, that ratio per budget
    (the number the goals are judged by: the host's drift cancels out of it)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    from vta_pipeline.report import plots  # noqa: F401  (selects matplotlib's Agg backend)

    ratios = {label: c["in_turn"] for label, c in curves.items() if c.get("in_turn")}
    fig, axes = plt.subplots(1, 3 if ratios else 2, figsize=(18 if ratios else 12, 4.6))
    ax, at = axes[0], axes[1]
    for i, (label, c) in enumerate(curves.items()):
        color = f"C{i}"
        if c["estimated"]:
            ax.step(*zip(*c["estimated"]), where="post", color=color, label=f"{label} (estimated from task curves)")
        ax.plot(*zip(*c["measured"]), "o", color=color, label=f"{label} (measured)")
        minutes = dict((int(n), s / 60) for n, s in c.get("tuning_s", []))
        points = [(minutes[int(n)], ms) for n, ms in c["measured"] if int(n) in minutes]
        if points:
            at.plot(*zip(*points), "o-", color=color, label=label)
    for a in (ax, at):
        for j, (label, ms) in enumerate(refs.items()):
            a.axhline(ms, linestyle="--", color=f"C{len(curves) + j}", label=label)
        a.set_yscale("log")
        a.yaxis.set_major_formatter(ScalarFormatter())
        a.set_ylabel("network latency, ms (median)")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("trials per task")
    at.set_xlabel("tuning wall time, minutes (this machine, built networks measured)")
    if ratios:
        ar = axes[2]
        for i, (label, points) in enumerate(ratios.items()):
            ar.plot([p[0] for p in points], [p[1] / p[2] for p in points], "o-", color=f"C{i}", label=label)
        ar.axhline(1.0, linestyle="--", color="grey", label="as fast as ONNX Runtime")
        ar.set_xscale("log", base=2)
        ar.xaxis.set_major_formatter(ScalarFormatter())
        ar.set_xlabel("trials per task")
        ar.set_ylabel("ours / ONNX Runtime, timed in turn (median of rounds)")
        ar.grid(True, which="both", alpha=0.3)
        ar.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curve_tables(res: dict[str, Any]) -> list[str]:
    rows, curves = res["rows"], res.get("curves", {})
    if not curves:
        return []
    md = [
        "",
        "Latency vs trials per task (estimated from the per-task tuning curves, anchored at the measured "
        "network latency; measured points marked *); plot: latency_vs_trials.png",
        "",
    ]
    for label, c in curves.items():
        model, kind = label.split(" ", 1)
        ref_engine = "ONNX Runtime fp32" if kind.startswith("fp32") else "ONNX Runtime int8"
        ref = next((r["median_ms"] for r in rows if r["model"] == model and r["engine"].startswith(ref_engine)), None)
        measured = {int(n): ms for n, ms in c["measured"]}
        points = sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= len(c["estimated"])} | set(measured))
        est = dict((int(n), ms) for n, ms in c["estimated"])
        cells = [
            f"{measured[n]:.1f}*" if n in measured else f"{est[n]:.1f}" for n in points if n in est or n in measured
        ]
        tuned_min = ", ".join(f"{int(n)}: {s_ / 60:.1f} min" for n, s_ in c.get("tuning_s", []))
        md += [
            f"- {label}: "
            + ", ".join(f"{n}: {v}" for n, v in zip(points, cells))
            + " ms"
            + (
                f"; {ref_engine} {ref:.2f} ms: {budget_to_reach(c['estimated'], ref, c['measured'])}"
                if ref and c["estimated"]
                else ""
            )
            + (f"; tuning wall time to each measured point: {tuned_min}" if tuned_min else "")
        ]
        if c.get("in_turn"):
            md += [
                "  - timed in turn with "
                + ref_engine
                + ", ours / reference: "
                + ", ".join(f"{n}: {o:.2f} / {r:.2f} ms = {o / r:.2f}x" for n, o, r in c["in_turn"])
            ]
    return md
