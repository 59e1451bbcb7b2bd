"""The VTA part of a run's result: simulated latency per VTA task and for the network, and
GOPS against VTA's peak at the simulated clock (said wherever it is shown)."""

from __future__ import annotations

from typing import Any

VTA_HEADER = [
    "VTA task",
    "convs",
    "GOPs",
    "untuned ms",
    "starts from",
    "tuned ms",
    "speed-up",
    "GOPS",
    "of peak",
    "Pynq ms (TopHub)",
    "knobs",
]


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
    from ..vta.simulator import CycleModel

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
                "start_from": t.get("start_from", ""),
                "tophub_measured_ms": t.get("tophub_measured_ms"),
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
            # the CPU part is timed where the simulator board runs, not on a Pynq's Cortex-A9
            "cpu_where": f"{ev.get('board_name') or 'the board'}, {ev.get('threads') or '?'} thread(s)",
        }
    return {"clock_mhz": clock / 1e6, "peak_gops": peak, "tasks": tasks, "network": network}


def vta_rows(v: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            t["task"],
            str(t["count"]),
            f"{t['ops'] / 1e9:.3f}",
            f"{t['untuned_ms']:.3f}" if t["untuned_ms"] is not None else "-",
            "TopHub" if "TopHub" in (t.get("start_from") or "") else "fallback",
            f"{t['tuned_ms']:.3f}",
            f"{t['untuned_ms'] / t['tuned_ms']:.1f}x" if t["untuned_ms"] else "-",
            f"{t['gops']:.1f}",
            f"{t['of_peak']:.0%}",
            f"{t['tophub_measured_ms']:.3f}" if t.get("tophub_measured_ms") else "-",
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
                "",
                f"{t['vta_ms']:.3f}",
                f"{u['vta_ms'] / t['vta_ms']:.1f}x",
                f"{t['vta_gops']:.1f}",
                f"{t['vta_gops'] / v['peak_gops']:.0%}",
                _pynq_total(v),
                "",
            ]
        )
        rows.append(
            [
                f"network: the rest, on the sim board's CPU ({t.get('cpu_where', 'the board')}; not a Pynq's)",
                "",
                "",
                f"{u['cpu_ms']:.3f}",
                "",
                f"{t['cpu_ms']:.3f}",
                "",
                "",
                "",
                "",
                "",
            ]
        )
        rows.append(
            [
                "network: total",
                "",
                "",
                f"{u['total_ms']:.3f}",
                "",
                f"{t['total_ms']:.3f}",
                f"{u['total_ms'] / t['total_ms']:.1f}x",
                "",
                "",
                "",
                "",
            ]
        )
    return rows


def _pynq_total(v: dict[str, Any]) -> str:
    """TopHub's measured convs, weighted as the network has them, where every task has one."""
    ms = [t.get("tophub_measured_ms") for t in v["tasks"]]
    if not ms or None in ms:
        return ""
    return f"{sum(m * t['count'] for m, t in zip(ms, v['tasks'])):.3f}"


def vta_markdown(v: dict[str, Any] | None) -> list[str]:
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
