"""`vta-pipeline store gc`: keep a store's size bounded (`vta_pipeline.store.gc`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vta_pipeline.cli.common import _guard
from vta_pipeline.cli.options import JsonOpt, StoreOpt

store_app = typer.Typer(no_args_is_help=True, help="Housekeeping of an artifact store.")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@store_app.command("gc")
def store_gc_cmd(
    store: StoreOpt = None,
    keep_days: Annotated[float, typer.Option(help="Keep everything younger than this many days.")] = 14.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")] = False,
    as_json: JsonOpt = False,
):
    """Drop old builds that are neither current nor the best of their variant, quarantined and
    half-written leftovers, and old logs; merge each night's history parts. Tuning records,
    the history, runs and current builds are never dropped."""
    from ..store import gc as store_gc

    def go() -> None:
        root = Path(store or "vta-store")
        r = store_gc.collect(root, keep_days=keep_days, dry_run=dry_run)
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "dry_run": r.dry_run,
                        "freed_bytes": r.freed_bytes,
                        "compacted_parts": r.compacted_parts,
                        "kept_builds": r.kept_builds,
                        "removed": [{"path": str(x.path), "bytes": x.bytes, "why": x.why} for x in r.removed],
                    },
                    indent=1,
                )
            )
            return
        verb = "would remove" if dry_run else "removed"
        for x in r.removed:
            typer.echo(f"{verb} {x.path} ({_mib(x.bytes)}): {x.why}")
        for build_id, why in sorted(r.kept_builds.items(), key=lambda kv: kv[1]):
            typer.echo(f"kept build {build_id}: {why}")
        typer.echo(
            f"{verb} {len(r.removed)} item(s), {_mib(r.freed_bytes)}; history parts merged away: {r.compacted_parts}"
        )

    _guard(go)
