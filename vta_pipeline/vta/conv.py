"""Packed conv2d, with its fused epilogue, compiled to VTA instruction streams by the recipe's knobs.

The workload is VTA's `conv2d_packed` (data `NCHW1n16c` int8, kernel `OIHW16o16i` int8,
int32 accumulators) followed by what our quantize pass fuses after it: a per-channel bias
add, a residual add (an int8 tensor shifted to the accumulator's scale), the requantize
(a rounding add, a right shift), a clip (ReLU is its lower bound), the cast to int8.

A config is the recipe's knobs (`vta/python/vta/top/vta_conv2d.py`, TVM 0.18): the output is
cut into tiles of `tile_co` channel blocks x `tile_h` rows x `tile_w` columns, the reduction
into steps of `tile_ci` input channel blocks; `oc_nthread` x `h_nthread` virtual threads give
each thread its own copy of the input, weight and accumulator tiles, so the load module
fills one copy while compute works on another. Splits are exact divisors, as the recipe's
"factors" policy has them. `tile_b` is kept for the recipe's records but has no effect (as in
TVM 0.18's schedule: batch is 1).

Per output tile (one accumulator copy):
    compute:  GEMM reset of the tile
    for each reduction step (one input and weight copy):
      load:     one LOAD INP per channel block (2-D, zero padding at the image border), one
                LOAD WGT of the tile's weights (2-D: output blocks x (ci, kh, kw))
      compute:  GEMM: iter_out over output channel blocks, iter_in over rows, micro-ops over
                (ci, kh, kw, column), columns innermost so that consecutive micro-ops write
                different accumulators (VTA's HLS GEMM pipeline assumes so)
    compute:  the epilogue as ALU ops on the tile (bias and residual: LOADs of ACC / ACC_8BIT)
    store:    one STORE per output channel block (2-D)
Tokens (VTA's dependency flags) order the modules: load -> compute after each step's loads
(read after write), compute -> load when a step's input copy may be overwritten (write after
read), compute -> store when a tile is final, store -> compute when its accumulator copy is
free again, and the last store -> FINISH. Every pushed token is popped.

`compile_conv` returns the instructions, micro-ops and the DRAM layout the stream expects
(data, weights and bias as graph pack lays them out: the weight layout is `OIHW16o16i`).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import UserError
from . import isa
from .config import VTAConfig
from .isa import AluInsn, AluOp, Deps, FinishInsn, GemmInsn, Insn, Layout, Mem, MemInsn, Opcode
from .simulator import Dram, Simulator, Stats


class KnobError(UserError):
    """A knob config that does not fit the workload or VTA's buffers; the message says which."""


@dataclass(frozen=True)
class ConvWorkload:
    """A conv2d as the recipe lists its workloads (channels, not blocks; square kernels not assumed)."""

    batch: int
    height: int
    width: int
    in_filter: int
    out_filter: int
    kh: int
    kw: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int

    @property
    def out_height(self) -> int:
        return (self.height + 2 * self.pad_h - self.kh) // self.stride_h + 1

    @property
    def out_width(self) -> int:
        return (self.width + 2 * self.pad_w - self.kw) // self.stride_w + 1

    def ops(self) -> int:
        """Multiply-adds x 2."""
        return 2 * self.batch * self.out_filter * self.out_height * self.out_width * self.in_filter * self.kh * self.kw


@dataclass(frozen=True)
class Epilogue:
    """What follows the conv, in this order: + bias[c], + (residual << residual_shift) (a
    negative shift: right), + round_add, >> shift, + post_round_add, >> post_shift, clip to
    [clip_min, clip_max]. The output is int8 (the clip must keep it in range: VTA's store
    truncates). The second rounding shift is a residual sum's requantize to the next layer's
    scale (resnet's downsampling blocks): two roundings, which one shift cannot reproduce."""

    bias: bool = True
    residual_shift: int | None = None
    round_add: int = 0
    shift: int = 0
    clip_min: int = -127
    clip_max: int = 127
    post_round_add: int = 0
    post_shift: int = 0


@dataclass(frozen=True)
class Knobs:
    """The recipe's knobs: splits as the inner factor (tile size in blocks or rows/columns)."""

    tile_b: int = 1
    tile_h: int = 1
    tile_w: int = 1
    tile_ci: int = 1
    tile_co: int = 1
    h_nthread: int = 1
    oc_nthread: int = 1

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Program:
    """A compiled conv: the stream, its micro-ops and where it expects its tensors in DRAM."""

    workload: ConvWorkload
    epilogue: Epilogue
    knobs: Knobs
    instructions: list[Insn]
    uops: np.ndarray  # (n, 3): dst, src, wgt
    buffers: dict[str, tuple[int, tuple[int, ...], str]] = field(
        default_factory=dict
    )  # name -> (address, shape, dtype)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


DST_APART = 3  # a GEMM micro-op writes no accumulator either of the two before it wrote (VerifyDep)


def gemm_fold(k: Knobs) -> int:
    """How many of the GEMM's loops its micro-ops take in, so that consecutive micro-ops write
    accumulators DST_APART apart (`simulator.HardwareRules.gemm_dst_apart`): 0, the tile's
    columns (the GEMM loops over channel blocks and rows); 1, its rows too (it loops over
    channel blocks); 2, its channel blocks too (no loops). The fewest that suffice: every
    level multiplies the micro-ops. A tile of fewer than DST_APART accumulators has none (3)."""
    for level, n in enumerate((k.tile_w, k.tile_h * k.tile_w, k.tile_co * k.tile_h * k.tile_w)):
        if n >= DST_APART:
            return level
    return 3


def gemm_uops(wl: ConvWorkload, k: Knobs) -> int:
    """The GEMM micro-ops of one thread (`gemm_fold`'s level)."""
    n = k.tile_ci * wl.kh * wl.kw * k.tile_w
    fold = gemm_fold(k)
    return n * (k.tile_h if fold >= 1 else 1) * (k.tile_co if fold >= 2 else 1)


@dataclass(frozen=True)
class _Geometry:
    cib: int  # input channel blocks
    cob: int  # output channel blocks
    oh: int
    ow: int
    ih: int  # input rows of an output tile
    iw: int
    inp_entries: int  # of one input copy
    wgt_entries: int
    acc_entries: int  # of one accumulator copy (output, bias, residual)
    threads: int


def _geometry(wl: ConvWorkload, k: Knobs, epi: Epilogue, cfg: VTAConfig) -> _Geometry:
    cib, cob = wl.in_filter // cfg.BLOCK_IN, wl.out_filter // cfg.BLOCK_OUT
    ih = (k.tile_h - 1) * wl.stride_h + wl.kh
    iw = (k.tile_w - 1) * wl.stride_w + wl.kw
    out_entries = k.tile_co * k.tile_h * k.tile_w
    acc = out_entries + (k.tile_co if epi.bias else 0) + (out_entries if epi.residual_shift is not None else 0)
    return _Geometry(
        cib,
        cob,
        wl.out_height,
        wl.out_width,
        ih,
        iw,
        k.tile_ci * ih * iw,
        k.tile_co * k.tile_ci * wl.kh * wl.kw,
        acc,
        k.h_nthread * k.oc_nthread,
    )


def check(wl: ConvWorkload, k: Knobs, epi: Epilogue, cfg: VTAConfig) -> _Geometry:
    """The config's geometry, or a KnobError that names what does not fit."""
    if wl.batch != cfg.BATCH:
        raise KnobError(f"batch {wl.batch}: this VTA config computes batch {cfg.BATCH}")
    if wl.in_filter % cfg.BLOCK_IN or wl.out_filter % cfg.BLOCK_OUT:
        raise KnobError(
            f"channels {wl.in_filter} -> {wl.out_filter} are not multiples of the block "
            f"{cfg.BLOCK_IN}: graph pack keeps such convs on the CPU"
        )
    g = _geometry(wl, k, epi, cfg)
    splits = {
        "tile_h": (k.tile_h * k.h_nthread, g.oh),
        "tile_w": (k.tile_w, g.ow),
        "tile_ci": (k.tile_ci, g.cib),
        "tile_co": (k.tile_co * k.oc_nthread, g.cob),
    }
    for name, (size, extent) in splits.items():
        if extent % size:
            raise KnobError(f"{name}: {size} (with its threads) does not divide the extent {extent}")
    if k.h_nthread not in (1, 2) or k.oc_nthread not in (1, 2):
        raise KnobError("h_nthread and oc_nthread are 1 or 2 (VTA's virtual threads)")
    if max(wl.pad_h, wl.pad_w) > 15:
        raise KnobError(f"padding {wl.pad_h}x{wl.pad_w}: a LOAD pads at most 15 per side")
    lay = Layout.of(cfg)
    need = {
        "input": (g.inp_entries * g.threads, 1 << lay.inp_depth_log),
        "weight": (g.wgt_entries * g.threads, 1 << lay.wgt_depth_log),
        "accumulator": (g.acc_entries * g.threads, 1 << lay.acc_depth_log),
    }
    for name, (entries, depth) in need.items():
        if entries > depth:
            raise KnobError(
                f"the {name} tiles need {entries} entries ({g.threads} thread(s)), more than the "
                f"{name} buffer's {depth}"
            )
    uops = g.threads * (gemm_uops(wl, k) + GEMM_UOP)
    if uops > 1 << lay.uop_depth_log:
        raise KnobError(f"{uops} micro-ops, more than the micro-op buffer's {1 << lay.uop_depth_log}")
    return g


def knob_space(wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue = Epilogue()) -> list[Knobs]:
    """Every config of the recipe's knobs (exact divisors) that fits VTA's buffers."""
    cib, cob = wl.in_filter // cfg.BLOCK_IN, wl.out_filter // cfg.BLOCK_OUT
    out = []
    for hn, on in itertools.product((1, 2), (1, 2)):
        if wl.out_height % hn or cob % on:
            continue
        for th, tw, tci, tco in itertools.product(
            _divisors(wl.out_height // hn), _divisors(wl.out_width), _divisors(cib), _divisors(cob // on)
        ):
            k = Knobs(1, th, tw, tci, tco, hn, on)
            try:
                check(wl, k, epi, cfg)
            except KnobError:
                continue
            out.append(k)
    return out


def default_knobs(wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue = Epilogue()) -> Knobs:
    """The untuned config: AutoTVM's fallback for the recipe's template, every split's inner
    factor 1 and one thread (one output pixel of one channel block per tile)."""
    k = Knobs()
    check(wl, k, epi, cfg)
    return k


def compile_conv(wl: ConvWorkload, knobs: Knobs, epi: Epilogue, cfg: VTAConfig, dram: Dram) -> Program:
    """The instruction stream of the conv under `knobs`; allocates its tensors in `dram`."""
    g = check(wl, knobs, epi, cfg)
    k, lay = knobs, Layout.of(cfg)
    b, bi, bo = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
    if not all(-(1 << 15) <= r < (1 << 15) for r in (epi.round_add, epi.post_round_add)):
        raise KnobError(
            f"the requantize's rounding add {max(epi.round_add, epi.post_round_add)} does not fit the "
            "ALU's 16-bit immediate "
            "(a shift of at most 15)"
        )
    shapes = {
        "data": ((1, g.cib, wl.height, wl.width, b, bi), "int8"),
        "kernel": ((g.cob, g.cib, wl.kh, wl.kw, bo, bi), "int8"),
        "output": ((1, g.cob, g.oh, g.ow, b, bo), "int8"),
    }
    if epi.bias:
        shapes["bias"] = ((1, g.cob, 1, 1, b, bo), "int32")
    if epi.residual_shift is not None:
        shapes["residual"] = ((1, g.cob, g.oh, g.ow, b, bo), "int8")
    addr = {name: dram.alloc(int(np.prod(shape)) * np.dtype(dt).itemsize) for name, (shape, dt) in shapes.items()}
    elem = {name: int(np.prod(shape[4:])) * np.dtype(dt).itemsize for name, (shape, dt) in shapes.items()}
    base = {name: addr[name] // elem[name] for name in addr}  # in elements of the buffer's type

    out_n = k.tile_co * k.tile_h * k.tile_w
    per_thread = GEMM_UOP + gemm_uops(wl, k)
    fold = gemm_fold(k)
    uops = np.concatenate([_thread_uops(wl, k, g, epi, r) for r in range(g.threads)])
    uaddr = dram.put(isa.encode_uops(uops[:, 0], uops[:, 1], uops[:, 2], lay))

    waves = _waves(g, k)
    steps = g.cib // k.tile_ci
    n_tiles, n_steps = len(waves) * g.threads, len(waves) * g.threads * steps
    # In program order, as VTA's fetch module dispatches it into the three modules' command
    # queues: every instruction after those whose tokens it waits for, so that no queue ever
    # has to hold more than a step's run-ahead (`simulator.HardwareRules.cmd_queue_depth`).
    stream: list[Insn] = [MemInsn(Opcode.LOAD, Mem.UOP, 0, uaddr // 4, 1, len(uops), len(uops))]
    tile = step = 0
    for wave in waves:
        for r, _ in enumerate(wave):  # reset each thread's accumulators, once its previous tile is stored
            u = r * per_thread
            stream.append(
                GemmInsn(
                    u + RESET_UOP,
                    u + RESET_UOP + 1,
                    1,
                    out_n,
                    dst_factor_in=1,
                    reset=True,
                    deps=Deps(pop_next=tile + r >= g.threads),
                )
            )
        for j in range(steps):
            for r, (co, h, w) in enumerate(wave):
                inp0, wgt0, u = r * g.inp_entries, r * g.wgt_entries, r * per_thread
                loads = _input_loads(wl, k, g, base["data"], h, w, j, inp0) + [
                    MemInsn(
                        Opcode.LOAD,
                        Mem.WGT,
                        wgt0,
                        base["kernel"] + (co * k.tile_co * g.cib + j * k.tile_ci) * wl.kh * wl.kw,
                        k.tile_co,
                        k.tile_ci * wl.kh * wl.kw,
                        g.cib * wl.kh * wl.kw,
                    )
                ]
                loads[0] = _flag(loads[0], pop_next=step >= g.threads)  # that copy's last reader is done
                loads[-1] = _flag(loads[-1], push_next=True)
                stream += loads
                rows_in_loop, co_in_loop = fold < 1, fold < 2  # the loops the micro-ops did not take in
                stream.append(
                    GemmInsn(
                        u + GEMM_UOP,
                        u + per_thread,
                        k.tile_co if co_in_loop else 1,
                        k.tile_h if rows_in_loop else 1,
                        dst_factor_out=k.tile_h * k.tile_w if co_in_loop else 0,
                        dst_factor_in=k.tile_w if rows_in_loop else 0,
                        src_factor_in=wl.stride_h * g.iw if rows_in_loop else 0,
                        wgt_factor_out=k.tile_ci * wl.kh * wl.kw if co_in_loop else 0,
                        deps=Deps(pop_prev=True, push_prev=step < n_steps - g.threads),
                    )
                )
                step += 1
        for r, (co, h, w) in enumerate(wave):
            acc0, u = r * g.acc_entries, r * per_thread
            ops = _epilogue(wl, k, g, epi, base, co, h, w, acc0, u, out_n)
            ops[-1] = _flag(ops[-1], push_next=True)
            stream += ops
            stores = [
                MemInsn(
                    Opcode.STORE,
                    Mem.OUT,
                    acc0 + c * k.tile_h * k.tile_w,
                    base["output"] + ((co * k.tile_co + c) * g.oh + h * k.tile_h) * g.ow + w * k.tile_w,
                    k.tile_h,
                    k.tile_w,
                    g.ow,
                )
                for c in range(k.tile_co)
            ]
            stores[0] = _flag(stores[0], pop_prev=True)
            # free the copy for the tile `threads` later; the last tile's token goes to FINISH
            stores[-1] = _flag(stores[-1], push_prev=tile < n_tiles - g.threads or tile == n_tiles - 1)
            stream += stores
            tile += 1
    stream.append(FinishInsn(deps=Deps(pop_next=True)))
    buffers = {name: (addr[name], shape, dt) for name, (shape, dt) in shapes.items()}
    return Program(wl, epi, k, stream, uops, buffers)


# each thread's micro-ops: the reset and the epilogue's (one each), then the GEMM's
RESET_UOP, BIAS_UOP, RESIDUAL_UOP, RESIDUAL_SHIFT_UOP, GEMM_UOP = 0, 1, 2, 3, 4


def _thread_uops(wl: ConvWorkload, k: Knobs, g: _Geometry, epi: Epilogue, r: int) -> np.ndarray:
    """(dst, src, wgt) of thread r's micro-ops, absolute SRAM indices of its copies. The GEMM's run
    over (ci, kh, kw, column), columns innermost, taking in the rows and then the channel blocks
    (`gemm_fold`) where a row is too narrow to keep consecutive writes DST_APART apart."""
    acc0, inp0, wgt0 = r * g.acc_entries, r * g.inp_entries, r * g.wgt_entries
    out_n = k.tile_co * k.tile_h * k.tile_w
    bias0 = acc0 + out_n
    res0 = bias0 + (k.tile_co if epi.bias else 0)
    head = [(acc0, acc0, 0), (acc0, bias0, 0), (acc0, res0, 0), (res0, res0, 0)]
    fold = gemm_fold(k)
    ci, dy, dx, co, y, x = np.meshgrid(
        np.arange(k.tile_ci),
        np.arange(wl.kh),
        np.arange(wl.kw),
        np.arange(k.tile_co if fold >= 2 else 1),
        np.arange(k.tile_h if fold >= 1 else 1),
        np.arange(k.tile_w),
        indexing="ij",
    )
    dst = acc0 + (co * k.tile_h + y) * k.tile_w + x
    src = inp0 + ci * g.ih * g.iw + (y * wl.stride_h + dy) * g.iw + x * wl.stride_w + dx
    wgt = wgt0 + co * k.tile_ci * wl.kh * wl.kw + (ci * wl.kh + dy) * wl.kw + dx
    gemm = np.stack([dst, src, wgt], axis=-1).reshape(-1, 3)
    return np.concatenate([np.array(head, dtype=np.int64), gemm])


def _waves(g: _Geometry, k: Knobs) -> list[list[tuple[int, int, int]]]:
    """The output tiles (co, h, w) in groups of one per virtual thread, as VTA's schedule splits
    them: threads over output channel tiles (oc_nthread) and row tiles (h_nthread)."""
    co_t, h_t, w_t = g.cob // k.tile_co, g.oh // k.tile_h, g.ow // k.tile_w
    return [
        [(co * k.oc_nthread + a, h * k.h_nthread + c, w) for a in range(k.oc_nthread) for c in range(k.h_nthread)]
        for co in range(co_t // k.oc_nthread)
        for h in range(h_t // k.h_nthread)
        for w in range(w_t)
    ]


def _flag(insn: Insn, **flags: bool) -> Insn:
    return replace(insn, deps=replace(insn.deps, **{f: getattr(insn.deps, f) or v for f, v in flags.items()}))


def _input_loads(wl: ConvWorkload, k: Knobs, g: _Geometry, data: int, h: int, w: int, j: int, inp0: int) -> list[Insn]:
    """One 2-D LOAD per input channel block of reduction step j: the window of rows and columns
    the output tile (h, w) reads, zero-padded where it falls outside the image."""
    r0, c0 = h * k.tile_h * wl.stride_h - wl.pad_h, w * k.tile_w * wl.stride_w - wl.pad_w
    r_lo, r_hi = max(r0, 0), min(r0 + g.ih, wl.height)
    c_lo, c_hi = max(c0, 0), min(c0 + g.iw, wl.width)
    out: list[Insn] = []
    for c in range(k.tile_ci):
        ci = j * k.tile_ci + c
        out.append(
            MemInsn(
                Opcode.LOAD,
                Mem.INP,
                inp0 + c * g.ih * g.iw,
                data + (ci * wl.height + r_lo) * wl.width + c_lo,
                r_hi - r_lo,
                c_hi - c_lo,
                wl.width,
                y_pad_0=r_lo - r0,
                y_pad_1=r0 + g.ih - r_hi,
                x_pad_0=c_lo - c0,
                x_pad_1=c0 + g.iw - c_hi,
            )
        )
    return out


def _epilogue(
    wl: ConvWorkload,
    k: Knobs,
    g: _Geometry,
    epi: Epilogue,
    base: dict[str, int],
    co: int,
    h: int,
    w: int,
    acc0: int,
    u: int,
    out_n: int,
) -> list[Insn]:
    """The tile's epilogue on the compute module: bias and residual loaded into the thread's
    accumulator copy, then ALU ops over the tile (one micro-op each, two loops)."""
    ops: list[Insn] = []
    tile_hw = k.tile_h * k.tile_w

    def over_tile(op: AluOp, uop: int, imm: int | None = None, src_in: int = 1, n: int = out_n) -> AluInsn:
        return AluInsn(
            op, u + uop, u + uop + 1, 1, n, dst_factor_in=1, src_factor_in=src_in, use_imm=imm is not None, imm=imm or 0
        )

    if epi.bias:
        bias0 = acc0 + out_n
        ops.append(MemInsn(Opcode.LOAD, Mem.ACC, bias0, base["bias"] + co * k.tile_co, 1, k.tile_co, k.tile_co))
        ops.append(
            AluInsn(
                AluOp.ADD,
                u + BIAS_UOP,
                u + BIAS_UOP + 1,
                k.tile_co,
                tile_hw,
                dst_factor_out=tile_hw,
                dst_factor_in=1,
                src_factor_out=1,
                src_factor_in=0,
            )
        )
    if epi.residual_shift is not None:
        res0 = acc0 + out_n + (k.tile_co if epi.bias else 0)
        for c in range(k.tile_co):
            ops.append(
                MemInsn(
                    Opcode.LOAD,
                    Mem.ACC_8BIT,
                    res0 + c * tile_hw,
                    base["residual"] + ((co * k.tile_co + c) * g.oh + h * k.tile_h) * g.ow + w * k.tile_w,
                    k.tile_h,
                    k.tile_w,
                    g.ow,
                )
            )
        if epi.residual_shift:
            ops.append(
                AluInsn(
                    AluOp.SHR,
                    u + RESIDUAL_SHIFT_UOP,
                    u + RESIDUAL_SHIFT_UOP + 1,
                    1,
                    out_n,
                    dst_factor_in=1,
                    src_factor_in=1,
                    use_imm=True,
                    imm=-epi.residual_shift,
                )
            )
        ops.append(over_tile(AluOp.ADD, RESIDUAL_UOP))
    if epi.round_add:
        ops.append(over_tile(AluOp.ADD, RESET_UOP, epi.round_add))
    if epi.shift:
        ops.append(over_tile(AluOp.SHR, RESET_UOP, epi.shift))
    if epi.post_round_add:
        ops.append(over_tile(AluOp.ADD, RESET_UOP, epi.post_round_add))
    if epi.post_shift:
        ops.append(over_tile(AluOp.SHR, RESET_UOP, epi.post_shift))
    ops.append(over_tile(AluOp.MIN, RESET_UOP, epi.clip_max))
    ops.append(over_tile(AluOp.MAX, RESET_UOP, epi.clip_min))
    return ops


# ---- running it -----------------------------------------------------------------------------------
def reference(
    wl: ConvWorkload,
    epi: Epilogue,
    data: np.ndarray,
    kernel: np.ndarray,
    bias: np.ndarray | None = None,
    residual: np.ndarray | None = None,
) -> np.ndarray:
    """The packed conv and its epilogue in numpy integers (int64): what VTA must produce."""
    n, cib, hh, ww, bb, bi = data.shape
    x = data.transpose(0, 4, 1, 5, 2, 3).reshape(n * bb, cib * bi, hh, ww).astype(np.int64)
    cob, _, kh, kw, bo, _ = kernel.shape
    wt = kernel.transpose(0, 4, 1, 5, 2, 3).reshape(cob * bo, cib * bi, kh, kw).astype(np.int64)
    xp = np.pad(x, ((0, 0), (0, 0), (wl.pad_h, wl.pad_h), (wl.pad_w, wl.pad_w)))
    oh, ow = wl.out_height, wl.out_width
    acc = np.zeros((n * bb, cob * bo, oh, ow), np.float64)  # exact: |sums| < 2^53
    xf, wf = xp.astype(np.float64), wt.astype(np.float64)
    for dy in range(kh):
        for dx in range(kw):
            win = xf[
                :,
                :,
                dy : dy + (oh - 1) * wl.stride_h + 1 : wl.stride_h,
                dx : dx + (ow - 1) * wl.stride_w + 1 : wl.stride_w,
            ]
            acc += np.tensordot(wf[:, :, dy, dx], win, axes=([1], [1])).transpose(1, 0, 2, 3)
    acc = acc.astype(np.int64)
    acc = acc.reshape(n, bb, cob, bo, oh, ow).transpose(0, 2, 4, 5, 1, 3)  # packed
    acc = ((acc + (1 << 31)) % (1 << 32)) - (1 << 31)  # int32 accumulators wrap
    if epi.bias:
        acc = acc + bias.astype(np.int64)
    if epi.residual_shift is not None:
        res = residual.astype(np.int64)
        acc = acc + (res << epi.residual_shift if epi.residual_shift >= 0 else res >> -epi.residual_shift)
    acc = (acc + epi.round_add) >> epi.shift
    acc = (acc + epi.post_round_add) >> epi.post_shift
    return np.clip(acc, epi.clip_min, epi.clip_max).astype(np.int8)


def run_conv(prog: Program, dram: Dram, sim: Simulator, tensors: dict[str, np.ndarray]) -> tuple[np.ndarray, Stats]:
    """Write the tensors (data, kernel, bias, residual) where the program expects them, run it,
    read the output back."""
    for name, (address, shape, dtype) in prog.buffers.items():
        if name == "output":
            continue
        value = np.ascontiguousarray(tensors[name], dtype=dtype)
        if value.shape != shape:
            raise ValueError(f"{name}: shape {value.shape}, the program expects {shape}")
        raw = value.view(np.uint8).ravel()
        dram.data[address : address + raw.size] = raw
    stats = sim.run(prog.instructions, dram)
    address, shape, dtype = prog.buffers["output"]
    return dram.get(address, dtype, shape), stats


def describe(stats: Stats, wl: ConvWorkload, cfg: VTAConfig, model: Any) -> dict[str, Any]:
    """Simulated latency at the board's clock and the GOPS against VTA's peak."""
    seconds = stats.cycles / model.clock_hz
    peak = cfg.BATCH * cfg.BLOCK_IN * cfg.BLOCK_OUT * 2 * model.clock_hz
    return {
        "cycles": stats.cycles,
        "ms": seconds * 1e3,
        "gops": wl.ops() / seconds / 1e9,
        "peak_gops": peak / 1e9,
        "of_peak": wl.ops() / seconds / peak,
    }
