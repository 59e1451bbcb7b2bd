"""The Relax lowering that task extraction and the build share.

Tuning records are looked up by the structure of each fused TIR function, so extraction
and build must lower the network identically; both go through `lower_for_tuning`.
Batch norm is folded into the conv weights first (it matches OIHW kernels only, so it must
run before any layout change), then the usual inference lowering: decompose, legalize,
constant folding, operator fusion. Packed convs (graph pack's VTA layouts) and integer avg
pools are legalized by `passes.packed_ops`; everything else by Relax's defaults.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .passes.packed_ops import legalize_map


def lower_for_tuning(mod: tvm.IRModule) -> tvm.IRModule:
    seq = tvm.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.FoldConstant(),
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
