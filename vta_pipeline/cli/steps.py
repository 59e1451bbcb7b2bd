"""Steps of a run on their own, without a board: `tasks` (the tuning tasks), `pack-points`
(where graph packing starts and stops) and `build` (an untuned library), cached in the store
like a run's steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from vta_pipeline.cli.common import _config, _guard
from vta_pipeline.cli.flags import config_flags
from vta_pipeline.cli.options import ConfigOpt


@config_flags("model", "target", "task_filter", "int8", "opt", exclude=("pretrained",))
def tasks_cmd(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    *,
    overrides: dict,
):
    """Fetch (quantize, pack) the model and print its tuning tasks, cached in the store like a run's.
    The workload columns are the VTA recipe's; packed tasks count batch = N/b*b, in_filter = C/c*c."""

    def go():
        from vta_pipeline import steps
        from vta_pipeline.extract import WORKLOAD_FIELDS, load_tasks, select_tasks
        from vta_pipeline.targets import resolve_target

        from ..store.artifacts import ArtifactStore

        cfg = _config(config, overrides)
        tgt = resolve_target(cfg.target)
        st = ArtifactStore(cfg.store)
        fetched = steps.prepare_model(st, cfg, target=tgt)
        extracted = steps.extract_step(st, fetched, tgt, steps.offload_config(cfg, tgt))
        tasks = select_tasks(
            load_tasks(extracted.path), cfg.tune.task_filter, packed_float=steps.wholly_on_cpu(cfg, tgt)
        )
        if as_json:
            out = []
            for t in tasks:
                d = {"name": t.name, "weight": t.weight, "op": t.op, "flops": t.flops}
                if t.workload is not None:
                    d["workload"] = t.workload
                out.append(d)
            typer.echo(json.dumps(out, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"tuning tasks of {cfg.model.display_name} for {tgt.name}")
        for h in ("#", "task", "weight", "MFLOP", *WORKLOAD_FIELDS):
            table.add_column(h)
        for t in tasks:
            wl = [str(v) for v in t.workload] if t.workload else ["-"] * len(WORKLOAD_FIELDS)
            table.add_row(str(t.index), t.name, str(t.weight), f"{t.flops / 1e6:.1f}", *wl)
        console = Console(width=None if sys.stdout.isatty() else 200)
        console.print(table)
        from vta_pipeline.vta.tasks import load_tasks as load_vta_tasks

        vta_tasks = load_vta_tasks(extracted.path)
        if vta_tasks:
            vt = Table(title=f"VTA knob tasks (the packed convs offloaded to VTA by {tgt.name})")
            for h in ("task", "convs", "GOPs", *WORKLOAD_FIELDS):
                vt.add_column(h)
            for t in vta_tasks:
                wl = (str(v) for v in list(t.workload.__dict__.values())[: len(WORKLOAD_FIELDS)])  # groups: the name
                vt.add_row(t.name, str(t.count), f"{t.ops() / 1e9:.3f}", *wl)
            console.print(vt)

    _guard(go)


@config_flags("model", "store", "int8", exclude=("model", "pretrained", "vta"))
def pack_points_cmd(
    model: Annotated[Optional[str], typer.Argument(help="Model name (default: built-in tinynet).")] = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    *,
    overrides: dict,
):
    """List the network's operators with their occurrence indices, mark the start/stop that the
    pack options select (default: first nn.max_pool2d, then the first global average pool), and
    say whether that region packs, or which operator stops it."""

    def go():
        from vta_pipeline import pack as pack_mod
        from vta_pipeline import steps

        from ..store.artifacts import ArtifactStore

        cfg = _config(config, {"model.name": model, **overrides})
        st = ArtifactStore(cfg.store)
        art = steps.prepare_model(st, cfg, upto="quantize")
        res = pack_mod.pack_points(art.path, cfg.pack, cfg.vta)
        if as_json:
            typer.echo(json.dumps(res, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"operators of {cfg.model.display_name} (blocks b={res['bfactor']}, c={res['cfactor']})")
        for h in ("#", "operator", "occurrence", "inputs", "output", ""):
            table.add_column(h)
        for r in res["operators"]:
            mark = ""
            if r["index"] == res["start"]:
                mark = "START (packed after)"
            elif r["index"] == res["stop"]:
                mark = "STOP (unpacked before)"
            elif res["start"] is not None and res["start"] < r["index"] < (res["stop"] or 10**9):
                mark = "packed" if res["packable"] else "in region"
            name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
            ins = ", ".join("x".join(map(str, s)) if s else "?" for s in r["inputs"])
            out = "x".join(map(str, r["output"])) if r["output"] else "?"
            table.add_row(str(r["index"]), name, str(r["occurrence"]), ins, out, mark)
        console = Console(width=None if sys.stdout.isatty() else 150)
        console.print(table)
        if res["packable"]:
            console.print(f"region #{res['start']} -> #{res['stop']} packs: {res['packed_ops']} operators packed")
        else:
            console.print(f"[red]not packable:[/red] {res['error']}")

    _guard(go)


@config_flags("model", "target", "int8", "opt", exclude=("pretrained",))
def build_cmd(
    config: ConfigOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Copy the library here too.")] = None,
    *,
    overrides: dict,
):
    """Build the network untuned for a target, without a board (cross-compiled for the ARM
    presets), cached in the store like a run's steps; prints the library's path. Tuned
    builds come from `run`, which needs the boards."""

    def go():
        import shutil

        from vta_pipeline import steps
        from vta_pipeline.targets import resolve_target

        from ..store.artifacts import ArtifactStore

        cfg = _config(config, overrides)
        tgt = resolve_target(cfg.target)
        steps.check_target(cfg, tgt)
        st = ArtifactStore(cfg.store)
        extracted = steps.extract_step(
            st, steps.prepare_model(st, cfg, target=tgt), tgt, steps.offload_config(cfg, tgt)
        )
        built = steps.build_step(st, extracted, None, tgt)
        lib = built.file("model.so")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, out)
            lib = out
        typer.echo(
            f"{cfg.model.name} for {tgt.name} ({json.dumps(tgt.full_json)}): {lib} "
            f"({lib.stat().st_size / 1e6:.1f} MB{', ' + tgt.cross_compiler if tgt.cross_compiler else ''})"
        )

    _guard(go)
