"""Step 2, extract tasks: the network's tuning tasks, with weights and conv2d workloads.

Each task is one fused TIR function of the lowered network; its weight is how often it
occurs. For conv2d tasks we also report the workload tuple the VTA recipe printed:
(batch, height, width, in_filter, out_filter, kh, kw, pad_h, pad_w, stride_h, stride_w),
read off the TIR itself (buffer shapes and the conv's input index expressions), so it is
right for every frontend.

Artifact: tasks.json (the table) and tasks/<i>.json (each task's TIR module), plus the
lowered network (lowered.json) that the build step compiles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STEP = "extract"
VERSION = 6  # 3: layout-free weights (pre-packing); x86 dot-product convs. 4: structural workload keys.
# 5: Winograd convs (graph pack's --winograd) read as packed_conv2d_winograd, with their conv's workload.
# 6: a blocked tensor's sigmoid, SiLU and tanh as vectorizable polynomials (`packed_ops.FAST_ACTIVATIONS`)
# The offloaded convs' compiler and where their knobs start, in a VTA extract's key only (a CPU
# target's extracts stay valid): 1: hardware-legal streams, TopHub's configs as the start,
# depthwise and grouped convs.
VTA_OFFLOAD_VERSION = 1

WORKLOAD_FIELDS = (
    "batch", "height", "width", "in_filter", "out_filter",
    "kh", "kw", "pad_h", "pad_w", "stride_h", "stride_w",
)  # fmt: skip


@dataclass
class TaskInfo:
    index: int
    name: str
    weight: int
    flops: float
    file: str
    workload_hash: str  # the TIR's structural hash (workload_keys.workload_key): same workload, same key
    op: str  # "conv2d", "depthwise_conv2d", "dense", ... or "other"
    workload: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(e) -> int:
    return int(e.value) if hasattr(e, "value") else int(e)


def _linear(expr, block, axis: int):
    """(coefficient of the block's iter var `axis`, constant term) of an index, or None.

    The index is decomposed over all iter vars of the block (for a conv's input index
    `yy * stride + ry * dilation` that gives the stride; for a pad block's `i - pad` the
    constant gives the padding)."""
    from tvm.sym.pattern import detect_linear_equation

    vs = [iv.var for iv in block.iter_vars]
    r = detect_linear_equation(expr, vs)
    if len(r) != len(vs) + 1:
        return None
    try:
        return _int(r[axis]), _int(r[-1])
    except TypeError:
        return None


CONV_BLOCKS = (
    "conv2d_nchw",
    "group_conv2d_nchw",
    "DepthwiseConv2d",
    "conv2d_packed",
    "conv2d_dot_packed",
    "depthwise_conv2d_packed",
    "depthwise_conv2d_dot_packed",
    "conv2d_nhwc",
    "group_conv2d_nhwc",
    "depthwise_conv2d_nhwc",
)
CONV_OPS = (
    "conv2d",
    "depthwise_conv2d",
    "group_conv2d",
    "packed_conv2d",
    "packed_depthwise_conv2d",
    "packed_conv2d_winograd",
)
# The blocks of passes/winograd.py's conv (by name, so reading a task needs no import of the pass)
WINOGRAD_PAD, WINOGRAD_GEMM, WINOGRAD_INVERSE = "winograd_pad", "winograd_gemm", "winograd_inverse"


def _winograd_workload(blocks: dict[str, Any]) -> tuple[str, list[int]] | None:
    """The workload of a Winograd conv (graph pack's `--winograd`): the direct conv it
    computes, 3x3, stride 1, padding 1, read off its padding block's input (N, C/c, H, W, 1, c)
    and its inverse transform's output (N, OC/c, H, W, 1, c)."""
    pad = next((b for n, b in blocks.items() if n.startswith(WINOGRAD_PAD)), None)
    inverse = next((b for n, b in blocks.items() if n.startswith(WINOGRAD_INVERSE)), None)
    if pad is None or inverse is None or not pad.reads:
        return None
    data = [_int(d) for d in pad.reads[0].source.shape]
    out = [_int(d) for d in inverse.writes[0].source.shape]
    if len(data) != 6 or len(out) != 6:
        return None
    n, c, h, w = data[0] * data[4], data[1] * data[5], data[2], data[3]
    return "packed_conv2d_winograd", [n, h, w, c, out[1] * out[5], 3, 3, 1, 1, 1, 1]


def conv2d_workload(prim_mod) -> tuple[str, list[int]] | None:
    """Find the conv block of a fused TIR function and read its workload, or None.

    Layouts: NCHW (OIHW kernels), VTA-packed NCHWnc (OIHWoi) and NHWC (HWIO kernels, the
    GPU presets); a Winograd conv (`--winograd`) gives the workload of the conv it computes."""
    from tvm.s_tir import Schedule

    sch = Schedule(prim_mod)
    blocks = {sch.get(b).name_hint: sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))}
    conv = next((b for n, b in blocks.items() if n.startswith(CONV_BLOCKS)), None)
    if conv is None:
        return _winograd_workload(blocks) if any(n.startswith(WINOGRAD_GEMM) for n in blocks) else None
    name = conv.name_hint
    packed = name.endswith("_packed")
    nhwc = "nhwc" in name
    h_ax, w_ax, c_ax = (1, 2, 3) if nhwc else (2, 3, 1)
    out = conv.writes[0].source
    oshape = [_int(d) for d in out.shape]
    # packed (VTA): out (N/b, O/c, OH, OW, b, c); data (N/b, C/c, H, W, b, c)
    if packed:
        n, oc = oshape[0] * oshape[4], oshape[1] * oshape[5]
    else:
        n, oc = oshape[0], oshape[3 if nhwc else 1]
    data_region, kernel_region = conv.reads[0], conv.reads[1]
    kernel = kernel_region.source
    kh, kw = (_int(d) for d in (kernel.shape[0:2] if nhwc else kernel.shape[2:4]))
    sh = (_linear(data_region.region[h_ax].min, conv, h_ax) or (1, 0))[0]
    sw = (_linear(data_region.region[w_ax].min, conv, w_ax) or (1, 0))[0]
    pad_h = pad_w = 0
    src_shape = [_int(d) for d in data_region.source.shape]
    pad_block = blocks.get(data_region.source.name) or next(
        (b for nm, b in blocks.items() if b.writes and b.writes[0].source.same_as(data_region.source)), None
    )
    if pad_block is not None and pad_block.reads:
        src = pad_block.reads[0]
        src_shape = [_int(d) for d in src.source.shape]
        ly, lx = _linear(src.region[h_ax].min, pad_block, h_ax), _linear(src.region[w_ax].min, pad_block, w_ax)
        pad_h = -ly[1] if ly else (_int(data_region.source.shape[h_ax]) - src_shape[h_ax]) // 2
        pad_w = -lx[1] if lx else (_int(data_region.source.shape[w_ax]) - src_shape[w_ax]) // 2
    h, w = src_shape[h_ax], src_shape[w_ax]
    c = src_shape[1] * src_shape[5] if packed else src_shape[c_ax]
    if packed:
        op = "packed_conv2d" if name.startswith("conv2d") else "packed_depthwise_conv2d"
    elif name.startswith("conv2d"):
        op = "conv2d"
    elif name.startswith(("Depthwise", "depthwise")):
        op = "depthwise_conv2d"
    else:
        op = "group_conv2d"
    return op, [n, h, w, c, oc, kh, kw, pad_h, pad_w, sh, sw]


def extract_tasks(
    imported_dir: Path,
    target_spec: dict[str, Any],
    out_dir: Path,
    layout: str = "NCHW",
    vta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lower the imported network (convs in `layout`) and write its tuning tasks into out_dir.

    `target_spec` is the full target JSON, host included: GPU tasks are extracted for the
    device kind, and the lowered network is compiled later for both. With `vta` (a VTA
    config), the packed convs VTA can run are offloaded first, under the untuned knobs: their
    knob tasks go to vta_tasks.json, what stayed on the CPU (and why) to offload.json, and the
    MetaSchedule tasks are those of the rest."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    from .fetch import load_module
    from .passes.pipeline import lower_for_tuning
    from .store.workload_keys import workload_key

    target = tvm.target.Target(target_spec)
    mod = load_module(imported_dir)
    offloaded = _offload_vta(mod, vta, out_dir) if vta is not None else None
    if offloaded is not None:
        mod = offloaded["module"]
    lowered = lower_for_tuning(mod, layout)
    (out_dir / "lowered.json").write_text(tvm.ir.save_json(lowered))
    extracted = ms.relax_integration.extract_tasks(lowered, target)
    (out_dir / "tasks").mkdir()
    infos: list[TaskInfo] = []
    for i, t in enumerate(extracted):
        text = tvm.ir.save_json(t.dispatched[0])
        fname = f"tasks/{i:03d}.json"
        (out_dir / fname).write_text(text)
        found = conv2d_workload(t.dispatched[0])
        try:
            flops = float(estimate_tir_flops(t.dispatched[0]))
        except Exception:
            flops = 0.0
        infos.append(
            TaskInfo(
                index=i,
                name=t.task_name,
                weight=int(t.weight),
                flops=flops,
                file=fname,
                workload_hash=workload_key(t.dispatched[0]),
                op=found[0] if found else ("dense" if "matmul" in t.task_name or "dense" in t.task_name else "other"),
                workload=found[1] if found else None,
            )
        )
    (out_dir / "tasks.json").write_text(json.dumps([t.to_dict() for t in infos], indent=1))
    meta = {"num_tasks": len(infos), "num_conv2d": sum(t.workload is not None for t in infos)}
    if offloaded is not None:
        meta.update(offloaded["meta"])
    return meta


def _offload_vta(mod: Any, vta: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from .passes.vta_offload import offload_convs
    from .vta import tasks as vta_tasks
    from .vta.config import VTAConfig
    from .vta.conv import beyond_the_recipe
    from .vta.tophub import start_knobs

    cfg = VTAConfig(**vta)
    sources: dict[tuple, str] = {}

    def knobs_for(wl, epi):  # TopHub's measured config where one fits, as the recipe started
        knobs, sources[wl, epi] = start_knobs(wl, cfg, epi)
        return knobs

    mod, report = offload_convs(mod, cfg, knobs_for)
    tasks = vta_tasks.tasks_of(report)
    vta_tasks.save_tasks(out_dir, tasks)
    (out_dir / "offload.json").write_text(
        json.dumps(
            [
                {
                    "name": c.name,
                    "on_vta": c.on_vta,
                    "workload": c.workload.__dict__ if c.workload else None,
                    "reason": c.reason,
                    "knobs_from": sources.get((c.workload, c.epilogue)),
                    "beyond_the_recipe": beyond_the_recipe(c.workload, c.epilogue) if c.on_vta else None,
                }
                for c in report
            ],
            indent=1,
        )
    )
    on_vta = sum(c.on_vta for c in report)
    return {
        "module": mod,
        "meta": {"vta_convs": on_vta, "cpu_packed_convs": len(report) - on_vta, "vta_tasks": len(tasks)},
    }


def load_tasks(extract_dir: Path) -> list[TaskInfo]:
    return [TaskInfo(**d) for d in json.loads((Path(extract_dir) / "tasks.json").read_text())]


def select_tasks(tasks: list[TaskInfo], task_filter: str, packed_float: bool = False) -> list[TaskInfo]:
    """The tasks to tune. `auto`: the packed conv2d tasks when the network is packed for VTA
    (the recipe kept only convs whose input has more than 4 dimensions: the rest ran on the
    board's CPU), else all of them: a network packed in the x86 layout (int8 on the CPU) or
    a float one, packed (`packed_float`: NCHW16c on a CPU) or not, runs wholly on the CPU,
    where a function left untuned keeps TVM's default lowering, one thread and no vectors:
    an untuned classifier or input quantize can cost as much as every tuned conv together
    (docs/performance.md, "Numbers behind the library's choices")."""
    if task_filter == "auto":
        if packed_float or any("dot_packed" in t.name for t in tasks):
            task_filter = "all"
        else:
            task_filter = "packed" if any(t.op.startswith("packed_") for t in tasks) else "all"
    if task_filter == "packed":
        return [t for t in tasks if t.op.startswith("packed_")]
    if task_filter == "conv2d":
        return [t for t in tasks if t.op in CONV_OPS]
    return list(tasks)
