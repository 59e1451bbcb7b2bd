"""Step "cpu_layout": every conv of the (quantized) network blocked for the CPU
(`passes/cpu_layout`), and the optimization presets (`recipe`) that decide what a run on a
CPU target applies when the user passes no layout flag.

Artifact: module.json (the blocked Relax module), blocked.py (its Relax text), layout.json
(what the pass did: convs blocked and left in NCHW, the layout transforms it added, the
blocks), reference.npz (carried over: the layout changes no value).

The presets (`PipelineConfig.opt`), in the manner of a compiler's -O levels:
  O0  TVM's generic design spaces in plain NCHW: what MetaSchedule does alone
  O1  every conv blocked and tuned in our packed design spaces (float: NeoCPU's direct
      conv; int8: the CPU's dot product)
  O2  O1, and Winograd for float 3x3 stride-1 convs at least 14 wide (the default)
Graph pack (`--pack`, `--vta`) replaces the blocked layout by VTA's region; GPU targets and
VTA offload take none of this.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config import PipelineConfig

STEP = "cpu_layout"
VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """What a run applies to its network on its target, resolved from the preset and overrides."""

    blocked: bool
    winograd: bool
    winograd_small_below: int = 28

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def on_cpu(cfg: PipelineConfig, target: Any) -> bool:
    """Whether the blocked layout can apply: an NCHW CPU target, no VTA offload, no graph pack."""
    return target.kind == "llvm" and target.offload is None and target.layout == "NCHW" and not cfg.pack.enabled


def recipe(cfg: PipelineConfig, target: Any) -> Recipe:
    """The preset `cfg.opt`, with the layout fields the user gave winning over it."""
    level = int(cfg.opt[1])
    blocked = on_cpu(cfg, target) and (cfg.layout.enabled if cfg.layout.enabled is not None else level >= 1)
    winograd = blocked and (cfg.layout.winograd if cfg.layout.winograd is not None else level >= 2)
    return Recipe(blocked, winograd, cfg.layout.winograd_small_below)


def layout_config(r: Recipe, target_json: dict[str, Any]) -> dict[str, Any]:
    """The step's config (part of its key): the blocks for the target, Winograd's choice."""
    from .passes.cpu_layout import params_for

    return {"params": asdict(params_for(target_json)), "winograd": r.winograd,
            **({"winograd_small_below": r.winograd_small_below} if r.winograd else {})}


def layout_model(model_dir: Path, config: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    import tvm

    from .pack import network
    from .passes.cpu_layout import LayoutParams, cpu_layout

    mod, rep = cpu_layout(network(model_dir), LayoutParams(**config["params"]))
    winograd = 0
    if config["winograd"]:
        from .passes.winograd import rewrite

        mod, winograd = rewrite(mod, small_below=config["winograd_small_below"])
    report = {**rep.to_dict(), "winograd_convs": winograd}
    (out_dir / "module.json").write_text(tvm.ir.save_json(mod))
    (out_dir / "blocked.py").write_text(mod.script(show_meta=False))
    (out_dir / "layout.json").write_text(json.dumps(report, indent=1))
    shutil.copy2(Path(model_dir) / "reference.npz", out_dir / "reference.npz")
    return {"convs": rep.convs, "blocked_convs": rep.blocked_convs, "plain_convs": len(rep.plain_convs),
            "transforms": sum(rep.transforms.values()), "padded_convs": rep.padded_convs,
            "uint8_convs": rep.uint8_convs, "winograd_convs": winograd}
