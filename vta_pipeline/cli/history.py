"""`vta-pipeline history nights | trend | workloads`: questions to the store's Parquet history
of measurements and evaluations, as tables or JSON rows."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from vta_pipeline.cli.common import _fail, _history_store
from vta_pipeline.cli.options import JsonOpt, ModelOpt, StoreOpt, TargetOpt

history_app = typer.Typer(
    no_args_is_help=True, help="Questions to the store's Parquet history of measurements and evaluations."
)


def _print_rows(rows: list[dict], title: str, as_json: bool, empty: str) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        _fail(empty)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for h in rows[0]:
        t.add_column(h, justify="right" if isinstance(rows[0][h], (int, float)) else "left")
    for r in rows:
        t.add_row(*("-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console(width=160).print(t)


@history_app.command("nights")
def history_nights(store: StoreOpt = None, model: ModelOpt = None, target: TargetOpt = None, as_json: JsonOpt = False):
    """Best (correct) tuned latency per model / variant (fp32, int8, pack) / target / board key, night by night."""
    from vta_pipeline.store import history

    rows = history.best_per_night(_history_store(store), model, target)
    _print_rows(rows, "best tuned latency per night (ms)", as_json, "no tuned evaluations match")


@history_app.command("trend")
def history_trend(
    model: Annotated[str, typer.Argument(help="Model name, as in the run's result.")],
    store: StoreOpt = None,
    target: TargetOpt = None,
    as_json: JsonOpt = False,
):
    """One model night by night, per variant: untuned and tuned latency, speed-up, trials."""
    from vta_pipeline.store import history

    rows = history.trend(_history_store(store), model, target)
    _print_rows(
        rows,
        f"{model}: latency per night (ms)",
        as_json,
        f"no evaluations of model {model!r}: see `vta-pipeline history nights` for the models recorded",
    )


@history_app.command("workloads")
def history_workloads(store: StoreOpt = None, target: TargetOpt = None, as_json: JsonOpt = False):
    """The best measurement of every workload across all nights."""
    from vta_pipeline.store import history

    rows = history.best_per_workload(_history_store(store), target)
    _print_rows(rows, "best record per workload (ms)", as_json, "no valid measurements recorded")
