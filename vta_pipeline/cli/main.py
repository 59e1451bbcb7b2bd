"""`vta-pipeline`: the command line. Thin: parse, validate, call the library or the flow.

User errors (bad options, unknown models, unreachable trackers) print one clear message
and exit with status 2, without a traceback.

This module assembles the app; the commands live one group to a module: `run` in run.py,
`tasks` / `pack-points` / `build` in steps.py, `models` / `targets` / `report` in info.py,
the `board`, `history`, `library` and `store` sub-apps in board.py, history.py, library.py and store.py, the shared flags in options.py
and the shared helpers in common.py.
"""

from __future__ import annotations

import sys

import typer

from vta_pipeline.cli.board import board_app
from vta_pipeline.cli.history import history_app
from vta_pipeline.cli.info import models, report_cmd, targets
from vta_pipeline.cli.library import library_app
from vta_pipeline.cli.run import run
from vta_pipeline.cli.steps import build_cmd, pack_points_cmd, tasks_cmd
from vta_pipeline.cli.store import store_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])

# `--help` lists the commands in this order, then the sub-apps in theirs
app.command()(run)
app.command("tasks")(tasks_cmd)
app.command("pack-points")(pack_points_cmd)
app.command()(models)
app.command()(targets)
app.command("build")(build_cmd)
app.command("report")(report_cmd)
app.add_typer(board_app, name="board")
app.add_typer(history_app, name="history")
app.add_typer(library_app, name="library")
app.add_typer(store_app, name="store")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
