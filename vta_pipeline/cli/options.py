"""The options the commands share that are not config fields (those are in flags.py, from the
config's own descriptions): one `Annotated[...]` each, the same name and help in every command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ConfigOpt = Annotated[
    Optional[Path], typer.Option("--config", help="JSON/TOML file with the same fields as the flags.")
]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model name (default: built-in tinynet).")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Preset name or TVM target JSON (default: host).")]
TrackerOpt = Annotated[
    Optional[str], typer.Option("--tracker", help="HOST:PORT of an RPC tracker (default: local board).")
]
StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Artifact store directory.")]
# the history sub-commands' --json
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON rows instead of a table.")]
