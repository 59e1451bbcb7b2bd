"""Pictures people would rather look at than read: tuning curves and latency per night.

PNG bytes from matplotlib's Agg backend (no display needed); the flow embeds them in its
markdown artifact as data URIs and writes them next to the run's result in the store.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def short_name(task: str, width: int = 38) -> str:
    name = task.removeprefix("fused_")
    return name if len(name) <= width else name[: width - 1] + "…"


def tuning_curves(tasks: list[dict[str, Any]], title: str = "") -> bytes:
    """Best GFLOPS so far vs trials, one line per tuning task (from each task's curve)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    drawn = 0
    for i, t in enumerate(tasks):
        flops = t.get("flops") or 0.0
        pts = [(n, flops / (ms * 1e6)) for n, ms in t.get("curve") or [] if ms]
        if not pts or not flops:
            continue
        xs, ys = zip(*pts)
        ax.step(xs, ys, where="post", marker="o", markersize=3, label=f"#{i} {short_name(t['task'])}")
        if t.get("previous_best_ms"):
            ax.axhline(flops / (t["previous_best_ms"] * 1e6), color=ax.lines[-1].get_color(), lw=0.8, ls=":")
        drawn += 1
    ax.set_xlabel("trials (this session)")
    ax.set_ylabel("best GFLOPS so far")
    ax.set_title(title or "tuning curves")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, "no valid measurements", ha="center", va="center", transform=ax.transAxes)
    return _png(fig)


def latency_per_night(rows: list[dict[str, Any]], title: str = "") -> bytes:
    """Untuned and tuned latency per night (history.trend rows), log scale."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    nights = [r["night"] for r in rows]
    for col, label, style in (("untuned_ms", "untuned", "s--"), ("tuned_ms", "tuned", "o-")):
        pts = [(i, r[col]) for i, r in enumerate(rows) if r.get(col)]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, style, label=label)
    ax.set_xticks(range(len(nights)), nights, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title or "latency per night")
    ax.grid(alpha=0.3, which="both")
    if rows:
        ax.legend()
    return _png(fig)
