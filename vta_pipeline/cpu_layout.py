"""Step "cpu_layout": every conv of the (quantized) network blocked for the CPU
(`passes/cpu_layout`), where the optimization preset says so (`presets`).

Artifact: module.json (the blocked Relax module), blocked.py (its Relax text), layout.json
(what the pass did: convs blocked and left in NCHW, the layout transforms it added, the
blocks), reference.npz (carried over: the layout changes no value).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import presets
from .config import PipelineConfig

STEP = "cpu_layout"
VERSION = 1


def recipe(cfg: PipelineConfig, target: Any) -> presets.Recipe:
    """What a run of `cfg` applies on `target` (`presets.recipe`)."""
    return presets.recipe(cfg.model_dump(mode="json"), target)


def layout_config(r: presets.Recipe, target_json: dict[str, Any]) -> dict[str, Any]:
    """The step's config (part of its key): the blocks for the target, Winograd's choice."""
    from .passes.cpu_layout import params_for

    return {
        "params": asdict(params_for(target_json)),
        "winograd": r.winograd,
        **({"winograd_small_below": r.winograd_small_below} if r.winograd else {}),
    }


def layout_model(model_dir: Path, config: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    import tvm

    from .fetch import load_module
    from .passes.cpu_layout import LayoutParams, cpu_layout
    from .passes.quantize import fold_batch_norm

    mod, rep = cpu_layout(fold_batch_norm(load_module(model_dir)), LayoutParams(**config["params"]))
    winograd = 0
    if config["winograd"]:
        from .passes.winograd import rewrite

        mod, winograd = rewrite(mod, small_below=config["winograd_small_below"])
    report = {**rep.to_dict(), "winograd_convs": winograd}
    (out_dir / "module.json").write_text(tvm.ir.save_json(mod))
    (out_dir / "blocked.py").write_text(mod.script(show_meta=False))
    (out_dir / "layout.json").write_text(json.dumps(report, indent=1))
    shutil.copy2(Path(model_dir) / "reference.npz", out_dir / "reference.npz")
    return {
        "convs": rep.convs,
        "blocked_convs": rep.blocked_convs,
        "plain_convs": len(rep.plain_convs),
        "transforms": sum(rep.transforms.values()),
        "padded_convs": rep.padded_convs,
        "uint8_convs": rep.uint8_convs,
        "winograd_convs": winograd,
    }
