"""The tuning run's Prefect artifacts (the UI's Artifacts tab): a live progress bar over the
network's trials, the latency and per-task tables, and the markdown report with its plots."""

from __future__ import annotations

from pathlib import Path

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from vta_pipeline import report
from vta_pipeline.search import trial_log


class TrialProgress:
    """The run's progress artifact: valid trials over all tuning tasks, read off their trial
    logs in the store (so it also counts tasks that run in other processes, e.g. Dask workers),
    each counted up to its current budget, over the network's budget."""

    def __init__(self, work_dirs: dict[str, Path], budgets: dict[str, int], total: int, description: str):
        self.work_dirs, self.budgets = work_dirs, budgets
        self.total = max(1, total)
        self.id = create_progress_artifact(progress=0.0, key="tuning-progress", description=description)
        self.last = -1.0

    def update(self, final: bool = False) -> None:
        done = 0
        for name, d in self.work_dirs.items():
            valid = sum(r.get("latency_ms") is not None for r in trial_log.read_trials(d))
            done += min(valid, self.budgets.get(name, 0))
        pct = 100.0 if final else min(100.0, round(100.0 * done / self.total, 1))
        if pct != self.last:
            update_progress_artifact(self.id, pct)
            self.last = pct


def publish(result: report.RunResult, store_root: Path) -> None:
    """Result tables and the report with its plots as Prefect artifacts (the UI's Artifacts
    tab); the plots are also written next to the run's result in the store."""
    rows = [dict(zip(report.latency_header(result), r)) for r in report.latency_rows(result)]
    emulated = f" (EMULATED on {result.emulated}: qemu's times, not the board's)" if result.emulated else ""
    create_table_artifact(rows, key="latency", description=f"untuned vs tuned latency of {result.model}{emulated}")
    create_table_artifact(
        [dict(zip(report.RECIPE_HEADER, r)) for r in report.recipe_rows(result)],
        key="tuning-tasks",
        description="per-task tuning results: best latency, GFLOPS, trials, best GFLOPS so far",
    )
    if result.vta:
        v = result.vta
        create_table_artifact(
            [dict(zip(report.VTA_HEADER, r)) for r in report.vta_rows(v)],
            key="vta",
            description=f"VTA, simulated at {v['clock_mhz']:.0f} MHz: untuned vs tuned per conv "
            f"task and for the network, GOPS of the {v['peak_gops']:.1f} GOPS peak",
        )
    create_markdown_artifact(
        report.markdown(result, store_root),
        key="evaluation",
        description=f"{result.model}: untuned vs tuned, output check, plots",
    )
