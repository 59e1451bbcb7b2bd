"""Helpers the commands share: user errors as one line and exit status 2, the config from a file
and the flags' overrides, and the store a history command reads."""

from __future__ import annotations

from pathlib import Path

import typer

from vta_pipeline.errors import UserError


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _history_store(store: Path | None) -> Path:
    """The store whose history a command reads (`history`, `library export`), or a clear error
    that names the store one level down where compare.py keeps it."""
    from vta_pipeline.store.history import history_dir

    root = store or Path("vta-store")
    if not history_dir(root).exists():
        nested = sorted(p.parent for p in root.glob("*/history"))
        hint = (
            f"; {nested[0]} has one (benchmarks/compare.py keeps its pipeline store there): pass --store {nested[0]}"
            if nested
            else " (run `vta-pipeline run` or the nightly flow first, or pass --store)"
        )
        _fail(f"no history in {root}: runs append to {history_dir(root)} when they finish{hint}")
    return root


def _config(config, overrides):
    from vta_pipeline.config import build_config, load_config_file

    file_values = load_config_file(config) if config else None
    return build_config(file_values, overrides, source=str(config) if config else "")


def _guard(fn):
    """Run fn, turning user errors into one line and exit status 2."""
    try:
        return fn()
    except UserError as e:
        _fail(str(e))
