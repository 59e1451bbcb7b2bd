"""The Relax lowering that task extraction and the build share.

Tuning records are looked up by the structure of each fused TIR function, so extraction
and build must lower the network identically; both go through `lower_for_tuning`.
Batch norm is folded into the conv weights first (it matches OIHW kernels only, so it must
run before any layout change), then the usual inference lowering: decompose, legalize,
constant folding, operator fusion. Packed convs (graph pack's VTA layouts) and integer avg
pools are legalized by `passes.packed_ops`; everything else by Relax's defaults.

GPU presets prefer NHWC activations (the layout the CUDA and Mali recipes tuned in): the
convs are converted right after the batch-norm fold, with HWIO kernels, the form Relax's
NHWC conv lowering takes; the transposes this adds at the network's edges fuse away or
stay as small tasks of their own.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .passes.packed_ops import legalize_map


KERNEL_LAYOUT = {"NHWC": "HWIO"}


def lower_for_tuning(mod: tvm.IRModule, layout: str = "NCHW") -> tvm.IRModule:
    if layout not in ("NCHW", *KERNEL_LAYOUT):
        raise ValueError(f"unsupported conv layout {layout!r}: NCHW or NHWC")
    convert = (
        [relax.transform.ConvertLayout({"relax.nn.conv2d": [layout, KERNEL_LAYOUT[layout]]}),
         relax.transform.FoldConstant()]
        if layout != "NCHW" else []
    )
    seq = tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),  # before ConvertLayout: it matches OIHW kernels only
            relax.transform.FoldConstant(),
            *convert,
            relax.transform.DecomposeOpsForInference(),
            relax.transform.FoldConstant(),
            relax.transform.LegalizeOps(customize_legalize_map=legalize_map()),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ],
        name="vta_pipeline.lower_for_tuning",
    )
    return seq(mod)
