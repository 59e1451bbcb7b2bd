"""What a run leaves to read: its typed result (`RunResult`, one JSON file per run in the
store), the tables printed by `vta-pipeline report` and published to the Prefect UI, the
markdown report with its plots, and the VTA part of each."""

from .markdown import markdown
from .result import (
    Evaluation,
    RunResult,
    TaskResult,
    from_steps,
    load_results,
    new_result,
    save_result,
    task_results,
    tune_summary,
)
from .tables import (
    LATENCY_HEADER,
    RECIPE_HEADER,
    TASK_HEADER,
    baseline_line,
    emulated_line,
    latency_header,
    latency_rows,
    recipe_rows,
    render,
    task_rows,
)
from .vta import VTA_HEADER, vta_lines, vta_markdown, vta_result, vta_rows

__all__ = [
    "LATENCY_HEADER",
    "RECIPE_HEADER",
    "TASK_HEADER",
    "VTA_HEADER",
    "Evaluation",
    "RunResult",
    "TaskResult",
    "baseline_line",
    "emulated_line",
    "latency_header",
    "from_steps",
    "latency_rows",
    "load_results",
    "markdown",
    "new_result",
    "recipe_rows",
    "render",
    "save_result",
    "task_results",
    "task_rows",
    "tune_summary",
    "vta_lines",
    "vta_markdown",
    "vta_result",
    "vta_rows",
]
