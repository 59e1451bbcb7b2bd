"""`vta-pipeline library export | show`: the records library, the warm start of workloads a
store has never measured (`vta_pipeline.search.records_library`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from vta_pipeline.cli.common import _fail, _history_store
from vta_pipeline.cli.options import JsonOpt, StoreOpt, TargetOpt

library_app = typer.Typer(
    no_args_is_help=True, help="The records library: tuned records per CPU class, a fresh store's warm start."
)

LibraryDirOpt = Annotated[
    Optional[Path],
    typer.Option("--out", help="Library directory (default: the one shipped in the package, vta_pipeline/library)."),
]


@library_app.command("export")
def library_export(
    store: StoreOpt = None,
    target: TargetOpt = None,
    out: LibraryDirOpt = None,
    per_workload: Annotated[int, typer.Option(help="Records kept per workload.")] = 4,
    as_json: JsonOpt = False,
):
    """Add the store's best records on a target to the library (merged with what it holds)."""
    from vta_pipeline.errors import UserError
    from vta_pipeline.search import records_library
    from vta_pipeline.targets import resolve_target

    root = _history_store(store)
    if per_workload < 1:
        _fail(f"--per-workload {per_workload}: keep at least 1 record per workload")
    try:
        t = resolve_target(target or "host")
        s = records_library.export(root, t, out or records_library.BUILTIN, k=per_workload)
    except UserError as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(s, indent=1))
    else:
        typer.echo(
            f"{s['file']}: {s['records']} records of {s['workloads']} workloads "
            f"({s['from_store']} workloads from {root}, {s['measurements']} measurements; "
            f"{s['cpu']}, commit {s['commit']})"
        )


@library_app.command("show")
def library_show(library: LibraryDirOpt = None, as_json: JsonOpt = False):
    """What the library holds: per CPU class, model and commit, with the CPU it was tuned on."""
    from vta_pipeline.cli.history import _print_rows
    from vta_pipeline.search import records_library

    try:
        rows = records_library.summary(library or records_library.BUILTIN)
    except records_library.LibraryError as e:
        _fail(str(e))
    _print_rows(rows, "records library", as_json, f"the library {library or records_library.BUILTIN} holds no records")
