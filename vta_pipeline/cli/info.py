"""What the pipeline knows and has done: `models` (the model names a source knows), `targets`
(the target presets) and `report` (the result tables of the last runs in the store)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from vta_pipeline.cli.common import _fail
from vta_pipeline.cli.options import StoreOpt


def models(source: Annotated[str, typer.Option(help="builtin | torchvision | gluon")] = "builtin"):
    """List the model names a source knows."""
    from vta_pipeline.fetch import list_models

    if source not in ("builtin", "torchvision", "gluon"):
        _fail(f"--source {source!r}: use builtin, torchvision or gluon")
    typer.echo("\n".join(list_models(source)))


def targets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False):
    """List the target presets: TVM target and host JSON, RPC key, cross compiler, layout."""
    from vta_pipeline.targets import PRESETS

    presets = [make(None) for make in PRESETS.values()]
    if as_json:
        typer.echo(json.dumps([{k: v for k, v in dataclasses.asdict(p).items()} for p in presets], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="target presets (--target NAME; cuda:sm_XX picks the GPU architecture)", show_lines=True)
    for h in ("preset", "key", "target", "host", "cross compiler", "layout", "measure"):
        table.add_column(h, overflow="fold")
    for p in presets:
        cc = f"{p.cross_compiler} ({p.cross_package})" if p.cross_compiler else "native"
        name = f"{p.name}\n(not runnable yet: --target {p.name} says why)" if p.unavailable else p.name
        table.add_row(
            name,
            p.key,
            json.dumps(p.target),
            json.dumps(p.host) if p.host else "-",
            cc,
            p.layout,
            json.dumps(p.measure) if p.measure else "defaults",
        )
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def report_cmd(store: StoreOpt = None, last: Annotated[int, typer.Option(help="How many runs.")] = 1):
    """Print the result tables of the last runs recorded in the store."""
    from vta_pipeline.report import load_results, render

    from ..store.artifacts import ArtifactStore

    results = load_results(ArtifactStore(store or Path("vta-store")))
    if not results:
        _fail(f"no finished runs in {store or 'vta-store'}: run `vta-pipeline run` first")
    for r in results[-last:]:
        typer.echo(render(r))
