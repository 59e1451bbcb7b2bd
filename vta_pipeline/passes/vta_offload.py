"""Offload packed convs to VTA: each packed conv2d and its epilogue becomes one call of the board's
`vta_pipeline.vta.conv2d` (Relax `call_dps_packed`), as the recipe's `vta.build_config` put the
packed region on VTA and left the rest (stem, pools, classifier) to the board's CPU.

A packed conv is offloaded when everything between its int32 accumulator and the int8 value
it ends in is what VTA's compute module does after a GEMM (`conv.Epilogue`), read by nothing
else. The chain our quantize pass emits:

    conv2d (NCHW{b}n{bi}c int8, OIHW{bo}o{bi}i constant int8 -> int32)
    [+ bias (constant, per output channel)]  [relu]  [+ round]  [>> shift]
    [+ astype(residual int8, int32)]  [relu]  [+ round  >> shift]  [minimum hi]  [maximum lo]  astype int8

A residual added after the shift is added before it, shifted left by it: `(a + (r << s)) >> s`
is `(a >> s) + r` for an arithmetic shift, exactly. A ReLU becomes the clip's lower bound 0: it
commutes with the rounding shift (the rounding add is below 2^shift), not with a residual add,
so a ReLU before a residual leaves the conv on the CPU. A depthwise conv (graph pack's
`OIHW{bo}o` kernel) runs as one GEMM per output block against diagonal weight tiles
(`conv.depthwise_weights`), a grouped conv whose groups hold whole blocks as VTA's
`group_conv2d_packed`. Anything else (another reader of the accumulator, a non-constant weight,
other groups, a dilated conv) leaves it on the CPU too, and `offload_convs` says why for each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..vta.config import VTAConfig
from ..vta.conv import ConvWorkload, Epilogue, KnobError, Knobs, depthwise_weights
from ..vta.runtime import CONV2D, ConvSpec
from ..vta.simulator import CycleModel
from .graph import Const, Rebuilder, const_value, dtype_of, main_bindings, op_name, shape_of


@dataclass
class OffloadedConv:
    """One packed conv of the network and where it runs (`reason` says why not on VTA)."""

    name: str  # the accumulator's variable
    workload: ConvWorkload | None
    epilogue: Epilogue | None
    knobs: Knobs | None = None
    reason: str | None = None  # None: on VTA

    @property
    def on_vta(self) -> bool:
        return self.reason is None


@dataclass
class _Match:
    last: relax.Var  # the int8 value the chain ends in: the call's output
    data: relax.Expr
    kernel: np.ndarray
    bias: np.ndarray | None
    residual: relax.Expr | None
    workload: ConvWorkload
    epilogue: Epilogue
    knobs: Knobs | None = None


def _const_scalar(e: Any) -> int | None:
    v = const_value(e)
    return int(v.reshape(())) if v is not None and v.size == 1 else None


def _call(b: Any, name: str) -> relax.Call | None:
    return b.value if b is not None and op_name(b.value) == name else None


class _Scan:
    """The bindings of `main`, with who reads each variable."""

    def __init__(self, mod: tvm.IRModule):
        self.bindings: dict[relax.Var, Any] = {}
        self.readers: dict[relax.Var, list[relax.Var]] = {}
        for b in main_bindings(mod):
            self.bindings[b.var] = b
            for v in relax.analysis.free_vars(b.value):
                self.readers.setdefault(v, []).append(b.var)
        for v in relax.analysis.free_vars(mod["main"].body.body):
            self.readers.setdefault(v, []).append(v)

    def sole_reader(self, v: relax.Var) -> relax.VarBinding | None:
        r = self.readers.get(v, [])
        return self.bindings.get(r[0]) if len(r) == 1 else None


def _match_conv(scan: _Scan, var: relax.Var, call: relax.Call, cfg: VTAConfig) -> _Match | str:
    """The conv's chain as an Epilogue, or why it stays on the CPU."""
    a = call.attrs
    b, bi, bo = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    data, weight = call.args
    depthwise = str(a.kernel_layout) == f"OIHW{bo}o"  # graph pack's depthwise kernel: one weight per channel
    if (a.data_layout, a.kernel_layout) not in (
        (f"NCHW{b}n{bi}c", f"OIHW{bo}o{bi}i"),
        (f"NCHW{b}n{bi}c", f"OIHW{bo}o"),
    ):
        return f"layout {a.data_layout}/{a.kernel_layout}, not VTA's NCHW{b}n{bi}c/OIHW{bo}o{bi}i"
    if (dtype_of(data), dtype_of(weight), str(a.out_dtype)) != ("int8", "int8", "int32"):
        return f"types {dtype_of(data)} x {dtype_of(weight)} -> {a.out_dtype}, not int8 x int8 -> int32"
    if any(int(d) != 1 for d in a.dilation):
        return "dilated"
    if not isinstance(weight, Const):
        return "its weights are not a constant"
    pad = [int(p) for p in a.padding]
    if pad[0] != pad[2] or pad[1] != pad[3]:
        return f"asymmetric padding {pad}"
    n, cib, h, w, _, _ = shape_of(data)
    kernel = const_value(weight)
    if depthwise:  # VTA multiplies blocks: each channel's weight on a diagonal tile
        kernel = depthwise_weights(kernel)
    cob, _, kh, kw, _, _ = kernel.shape
    wl = ConvWorkload(
        n * b, h, w, cib * bi, cob * bo, kh, kw, pad[0], pad[1], int(a.strides[0]), int(a.strides[1]), int(a.groups)
    )
    if not wl.block_groups(bi):
        return f"groups={wl.groups}: VTA runs grouped convs whose groups hold whole blocks of {bi}, and depthwise convs"

    epi: dict[str, Any] = {"bias": False, "round_add": 0, "shift": 0, "clip_min": -128, "clip_max": 127}
    bias = residual = None
    relu = False  # seen: nothing it does not commute with may follow
    clipped: set[str] = set()
    pre: dict[str, int] = {}  # a clip before the shift (`chain` below)
    # where in VTA's epilogue the chain is: each operator must come at or after the last one's place
    BIAS, ROUND, SHIFT, RESIDUAL, POST_ROUND, POST_SHIFT, CLIP = range(7)
    stage = BIAS
    cur = var
    while True:
        nxt = scan.sole_reader(cur)
        if nxt is None:
            return f"{cur.name} is read by {len(scan.readers.get(cur, []))} operators, not one"
        c = nxt.value
        op = op_name(c) or type(c).__name__
        other = [x for x in getattr(c, "args", []) if not (isinstance(x, relax.Var) and x.same_as(cur))]
        k = _const_scalar(other[0]) if len(other) == 1 else None
        cast = _call(scan.bindings.get(other[0]), "astype") if len(other) == 1 else None
        if op == "astype":
            if str(c.attrs.dtype) != "int8":
                return f"its result leaves as {c.attrs.dtype}, not int8 (VTA stores int8)"
            last = nxt.var
            break
        if (
            op == "add"
            and stage == BIAS
            and not relu
            and len(other) == 1
            and isinstance(other[0], Const)
            and const_value(other[0]).size == wl.out_filter
        ):
            bias = const_value(other[0]).astype(np.int32).reshape(1, cob, 1, 1, b, bo)
            epi["bias"], stage = True, ROUND
        elif op == "nn.relu":
            relu = True
        elif op == "add" and k is not None and stage <= ROUND:
            epi["round_add"], stage = k, SHIFT
        elif op == "add" and k is not None and residual is not None and stage <= POST_ROUND:
            epi["post_round_add"], stage = k, POST_SHIFT
        elif op == "right_shift" and k is not None and k >= 0 and stage <= SHIFT:
            epi["shift"], stage = k, RESIDUAL
        elif op == "right_shift" and k is not None and k >= 0 and residual is not None and stage <= POST_SHIFT:
            epi["post_shift"], stage = k, CLIP
        elif op == "add" and stage <= RESIDUAL and cast is not None and dtype_of(cast.args[0]) == "int8":
            if relu:
                return "a ReLU before its residual add (VTA's epilogue clips after it)"
            residual = cast.args[0]
            epi["residual_shift"], stage = epi["shift"], POST_ROUND
        elif op in ("minimum", "maximum") and k is not None and stage <= SHIFT and residual is None:
            # a clip at the accumulator's scale (ReLU6 before the requantize): the rest of the
            # chain is monotone, so it clips the result at the bounds the chain maps it to
            pre[op] = min(pre.get(op, k), k) if op == "minimum" else max(pre.get(op, k), k)
        elif op == "minimum" and k is not None:
            epi["clip_max"], stage = min(epi["clip_max"], k), CLIP
            clipped.add("max")
        elif op == "maximum" and k is not None:
            epi["clip_min"], stage = max(epi["clip_min"], k), CLIP
            clipped.add("min")
        else:
            return f"{op} after it is not part of VTA's epilogue"
        cur = nxt.var
    if clipped != {"min", "max"}:
        return "no clip to int8 before its cast (VTA's epilogue clips, the cast would wrap)"
    if pre:
        if epi.get("residual_shift") is not None:
            return "a clip before its residual add (VTA's epilogue clips after it)"

        def chain(v: int) -> int:  # the requantize, as VTA's ALU runs it: monotone in v
            v = (v + epi["round_add"]) >> epi["shift"]
            return (v + epi.get("post_round_add", 0)) >> epi.get("post_shift", 0)

        if "minimum" in pre:
            epi["clip_max"] = min(epi["clip_max"], chain(pre["minimum"]))
        if "maximum" in pre:
            epi["clip_min"] = max(epi["clip_min"], chain(pre["maximum"]))
    if relu:
        epi["clip_min"] = max(epi["clip_min"], 0)
        for r, sh in ((epi["round_add"], epi["shift"]), (epi.get("post_round_add", 0), epi.get("post_shift", 0))):
            if not 0 <= r < (1 << sh) and (r or sh):
                return f"a ReLU before a rounding add {r} not in [0, 2^{sh})"
    return _Match(last, data, kernel, bias, residual, wl, Epilogue(**epi))


def offload_convs(
    mod: tvm.IRModule,
    cfg: VTAConfig,
    knobs_for: Callable[[ConvWorkload, Epilogue], Knobs],
    cycle_model: CycleModel = CycleModel(),
) -> tuple[tvm.IRModule, list[OffloadedConv]]:
    """`mod` with each offloadable packed conv (and its epilogue) a call of the VTA board's
    conv2d, compiled under `knobs_for(workload, epilogue)`; and, per packed conv, where it runs."""
    scan = _Scan(mod)
    matches: dict[relax.Var, _Match] = {}
    report: list[OffloadedConv] = []
    for var, b in scan.bindings.items():
        call = _call(b, "nn.conv2d")
        if call is None or "n" not in str(call.attrs.data_layout):
            continue  # not packed: a CPU conv by design (the stem)
        m = _match_conv(scan, var, call, cfg)
        if isinstance(m, str):
            report.append(OffloadedConv(str(var.name), None, None, reason=m))
            continue
        try:
            knobs = knobs_for(m.workload, m.epilogue)
        except KnobError as e:  # no config of VTA's can run it (e.g. a 1x1 map of one channel block)
            report.append(OffloadedConv(str(var.name), None, None, reason=str(e)))
            continue
        report.append(OffloadedConv(str(var.name), m.workload, m.epilogue, knobs))
        matches[m.last] = replace(m, knobs=knobs)
    if not matches:
        return mod, report
    return _Offload(matches, cfg, cycle_model).run(mod), report


class _Offload(Rebuilder):
    def __init__(self, matches: dict[relax.Var, _Match], cfg: VTAConfig, cycle_model: CycleModel):
        super().__init__()
        self.matches, self.cfg, self.cycle_model = matches, cfg, cycle_model

    def rewrite(self, index: int, binding: Any) -> Any:
        m = self.matches.get(binding.var)
        if m is None:
            return self.copy(binding)
        spec = ConvSpec(self.cfg.model_dump(), m.workload, m.epilogue, m.knobs, self.cycle_model)
        args = [self.lookup(m.data), relax.const(m.kernel, "int8")]
        if m.bias is not None:
            args.append(relax.const(m.bias, "int32"))
        if m.residual is not None:
            args.append(self.lookup(m.residual))
        args.append(tvm.ir.expr.StringImm(spec.to_json()))
        out_ty = relax.TensorType(list(shape_of(binding.var)), "int8")
        return self.emit(relax.call_dps_packed(CONV2D, args, out_ty), str(binding.var.name))
