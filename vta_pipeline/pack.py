"""Step "pack": VTA's graph_pack over the (quantized) network, and the pack-points listing.

Artifact: module.json (the packed Relax module), packed.py (its Relax text), pack.json
(region and packed operators), reference.npz (carried over: packing changes layouts,
not values). With `winograd`, the float 3x3 convs it applies to are then rewritten to
Winograd (`passes/winograd.py`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .config import PackConfig
from .errors import UserError
from .vta.config import VTAConfig

STEP = "pack"
VERSION = 3  # 2: the start operator's elementwise tail stays unpacked (fused with it); 3: a global mean at
# the stop reads the blocks (no unpack)


def pack_params(pack: PackConfig, vta: VTAConfig):
    from .passes.graph_pack import PackParams

    if vta.BLOCK_IN != vta.BLOCK_OUT and pack.cfactor is None:
        raise UserError(f"VTA config has BLOCK_IN={vta.BLOCK_IN} != BLOCK_OUT={vta.BLOCK_OUT}; "
                        "graph pack uses one channel block: set pack.cfactor")  # fmt: skip
    return PackParams(
        bfactor=pack.bfactor or vta.BATCH,
        cfactor=pack.cfactor or vta.BLOCK_OUT,
        weight_bits=pack.weight_bits or vta.WGT_WIDTH,
        start_name=pack.start_name,
        stop_name=pack.stop_name,
        start_name_idx=pack.start_name_idx,
        stop_name_idx=pack.stop_name_idx,
        layout=pack.layout,
        pad_channels=pack.pad_channels,
        stem=pack.stem,
        depthwise_dot=pack.depthwise_dot,
    )


def network(model_dir: Path):
    """The network as graph pack sees it: weights bound, batch norm folded."""
    from .fetch import load_module
    from .passes.quantize import fold_batch_norm

    return fold_batch_norm(load_module(model_dir))


def pack_model(model_dir: Path, pack: PackConfig, vta: VTAConfig, out_dir: Path) -> dict[str, Any]:
    import tvm

    from .passes.graph_pack import graph_pack

    packed, rep = graph_pack(network(model_dir), pack_params(pack, vta))
    winograd = 0
    if pack.winograd:
        from .passes.winograd import rewrite

        packed, winograd = rewrite(packed, small_below=pack.winograd_small_below)
    (out_dir / "module.json").write_text(tvm.ir.save_json(packed))
    (out_dir / "packed.py").write_text(packed.script(show_meta=False))
    (out_dir / "pack.json").write_text(json.dumps(rep.to_dict(), indent=1))
    shutil.copy2(Path(model_dir) / "reference.npz", out_dir / "reference.npz")
    return {"start": rep.start, "stop": rep.stop, "packed_ops": len(rep.packed_ops),
            "bfactor": rep.bfactor, "cfactor": rep.cfactor, "layout": rep.layout,
            "uint8_convs": rep.uint8_convs, **({"winograd_convs": winograd} if pack.winograd else {})}  # fmt: skip


def pack_points(model_dir: Path, pack: PackConfig, vta: VTAConfig) -> dict[str, Any]:
    """Every operator with its index, occurrence and shapes; the region the options select and
    whether it packs (the error, naming the operator, when it does not)."""
    from .passes.graph import op_sequence
    from .passes.graph_pack import PackError, aliases, find_region, graph_pack

    mod = network(model_dir)
    ops = op_sequence(mod)
    params = pack_params(pack, vta)
    rows = [{"index": o.index, "name": o.name, "aliases": aliases(o), "occurrence": o.occurrence,
             "inputs": [list(s) if s else None for s in o.in_shapes],
             "output": list(o.out_shape) if o.out_shape else None} for o in ops]  # fmt: skip
    out: dict[str, Any] = {"operators": rows, "bfactor": params.bfactor, "cfactor": params.cfactor,
                           "start": None, "stop": None, "packable": False, "error": None}  # fmt: skip
    try:
        region = find_region(ops, params)
        out["start"], out["stop"] = region.start.index, region.stop.index if region.stop else None
        _, rep = graph_pack(mod, params)
        out["packable"] = True
        out["packed_ops"] = len(rep.packed_ops)
    except PackError as e:
        out["error"] = str(e)
    return out
