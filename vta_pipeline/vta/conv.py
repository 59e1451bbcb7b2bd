"""Packed conv2d, with its fused epilogue, compiled to VTA instruction streams by the recipe's knobs.

The workload is VTA's `conv2d_packed` (data `NCHW1n16c` int8, kernel `OIHW16o16i` int8,
int32 accumulators; grouped as its `group_conv2d_packed`, depthwise as GEMMs against diagonal
weight tiles) followed by what our quantize pass fuses after it: a per-channel bias
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
    compute:  the epilogue as ALU ops on the tile (the bias: a LOAD of ACC)
      load:     the residual tile, int8, into the thread's input copy (one LOAD INP per block)
      compute:  a GEMM of it against an identity weight tile adds it to the accumulators: the
                hardware has no int8 load into the accumulators (fsim's ACC_8BIT)
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
from .simulator import STRICT, Dram, Simulator, Stats


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
    groups: int = 1  # as TVM counts them: in_filter / groups input channels per group

    @property
    def out_height(self) -> int:
        return (self.height + 2 * self.pad_h - self.kh) // self.stride_h + 1

    @property
    def out_width(self) -> int:
        return (self.width + 2 * self.pad_w - self.kw) // self.stride_w + 1

    def ops(self) -> int:
        """Multiply-adds x 2 (the conv's own: a depthwise conv's GEMMs do BLOCK_IN times more)."""
        return (
            2 * self.batch * self.out_filter * self.out_height * self.out_width
            * (self.in_filter // self.groups) * self.kh * self.kw
        )  # fmt: skip

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.in_filter == self.out_filter

    def block_groups(self, block: int) -> int:
        """The groups of channel blocks VTA's GEMM runs apart: a grouped conv's groups where each
        holds whole blocks (VTA's `group_conv2d_packed`), a depthwise conv's output blocks, each a
        GEMM against a diagonal weight tile (`depthwise_weights`); 0 where neither fits."""
        if self.groups == 1:
            return 1
        if self.depthwise and self.in_filter % block == 0:
            return self.in_filter // block
        if (self.in_filter // self.groups) % block == 0 and (self.out_filter // self.groups) % block == 0:
            return self.groups
        return 0


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
    cib_g: int  # of a block group (`ConvWorkload.block_groups`): the reduction's extent
    cob_g: int
    oh: int
    ow: int
    ih: int  # input rows of an output tile
    iw: int
    inp_entries: int  # of one input copy (which also takes the residual tile)
    wgt_entries: int
    acc_entries: int  # of one accumulator copy (output, residual, bias)
    threads: int
    plan: tuple[str, int] | None  # `residual_plan`

    @property
    def residual(self) -> bool:
        return self.plan is not None

    @property
    def res_region(self) -> bool:
        """The residual has accumulators of its own (`residual_plan`: "region")."""
        return self.plan is not None and self.plan[0] == "region"


def _blocks(wl: ConvWorkload, cfg: VTAConfig) -> tuple[int, int, int, int]:
    """Input and output channel blocks, then those of one block group (`ConvWorkload.block_groups`;
    1 group where none fits: `check` refuses such a conv)."""
    cib, cob = wl.in_filter // cfg.BLOCK_IN, wl.out_filter // cfg.BLOCK_OUT
    groups = wl.block_groups(cfg.BLOCK_IN) or 1
    return cib, cob, cib // groups, cob // groups


def _geometry(wl: ConvWorkload, k: Knobs, epi: Epilogue, cfg: VTAConfig) -> _Geometry:
    cib, cob, cib_g, cob_g = _blocks(wl, cfg)
    ih = (k.tile_h - 1) * wl.stride_h + wl.kh
    iw = (k.tile_w - 1) * wl.stride_w + wl.kw
    out_entries = k.tile_co * k.tile_h * k.tile_w
    plan = residual_plan(epi)
    region = plan is not None and plan[0] == "region"
    acc = out_entries + (k.tile_co if epi.bias else 0) + (out_entries if region else 0)
    # the residual tile comes in whole, after the reduction's last step has used the input copy:
    # the load -> compute handshake's tokens pair a thread's loads with its GEMMs by position
    inp = max(k.tile_ci * ih * iw, out_entries if plan else 0)
    return _Geometry(
        cib,
        cob,
        cib_g,
        cob_g,
        wl.out_height,
        wl.out_width,
        ih,
        iw,
        inp,
        k.tile_co * k.tile_ci * wl.kh * wl.kw,
        acc,
        k.h_nthread * k.oc_nthread,
        plan,
    )


WGT_SCALE_MAX = 6  # the largest power of two an int8 weight holds (2^7 does not)


def residual_plan(epi: Epilogue) -> tuple[str, int] | None:
    """Where the residual (int8) joins the accumulators, and the power of two its identity
    weight tile carries. The hardware loads int8 only into the input and weight buffers, so the
    residual comes in as an input and a GEMM against `2^scale x I` adds it:
      ("after", d): after the requantize's shift, as res x 2^d, where residual_shift = shift + d.
          Exact: (acc + res x 2^shift + round) >> shift == ((acc + round) >> shift) + res, a
          multiple of 2^shift passing a floor shift whole; the recipe's case (d = 0).
      ("before", s): before it, as res x 2^s (0 <= s <= WGT_SCALE_MAX).
      ("region", 0): into accumulators of its own, shifted there by the ALU (-s: a right
          shift), then added: any other shift the ALU's immediate holds.
    None: no residual."""
    s = epi.residual_shift
    if s is None:
        return None
    if 0 <= s - epi.shift <= WGT_SCALE_MAX:
        return ("after", s - epi.shift)
    if 0 <= s <= WGT_SCALE_MAX:
        return ("before", s)
    return ("region", 0)


def check(wl: ConvWorkload, k: Knobs, epi: Epilogue, cfg: VTAConfig) -> _Geometry:
    """The config's geometry, or a KnobError that names what does not fit."""
    if wl.batch != cfg.BATCH:
        raise KnobError(f"batch {wl.batch}: this VTA config computes batch {cfg.BATCH}")
    if wl.in_filter % cfg.BLOCK_IN or wl.out_filter % cfg.BLOCK_OUT:
        raise KnobError(
            f"channels {wl.in_filter} -> {wl.out_filter} are not multiples of the block "
            f"{cfg.BLOCK_IN}: graph pack keeps such convs on the CPU"
        )
    if not wl.block_groups(cfg.BLOCK_IN):
        raise KnobError(
            f"groups={wl.groups} over {wl.in_filter} -> {wl.out_filter} channels: VTA runs grouped convs whose "
            f"groups hold whole blocks of {cfg.BLOCK_IN} channels, and depthwise convs"
        )
    g = _geometry(wl, k, epi, cfg)
    splits = {
        "tile_h": (k.tile_h * k.h_nthread, g.oh),
        "tile_w": (k.tile_w, g.ow),
        "tile_ci": (k.tile_ci, g.cib_g),
        "tile_co": (k.tile_co, g.cob_g),  # a tile stays within its group
        "tile_co x oc_nthread": (k.tile_co * k.oc_nthread, g.cob),
    }
    for name, (size, extent) in splits.items():
        if extent % size:
            raise KnobError(f"{name}: {size} (with its threads) does not divide the extent {extent}")
    if k.h_nthread not in (1, 2) or k.oc_nthread not in (1, 2):
        raise KnobError("h_nthread and oc_nthread are 1 or 2 (VTA's virtual threads)")
    if max(wl.pad_h, wl.pad_w) > 15:
        raise KnobError(f"padding {wl.pad_h}x{wl.pad_w}: a LOAD pads at most 15 per side")
    shifts = {"shift": epi.shift, "post_shift": epi.post_shift}
    if g.res_region and epi.residual_shift:
        shifts["residual_shift"] = -epi.residual_shift  # its ALU shift: a negative one shifts left
    for name, value in shifts.items():
        lo, hi = STRICT.shr_imm
        if not lo <= value <= hi:
            raise KnobError(f"{name} {value}: the ALU's shift immediate holds [{lo}, {hi}]")
    lay = Layout.of(cfg)
    need = {
        "input": (g.inp_entries * g.threads, 1 << lay.inp_depth_log),
        # + the residual's identity tile, shared by the threads
        "weight": (g.wgt_entries * g.threads + g.residual, 1 << lay.wgt_depth_log),
        "accumulator": (g.acc_entries * g.threads, 1 << lay.acc_depth_log),
    }
    for name, (entries, depth) in need.items():
        if entries > depth:
            raise KnobError(
                f"the {name} tiles need {entries} entries ({g.threads} thread(s)), more than the "
                f"{name} buffer's {depth}"
            )
    out_n = k.tile_co * k.tile_h * k.tile_w
    if out_n < DST_APART:
        raise KnobError(
            f"a tile of {out_n} accumulator(s): the pipelined GEMM needs {DST_APART} to write in turn "
            "(VerifyDep: no micro-op writes an accumulator either of the two before it wrote)"
        )
    uops = g.threads * (gemm_uops(wl, k) + GEMM_UOP)
    depth = min(1 << lay.uop_depth_log, STRICT.uop_depth)
    if uops > depth:
        raise KnobError(
            f"{uops} micro-ops, more than the {depth} the micro-op memory holds (the buffer's "
            f"{1 << lay.uop_depth_log}, the Chisel design's {STRICT.uop_depth})"
        )
    return g


def beyond_the_recipe(wl: ConvWorkload, epi: Epilogue) -> list[str]:
    """What of this conv's stream VTA's own TVM lowering (the recipe's `conv2d_packed` /
    `group_conv2d_packed` schedules, TVM 0.18) could not have produced, one phrase each; empty
    where the recipe's template, with the same knobs, computes the same thing. Documentation,
    not a constraint: the stream's instruction order and micro-op layout are ours in any case."""
    out = []
    if wl.depthwise:
        out.append("a depthwise conv (VTA's TOPI has none): GEMMs against diagonal weight tiles")
    if epi.residual_shift is not None:
        out.append(
            "the residual through an identity GEMM (VTA's lowering loads it with ACC_8BIT, which the hardware lacks)"
        )
    return out


def knob_space(wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue = Epilogue()) -> list[Knobs]:
    """Every config of the recipe's knobs (exact divisors) that fits VTA's buffers."""
    _, cob, cib_g, cob_g = _blocks(wl, cfg)
    out = []
    for hn, on in itertools.product((1, 2), (1, 2)):
        if wl.out_height % hn or cob % on:
            continue
        for th, tw, tci, tco in itertools.product(
            _divisors(wl.out_height // hn), _divisors(wl.out_width), _divisors(cib_g), _divisors(cob_g)
        ):
            k = Knobs(1, th, tw, tci, tco, hn, on)
            try:
                check(wl, k, epi, cfg)
            except KnobError:
                continue
            out.append(k)
    return out


def default_knobs(wl: ConvWorkload, cfg: VTAConfig, epi: Epilogue = Epilogue()) -> Knobs:
    """The untuned config: the smallest tile VTA's GEMM can run, one thread. AutoTVM's fallback
    for the recipe's template (every split's inner factor 1: one accumulator per tile) breaks
    VerifyDep, so the tile grows to DST_APART accumulators: along its columns where a row is that
    wide (the fewest micro-ops), else its rows, else its output channel blocks."""
    cob_g = _blocks(wl, cfg)[3]
    candidates = [
        Knobs(tile_h=th, tile_w=tw, tile_co=tco)
        for th, tw, tco in itertools.product(_divisors(wl.out_height), _divisors(wl.out_width), _divisors(cob_g))
        if th * tw * tco >= DST_APART
    ]
    candidates.sort(key=lambda k: (k.tile_co * k.tile_h * k.tile_w, gemm_fold(k), k.tile_co, k.tile_h))
    problem = None
    for k in candidates:
        try:
            check(wl, k, epi, cfg)
            return k
        except KnobError as e:
            problem = problem or e
    if problem is None:  # no tile of DST_APART accumulators at all: check says why
        check(wl, Knobs(), epi, cfg)
    raise problem


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
        "kernel": ((g.cob, g.cib_g, wl.kh, wl.kw, bo, bi), "int8"),
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
    ident = g.threads * g.wgt_entries if g.residual else 0  # the residual's identity weight tile
    uops = np.concatenate([_thread_uops(wl, k, g, epi, r, ident) for r in range(g.threads)])
    uaddr = dram.put(isa.encode_uops(uops[:, 0], uops[:, 1], uops[:, 2], lay))

    waves = _waves(g, k)
    steps = g.cib_g // k.tile_ci
    n_tiles, n_steps = len(waves) * g.threads, len(waves) * g.threads * (steps + g.residual)
    # In program order, as VTA's fetch module dispatches it into the three modules' command
    # queues: every instruction after those whose tokens it waits for, so that no queue ever
    # has to hold more than a step's run-ahead (`simulator.HardwareRules.cmd_queue_depth`).
    stream: list[Insn] = [MemInsn(Opcode.LOAD, Mem.UOP, 0, uaddr // 4, 1, len(uops), len(uops))]
    if g.plan:  # 2^scale x I, loaded once: the load module runs it before any step's loads
        eye = (np.eye(cfg.BLOCK_OUT, cfg.BLOCK_IN) * (1 << g.plan[1])).astype(np.int8)
        stream.append(MemInsn(Opcode.LOAD, Mem.WGT, ident, dram.put(eye) // eye.size, 1, 1, 1))
    tile = step = 0

    def handshake(loads: list[Insn], gemm: GemmInsn) -> list[Insn]:
        """One step of the load -> compute handshake: tokens pair loads and GEMMs by position,
        so a step's loads wait for the GEMM `threads` steps back (that copy's last reader) and
        its GEMM frees the copy for the step `threads` later, where there is one."""
        nonlocal step
        loads[0] = _flag(loads[0], pop_next=step >= g.threads)
        loads[-1] = _flag(loads[-1], push_next=True)
        gemm = _flag(gemm, pop_prev=True, push_prev=step < n_steps - g.threads)
        step += 1
        return [*loads, gemm]

    for wave in waves:
        for r, _ in enumerate(wave):  # reset each thread's accumulators, once its previous tile is stored
            u = r * per_thread
            stream.append(
                GemmInsn(
                    u + RESET_UOP,
                    u + RESET_UOP + 1,
                    1,
                    out_n * (2 if g.res_region else 1),  # the residual's own accumulators follow
                    dst_factor_in=1,
                    reset=True,
                    deps=Deps(pop_next=tile + r >= g.threads),
                )
            )
        for j in range(steps):
            for r, (co, h, w) in enumerate(wave):
                inp0, wgt0, u = r * g.inp_entries, r * g.wgt_entries, r * per_thread
                ci0 = co * k.tile_co // g.cob_g * g.cib_g + j * k.tile_ci  # the tile's group's blocks
                loads = _input_loads(wl, k, g, base["data"], h, w, ci0, inp0) + [
                    MemInsn(
                        Opcode.LOAD,
                        Mem.WGT,
                        wgt0,
                        base["kernel"] + (co * k.tile_co * g.cib_g + j * k.tile_ci) * wl.kh * wl.kw,
                        k.tile_co,
                        k.tile_ci * wl.kh * wl.kw,
                        g.cib_g * wl.kh * wl.kw,
                    )
                ]
                rows_in_loop, co_in_loop = fold < 1, fold < 2  # the loops the micro-ops did not take in
                stream += handshake(
                    loads,
                    GemmInsn(
                        u + GEMM_UOP,
                        u + per_thread,
                        k.tile_co if co_in_loop else 1,
                        k.tile_h if rows_in_loop else 1,
                        dst_factor_out=k.tile_h * k.tile_w if co_in_loop else 0,
                        dst_factor_in=k.tile_w if rows_in_loop else 0,
                        src_factor_in=wl.stride_h * g.iw if rows_in_loop else 0,
                        wgt_factor_out=k.tile_ci * wl.kh * wl.kw if co_in_loop else 0,
                    ),
                )
        for r, (co, h, w) in enumerate(wave):
            acc0, u = r * g.acc_entries, r * per_thread
            residual: list[Insn] = []
            if g.residual:  # a step of the load -> compute handshake of its own
                residual = handshake(
                    _residual_loads(k, g, base["residual"], co, h, w, r * g.inp_entries),
                    GemmInsn(
                        u + RESIDUAL_GEMM_UOP,
                        u + RESIDUAL_GEMM_UOP + 1,
                        k.tile_co,
                        k.tile_h * k.tile_w,
                        dst_factor_out=k.tile_h * k.tile_w,
                        dst_factor_in=1,
                        src_factor_out=k.tile_h * k.tile_w,
                        src_factor_in=1,
                    ),
                )
            ops = _epilogue(k, g, epi, base, co, acc0, u, out_n, residual)
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
RESET_UOP, BIAS_UOP, RESIDUAL_UOP, RESIDUAL_SHIFT_UOP, RESIDUAL_GEMM_UOP, GEMM_UOP = range(6)


def _thread_uops(wl: ConvWorkload, k: Knobs, g: _Geometry, epi: Epilogue, r: int, ident: int) -> np.ndarray:
    """(dst, src, wgt) of thread r's micro-ops, absolute SRAM indices of its copies. The GEMM's run
    over (ci, kh, kw, column), columns innermost, taking in the rows and then the channel blocks
    (`gemm_fold`) where a row is too narrow to keep consecutive writes DST_APART apart."""
    acc0, inp0, wgt0 = r * g.acc_entries, r * g.inp_entries, r * g.wgt_entries
    out_n = k.tile_co * k.tile_h * k.tile_w
    res0 = acc0 + out_n
    bias0 = res0 + (out_n if g.res_region else 0)
    head = [
        (acc0, acc0, 0),
        (acc0, bias0, 0),
        (acc0, res0, 0),
        (res0, res0, 0),
        (res0 if g.res_region else acc0, inp0, ident),
    ]
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


def _input_loads(
    wl: ConvWorkload, k: Knobs, g: _Geometry, data: int, h: int, w: int, ci0: int, inp0: int
) -> list[Insn]:
    """One 2-D LOAD per input channel block of a reduction step (from block ci0): the window of
    rows and columns the output tile (h, w) reads, zero-padded where it falls outside the image."""
    r0, c0 = h * k.tile_h * wl.stride_h - wl.pad_h, w * k.tile_w * wl.stride_w - wl.pad_w
    r_lo, r_hi = max(r0, 0), min(r0 + g.ih, wl.height)
    c_lo, c_hi = max(c0, 0), min(c0 + g.iw, wl.width)
    out: list[Insn] = []
    for c in range(k.tile_ci):
        ci = ci0 + c
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


def _residual_loads(k: Knobs, g: _Geometry, residual: int, co: int, h: int, w: int, inp0: int) -> list[Insn]:
    """The residual of tile (co, h, w): one 2-D LOAD INP per output channel block, each block's
    rows and columns packed one after another into the thread's input copy."""
    tile_hw = k.tile_h * k.tile_w
    return [
        MemInsn(
            Opcode.LOAD,
            Mem.INP,
            inp0 + c * tile_hw,
            residual + ((co * k.tile_co + c) * g.oh + h * k.tile_h) * g.ow + w * k.tile_w,
            k.tile_h,
            k.tile_w,
            g.ow,
        )
        for c in range(k.tile_co)
    ]


def _epilogue(
    k: Knobs,
    g: _Geometry,
    epi: Epilogue,
    base: dict[str, int],
    co: int,
    acc0: int,
    u: int,
    out_n: int,
    residual: list[Insn],
) -> list[Insn]:
    """The tile's epilogue: the bias loaded into the thread's accumulator copy and added, the
    residual's loads and GEMMs (`residual`) where `residual_plan` puts them, then ALU ops over
    the tile (one micro-op each, two loops)."""
    ops: list[Insn] = []
    tile_hw = k.tile_h * k.tile_w
    plan = g.plan

    def over_tile(op: AluOp, uop: int, imm: int | None = None) -> AluInsn:
        return AluInsn(
            op, u + uop, u + uop + 1, 1, out_n, dst_factor_in=1, src_factor_in=1, use_imm=imm is not None, imm=imm or 0
        )

    if epi.bias:
        bias0 = acc0 + out_n * (2 if g.res_region else 1)
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
    if plan and plan[0] == "before":
        ops += residual
    if plan and plan[0] == "region":
        ops += residual
        if epi.residual_shift:
            ops.append(over_tile(AluOp.SHR, RESIDUAL_SHIFT_UOP, -epi.residual_shift))
        ops.append(over_tile(AluOp.ADD, RESIDUAL_UOP))
    if epi.round_add:
        ops.append(over_tile(AluOp.ADD, RESET_UOP, epi.round_add))
    if epi.shift:
        ops.append(over_tile(AluOp.SHR, RESET_UOP, epi.shift))
    if plan and plan[0] == "after":
        ops += residual
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
    """The packed conv and its epilogue in numpy integers (int64): what VTA must produce. A
    grouped conv's kernel holds its group's input blocks (`(cob, cib / groups, kh, kw, bo, bi)`,
    a depthwise conv's the diagonal tiles of `depthwise_weights`)."""
    n, cib, hh, ww, bb, bi = data.shape
    x = data.transpose(0, 4, 1, 5, 2, 3).reshape(n * bb, cib * bi, hh, ww).astype(np.int64)
    cob, cib_g, kh, kw, bo, _ = kernel.shape
    groups = cib // cib_g
    wt = kernel.transpose(0, 4, 1, 5, 2, 3).reshape(cob * bo, cib_g * bi, kh, kw).astype(np.int64)
    xp = np.pad(x, ((0, 0), (0, 0), (wl.pad_h, wl.pad_h), (wl.pad_w, wl.pad_w)))
    oh, ow = wl.out_height, wl.out_width
    acc = np.zeros((n * bb, cob * bo, oh, ow), np.float64)  # exact: |sums| < 2^53
    xf, wf = xp.astype(np.float64), wt.astype(np.float64)
    ci, co = cib_g * bi, cob * bo // groups  # a group's channels
    for dy in range(kh):
        for dx in range(kw):
            win = xf[
                :,
                :,
                dy : dy + (oh - 1) * wl.stride_h + 1 : wl.stride_h,
                dx : dx + (ow - 1) * wl.stride_w + 1 : wl.stride_w,
            ]
            for grp in range(groups):
                acc[:, grp * co : (grp + 1) * co] += np.tensordot(
                    wf[grp * co : (grp + 1) * co, :, dy, dx], win[:, grp * ci : (grp + 1) * ci], axes=([1], [1])
                ).transpose(1, 0, 2, 3)
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


def depthwise_weights(kernel: np.ndarray) -> np.ndarray:
    """A packed depthwise kernel (`OIHW{bo}o`: cob x 1 x kh x kw x bo) as the GEMM's weight tiles:
    one bo x bo diagonal tile per output block and tap, each channel's weight on the diagonal
    (VTA's GEMM has no per-channel product; the other BLOCK_IN - 1 products of a row are zeros)."""
    cob, _, kh, kw, bo = kernel.shape
    out = np.zeros((cob, 1, kh, kw, bo, bo), kernel.dtype)
    idx = np.arange(bo)
    out[..., idx, idx] = kernel
    return out


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
