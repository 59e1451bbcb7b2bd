"""A simulator of VTA: an instruction stream executed as VTA's modules execute it, bit-exact,
timed by a cycle model of its decoupled access-execute pipeline.

Function (what VTA's functional simulator `sim_driver.cc` does; our notes:
`docs/research/vta-hardware-notes.md` section 4):
- four SRAMs sized by the `VTAConfig`: micro-ops, inputs (BATCH x BLOCK_IN int8), weights
  (BLOCK_OUT x BLOCK_IN int8), accumulators (BATCH x BLOCK_OUT int32); DRAM is `Dram`, a byte
  array whose buffers the instructions address in elements of their type;
- LOAD writes a dense block of (y_pad_0 + y_size + y_pad_1) x (x_pad_0 + x_size + x_pad_1)
  elements from `sram_base`, the pads zero; ACC_8BIT sign-extends int8 into the accumulators;
- GEMM and ALU run two loops over a range of micro-ops; GEMM accumulates int8 x int8 in int32
  (wrapping), ALU applies MIN, MAX, ADD, SHR (a negative amount shifts left) or MUL with an
  accumulator or a sign-extended immediate;
- STORE narrows the accumulators to the output width by truncation (no saturation: streams
  clamp with MIN/MAX first);
- the three modules (load: input and weight loads; compute: GEMM, ALU, FINISH, micro-op and
  accumulator loads; store) hand each other tokens through four queues, load->compute,
  compute->load, compute->store, store->compute, set by each instruction's dependency flags.

What VTA's simulator leaves silent is an error here, naming the instruction: a stream that
deadlocks (VTA's spins forever), a read of an SRAM entry that nothing wrote, an index past a
buffer, a stream without FINISH, instructions or tokens left over after it.

Time: the modules run concurrently. An instruction starts when its module is free, the tokens
it pops have been pushed, and (a LOAD or STORE) the DRAM port is free; the next instruction to
run is always the one that can start earliest, so the functional order is the timed order.
Each cost is a `CycleModel` constant with its source. Everything is vectorized per
instruction (numpy over its micro-op iterations), not per element.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UserError
from .config import VTAConfig
from .isa import (
    AluInsn,
    AluOp,
    Core,
    FinishInsn,
    GemmInsn,
    Insn,
    Layout,
    Mem,
    MemInsn,
    Opcode,
    core_of,
    decode_stream,
    decode_uops,
)


class StreamError(UserError):
    """An instruction stream VTA cannot run as written; the message names the instruction."""


class DeadlockError(StreamError):
    """No module can run its next instruction: each waits for a token nobody will push."""


class HardwareRuleError(StreamError):
    """A stream VTA's functional simulator runs but a VTA bitstream would not (`HardwareRules`)."""


@dataclass(frozen=True)
class HardwareRules:
    """What a VTA bitstream enforces that VTA's functional simulator (fsim) lets pass, each rule
    with the design it comes from (`docs/research/vta-hardware-notes.md`; docs/vta-target.md
    says which rules our streams keep). A stream that keeps them runs on both the HLS design
    (Pynq, Ultra96) and the Chisel one (DE10-Nano), as far as these rules go.

    cmd_queue_depth: 512. The fetch module reads the stream in program order and dispatches
        each instruction into its module's command FIFO (load, compute, store), blocking while
        that FIFO is full (HLS `vta.cc` fetch; Chisel `Fetch`'s instruction queues). fsim
        splits the whole stream into the three queues up front; on the hardware a stream that
        needs more run-ahead than a FIFO holds deadlocks.
    loads: UOP, INP, WGT, ACC. The HLS `load()`/`compute()` and the Chisel `FetchDecode` have no
        ACC_8BIT load (fsim and the runtime have it): on a board it would not add what fsim adds.
    uop_depth: 2048 micro-ops, the Chisel design's micro-op memory (the HLS design's holds the
        config's UOP_BUFF_SIZE / 4: 8192 on the Pynq).
    shr_imm: [-16, 15]. The HLS ALU's shift takes the immediate's low 5 bits as a signed shift.
    gemm_dst_apart: 3. A GEMM micro-op must not write an accumulator that either of the two
        micro-ops before it wrote: the HLS GEMM loop is pipelined with `DEPENDENCE acc_mem inter
        false`, and VTA's runtime refuses such micro-op kernels (`runtime.cc` VerifyDep). Checked
        on the micro-ops in the order they execute (iter_out, iter_in, uop).
    """

    cmd_queue_depth: int = 512
    loads: frozenset = frozenset({Mem.UOP, Mem.INP, Mem.WGT, Mem.ACC})
    uop_depth: int = 2048
    shr_imm: tuple[int, int] = (-16, 15)
    gemm_dst_apart: int = 3


STRICT = HardwareRules()
FSIM = None  # no rules beyond fsim's own (`--sim-mode fsim`)
SIM_MODES: dict[str, HardwareRules | None] = {"strict": STRICT, "fsim": FSIM}


@dataclass(frozen=True)
class CycleModel:
    """The cost of each instruction in cycles of VTA's clock, calibrated on a Pynq-Z1's measured
    latencies (`vta.tophub`: TopHub's resnet18 configs, replayed through this model by
    `benchmarks.vta_calibrate`; the fit and its residuals are in docs/vta-target.md).

    clock_hz: 100 MHz, the Pynq-Z1 fabric clock of VTA's `pkg_config.py` (the default
        bitstream; Ultra96 and ZCU104 build at 333 MHz).
    dram_bytes_per_cycle: 6, fitted. Input, accumulator, micro-op loads and stores share one
        DRAM port (VTA's HLS design maps every DMA port to one AXI bundle); first come, first
        served. The 64-bit AXI master's peak is 8 bytes a cycle; the measured convs fit 6.
    wgt_bytes_per_cycle: 3.75, fitted. Weight loads measure slower per byte than input loads:
        at one rate for both, the weight-heavy convs (the deepest 3x3s, the 1x1s) come out 17-36%
        too fast while the 3x3s that load mostly inputs fit within 4%. The model says that
        weights move slower, not why (a 256-byte SRAM line written from 32 bus beats is one
        guess; a Pynq's traces would tell).
    dma_setup_cycles: 40 per 2-D row burst, fitted: the AXI read/write latency of each row.
    pad_cycles_per_element: 1: a padding element is one SRAM write (HLS `load_pad_2d` writes
        its zero rows and columns element by element). Not fitted (TopHub's convs pad little).
    gemm_cycles_per_uop: 1: one BATCH x BLOCK_IN x BLOCK_OUT matrix product per cycle (HLS
        `PIPELINE II=1`; VTA's docs: "one input-weight matrix multiplication per cycle"). The
        compute-bound 3x3 convs confirm it within 2-4% at any DRAM rate.
    alu_cycles_per_uop: 2: one 16-lane ALU op every 2 cycles (HLS `PIPELINE II=2`, the
        register file's single read port; Chisel's ALU does 1/cycle with an immediate).
    pipeline_fill_cycles: 4: the GEMM/ALU pipeline's fill per instruction (assumed; the fit
        does not move with it).
    Fitted by a grid over (dram, wgt, setup) that minimises the largest per-conv error on the
    10 resnet18 workloads of `pynq_1x16_i8w8a32_15_15_18_17`; checked, not fitted, on the
    same section for the 4x8x8 core (`pynq_4x8_i8w8a32_15_16_16_18`).
    """

    clock_hz: float = 100e6
    dram_bytes_per_cycle: float = 6
    wgt_bytes_per_cycle: float | None = 3.75  # None: the DRAM rate
    dma_setup_cycles: int = 40
    pad_cycles_per_element: int = 1
    gemm_cycles_per_uop: int = 1
    alu_cycles_per_uop: int = 2
    pipeline_fill_cycles: int = 4


class Dram:
    """VTA's DRAM: one byte array. Instructions address a buffer in elements of their type
    (`dram_base` x element bytes), so a buffer must start at a multiple of its element size
    (256 bytes for the Pynq's weight tiles): `alloc` aligns to 4 KiB, VTA's page."""

    ALIGN = 4096

    def __init__(self, nbytes: int = 1 << 20):
        self.data = np.zeros(nbytes, dtype=np.uint8)
        self.top = 0

    def alloc(self, nbytes: int) -> int:
        addr = -(-self.top // self.ALIGN) * self.ALIGN
        if addr + nbytes > self.data.size:
            grown = np.zeros(max(2 * self.data.size, addr + nbytes), dtype=np.uint8)
            grown[: self.data.size] = self.data
            self.data = grown
        self.top = addr + nbytes
        return addr

    def put(self, array: np.ndarray) -> int:
        """Copy `array` (its bytes, C order) into a new buffer; returns its byte address."""
        raw = np.ascontiguousarray(array).view(np.uint8).ravel()
        addr = self.alloc(raw.size)
        self.data[addr : addr + raw.size] = raw
        return addr

    def get(self, addr: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.data[addr : addr + n].view(dtype).reshape(shape).copy()


@dataclass
class Stats:
    """What a run did and how long it took."""

    cycles: int = 0
    busy: dict[str, int] = field(default_factory=lambda: {"load": 0, "compute": 0, "store": 0, "dram": 0})
    gemm_uops: int = 0  # micro-op iterations that multiplied (not resets)
    alu_uops: int = 0
    load_bytes: dict[str, int] = field(default_factory=dict)
    store_bytes: int = 0
    instructions: int = 0

    def seconds(self, model: CycleModel) -> float:
        return self.cycles / model.clock_hz

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


SMALL_GEMM = 4096  # micro-op iterations up to which a GEMM gathers a weight tile per iteration (<= 16 MB)
_TOKENS = {  # (core, flag) -> the token queue it pops or pushes
    (Core.LOAD, "pop_next"): "g2l",
    (Core.LOAD, "push_next"): "l2g",
    (Core.COMPUTE, "pop_prev"): "l2g",
    (Core.COMPUTE, "pop_next"): "s2g",
    (Core.COMPUTE, "push_prev"): "g2l",
    (Core.COMPUTE, "push_next"): "g2s",
    (Core.STORE, "pop_prev"): "g2s",
    (Core.STORE, "push_prev"): "s2g",
}


class Simulator:
    """VTA's state for one config: its SRAMs (with which entries hold data) and the cycle model."""

    def __init__(
        self,
        cfg: VTAConfig,
        cycles: CycleModel | None = None,
        functional: bool = True,
        rules: HardwareRules | None = STRICT,
    ):
        """`functional=False` times a stream without computing its values (the cycle model does
        not depend on them): what knob tuning measures. Streams are checked the same.
        `rules`: the hardware's rules on top of fsim's (`STRICT`, the default); None runs what
        VTA's functional simulator runs (`--sim-mode fsim`, for comparisons)."""
        self.cfg, self.layout, self.model = cfg, Layout.of(cfg), cycles or CycleModel()
        self.functional = functional
        self.rules = rules
        b, bi, bo = cfg.BATCH, cfg.BLOCK_IN, cfg.BLOCK_OUT
        lay = self.layout
        self.inp = np.zeros((1 << lay.inp_depth_log, b, bi), np.int8)
        self.wgt = np.zeros((1 << lay.wgt_depth_log, bo, bi), np.int8)
        self.acc = np.zeros((1 << lay.acc_depth_log, b, bo), np.int32)
        self.uop = np.zeros((3, 1 << lay.uop_depth_log), np.int64)  # decoded (dst, src, wgt)
        self.valid = {
            name: np.zeros(len(getattr(self, name)) if name != "uop" else self.uop.shape[1], bool)
            for name in ("inp", "wgt", "acc", "uop")
        }
        self._index_cache: dict[Insn, tuple[np.ndarray, ...]] = {}
        self._checked: set[tuple[str, Insn]] = set()
        self.elem_bytes = {
            Mem.UOP: 4,
            Mem.INP: b * bi * cfg.INP_WIDTH // 8,
            Mem.WGT: bo * bi * cfg.WGT_WIDTH // 8,
            Mem.ACC: b * bo * cfg.ACC_WIDTH // 8,
            Mem.OUT: b * bo * cfg.INP_WIDTH // 8,
            Mem.ACC_8BIT: b * bo,
        }

    # ---- the run ------------------------------------------------------------------------------------
    def run(self, stream: list[Insn] | bytes, dram: Dram) -> Stats:
        """Execute `stream` (instructions, or their encoded bytes) against `dram`."""
        insns = decode_stream(stream, self.layout) if isinstance(stream, (bytes, bytearray)) else list(stream)
        depth = self.rules.cmd_queue_depth if self.rules else len(insns) + 1  # fsim: the whole stream at once
        queues: dict[Core, deque] = {c: deque() for c in Core}
        fetched, fetch_time = 0, 0  # the fetch module: next instruction, when it can dispatch

        def fetch(now: int) -> None:  # in program order, while the next one's FIFO has room
            nonlocal fetched, fetch_time
            while fetched < len(insns) and len(queues[core_of(insns[fetched])]) < depth:
                fetch_time = max(fetch_time, now)
                queues[core_of(insns[fetched])].append((fetched, insns[fetched], fetch_time))
                fetched += 1

        fetch(0)
        tokens: dict[str, deque] = {q: deque() for q in ("l2g", "g2l", "s2g", "g2s")}
        free = {c: 0 for c in Core}
        dram_free = 0
        stats = Stats()
        for k, insn in enumerate(insns):
            self._check_flags(k, insn)
        while True:
            best = None  # (start, core)
            for core, q in queues.items():
                if not q:
                    continue
                k, insn, ready = q[0]
                pops = [_TOKENS[core, f] for f in ("pop_prev", "pop_next") if getattr(insn.deps, f)]
                if any(not tokens[t] for t in pops):
                    continue
                start = max([free[core], ready] + [tokens[t][0] for t in pops])
                if isinstance(insn, MemInsn) and insn.x_size:
                    start = max(start, dram_free)
                if best is None or start < best[0]:
                    best = (start, core)
            if best is None:
                if any(queues.values()):
                    raise DeadlockError(self._deadlock(queues, tokens, insns, fetched, depth))
                raise StreamError(f"the stream of {len(insns)} instructions has no FINISH: VTA would never signal done")
            start, core = best
            k, insn, _ = queues[core].popleft()
            fetch(start)  # its FIFO entry is free once it starts
            for f in ("pop_prev", "pop_next"):
                if getattr(insn.deps, f):
                    tokens[_TOKENS[core, f]].popleft()
            cost, dma = self._execute(k, insn, dram, stats)
            end = start + cost
            if dma:
                dram_free = end
                stats.busy["dram"] += cost
            free[core] = end
            stats.busy[core.name.lower()] += cost
            stats.instructions += 1
            for f in ("push_prev", "push_next"):
                if getattr(insn.deps, f):
                    tokens[_TOKENS[core, f]].append(end)
            stats.cycles = max(stats.cycles, end)
            if isinstance(insn, FinishInsn):
                break
        left = {c.name.lower(): len(q) for c, q in queues.items() if q}
        if fetched < len(insns):
            left["not fetched"] = len(insns) - fetched
        if left:
            raise StreamError(
                f"FINISH (instruction {k}) ran before {left} instruction(s) of other modules: it must "
                "pop tokens from the load and store modules so that it runs last"
            )
        unused = {q: len(t) for q, t in tokens.items() if t}
        if unused:
            raise StreamError(
                f"tokens left over when the stream finished: {unused}; VTA requires every pushed token to be popped"
            )
        return stats

    def _check_flags(self, k: int, insn: Insn) -> None:
        core = core_of(insn)
        for f in ("pop_prev", "pop_next", "push_prev", "push_next"):
            if getattr(insn.deps, f) and (core, f) not in _TOKENS:
                raise StreamError(
                    f"instruction {k} ({_describe(insn)}) sets {f}, which the {core.name.lower()} module does not have"
                )

    def _deadlock(self, queues, tokens, insns, fetched: int, depth: int) -> str:
        waits = []
        if fetched < len(insns):
            nxt = insns[fetched]
            waits.append(
                f"the fetch module at instruction {fetched} ({_describe(nxt)}) waits for room in the "
                f"{core_of(nxt).name.lower()} command queue, full with {depth} instructions (in-order dispatch: "
                "a stream must never need more run-ahead than the queues hold)"
            )
        for core, q in queues.items():
            if q:
                k, insn, _ = q[0]
                need = [_TOKENS[core, f] for f in ("pop_prev", "pop_next") if getattr(insn.deps, f)]
                waits.append(
                    f"{core.name.lower()} at instruction {k} ({_describe(insn)}) waits for a "
                    f"{' and a '.join(t for t in need if not tokens[t])} token"
                )
        counts = ", ".join(f"{q}={len(t)}" for q, t in tokens.items())
        return "deadlock: " + "; ".join(waits) + f" (tokens: {counts}); no module can run its next instruction"

    # ---- instructions ----------------------------------------------------------------------------------
    def _execute(self, k: int, insn: Insn, dram: Dram, stats: Stats) -> tuple[int, bool]:
        """Run one instruction; (its cycles, whether it used the DRAM port)."""
        m = self.model
        if isinstance(insn, MemInsn):
            if insn.x_size == 0:  # a NOP that carries dependency flags
                return 1, False
            if insn.opcode == Opcode.LOAD:
                nbytes, pads = self._load(k, insn, dram)
                stats.load_bytes[insn.memory_type.name] = stats.load_bytes.get(insn.memory_type.name, 0) + nbytes
            else:
                nbytes, pads = self._store(k, insn, dram), 0
                stats.store_bytes += nbytes
            rate = m.wgt_bytes_per_cycle if insn.memory_type == Mem.WGT and insn.opcode == Opcode.LOAD else None
            beats = math.ceil(nbytes / (rate or m.dram_bytes_per_cycle))
            return insn.y_size * m.dma_setup_cycles + beats + pads * m.pad_cycles_per_element, True
        if isinstance(insn, GemmInsn):
            n = self._gemm(k, insn)
            stats.gemm_uops += 0 if insn.reset else n
            return n * m.gemm_cycles_per_uop + m.pipeline_fill_cycles, False
        if isinstance(insn, AluInsn):
            n = self._alu(k, insn)
            stats.alu_uops += n
            return n * m.alu_cycles_per_uop + m.pipeline_fill_cycles, False
        return 1, False  # FINISH

    def _sram(self, mem: Mem) -> str:
        return {Mem.INP: "inp", Mem.WGT: "wgt", Mem.ACC: "acc", Mem.ACC_8BIT: "acc", Mem.UOP: "uop"}[mem]

    def _load(self, k: int, insn: MemInsn, dram: Dram) -> tuple[int, int]:
        if insn.memory_type == Mem.OUT:
            raise StreamError(f"instruction {k}: LOAD of memory type OUT; VTA loads UOP, WGT, INP, ACC or ACC_8BIT")
        if self.rules and insn.memory_type not in self.rules.loads:
            raise HardwareRuleError(
                f"instruction {k} ({_describe(insn)}): the hardware designs have no {insn.memory_type.name} load "
                f"(HLS load/compute, Chisel FetchDecode: {', '.join(m.name for m in sorted(self.rules.loads))}); "
                "only VTA's functional simulator runs it"
            )
        name = self._sram(insn.memory_type)
        xt = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        yt = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        depth = len(self.valid[name])
        if insn.sram_base + xt * yt > depth:
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) writes {name} entries {insn.sram_base}.."
                f"{insn.sram_base + xt * yt - 1}, past the buffer's {depth}"
            )
        eb = self.elem_bytes[insn.memory_type]
        rows = insn.dram_base + np.arange(insn.y_size)[:, None] * insn.x_stride + np.arange(insn.x_size)[None, :]
        lo, hi = int(rows.min()) * eb, (int(rows.max()) + 1) * eb
        if hi > dram.data.size:
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) reads DRAM bytes up to {hi}, past its {dram.data.size}"
            )
        if insn.memory_type == Mem.UOP:
            words = dram.data[lo:hi].view("<u4")[(rows - insn.dram_base).ravel()]
            block = np.zeros((yt, xt), np.int64)
            block[insn.y_pad_0 : insn.y_pad_0 + insn.y_size, insn.x_pad_0 : insn.x_pad_0 + insn.x_size] = words.reshape(
                insn.y_size, insn.x_size
            )
            for row, arr in zip(self.uop, decode_uops(block.ravel(), self.layout)):
                row[insn.sram_base : insn.sram_base + xt * yt] = arr
            self._index_cache.clear()  # instructions now index other micro-ops
            self._checked.clear()
        else:
            target = getattr(self, name)
            shape = target.shape[1:]
            dtype = np.int8 if insn.memory_type in (Mem.INP, Mem.WGT, Mem.ACC_8BIT) else np.int32
            data = dram.data[:hi].view(dtype).reshape(-1, *shape)[rows.ravel()]
            block = np.zeros((yt, xt, *shape), target.dtype)
            block[insn.y_pad_0 : insn.y_pad_0 + insn.y_size, insn.x_pad_0 : insn.x_pad_0 + insn.x_size] = data.reshape(
                insn.y_size, insn.x_size, *shape
            )
            target[insn.sram_base : insn.sram_base + xt * yt] = block.reshape(-1, *shape)
        self.valid[name][insn.sram_base : insn.sram_base + xt * yt] = True
        return insn.y_size * insn.x_size * eb, xt * yt - insn.x_size * insn.y_size

    def _store(self, k: int, insn: MemInsn, dram: Dram) -> int:
        if insn.memory_type != Mem.OUT:
            raise StreamError(f"instruction {k}: STORE of memory type {insn.memory_type.name}; VTA stores OUT only")
        if insn.y_pad_0 or insn.y_pad_1 or insn.x_pad_0 or insn.x_pad_1:
            raise StreamError(f"instruction {k} ({_describe(insn)}): a STORE has no padding")
        n = insn.y_size * insn.x_size
        src = insn.sram_base + np.arange(n)
        self._require(k, insn, "acc", src)
        out = self.acc[src].astype(np.int8)  # truncation to the low 8 bits (two's complement wrap)
        eb = self.elem_bytes[Mem.OUT]
        rows = insn.dram_base + np.arange(insn.y_size)[:, None] * insn.x_stride + np.arange(insn.x_size)[None, :]
        hi = (int(rows.max()) + 1) * eb
        if hi > dram.data.size:
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) writes DRAM bytes up to {hi}, past its {dram.data.size}"
            )
        view = dram.data[:hi].view(np.int8).reshape(-1, *self.acc.shape[1:])
        view[rows.ravel()] = out
        return n * eb

    def _indices(self, insn: GemmInsn | AluInsn, k: int) -> tuple[np.ndarray, ...]:
        """The (dst, src, wgt) index of every micro-op iteration, in VTA's order: iter_out, iter_in,
        uop. A conv's stream repeats the same GEMM and ALU instructions tile after tile: the
        indices are kept until the micro-op buffer is loaded again."""
        if insn not in self._index_cache:
            self._index_cache[insn] = self._compute_indices(insn, k)
        return self._index_cache[insn]

    def _compute_indices(self, insn: GemmInsn | AluInsn, k: int) -> tuple[np.ndarray, ...]:
        if self.rules and insn.uop_end > self.rules.uop_depth:
            raise HardwareRuleError(
                f"instruction {k} ({_describe(insn)}): micro-ops [{insn.uop_bgn}, {insn.uop_end}) past the "
                f"{self.rules.uop_depth} the Chisel design's micro-op memory holds"
            )
        if not 0 <= insn.uop_bgn <= insn.uop_end <= self.uop.shape[1]:
            raise StreamError(
                f"instruction {k} ({_describe(insn)}): micro-ops [{insn.uop_bgn}, {insn.uop_end}) "
                f"are not in the buffer of {self.uop.shape[1]}"
            )
        self._require(k, insn, "uop", np.arange(insn.uop_bgn, insn.uop_end))
        dst, src, wgt = self.uop[:, insn.uop_bgn : insn.uop_end]
        y = np.arange(insn.iter_out)[:, None, None]
        x = np.arange(insn.iter_in)[None, :, None]

        def idx(base, out, inn):
            return (base[None, None, :] + y * out + x * inn).ravel()

        out = [idx(dst, insn.dst_factor_out, insn.dst_factor_in), idx(src, insn.src_factor_out, insn.src_factor_in)]
        if isinstance(insn, GemmInsn):
            out.append(idx(wgt, insn.wgt_factor_out, insn.wgt_factor_in))
        return tuple(out)

    def _require(self, k: int, insn: Insn, name: str, idx: np.ndarray, operand: str = "") -> None:
        """Every entry `idx` of SRAM `name` exists and holds data some instruction wrote (an
        entry, once written, stays valid: a check of the same indices of the same operand
        passes again; `operand` tells an instruction's two reads of one SRAM apart)."""
        key = (name, operand, insn)
        if key in self._checked:
            return
        self._checked.add(key)
        valid = self.valid[name]
        if idx.size and int(idx.max()) >= len(valid):
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) reads {name} entry {int(idx.max())}, past the "
                f"buffer's {len(valid)}"
            )
        bad = idx[~valid[idx]]
        if bad.size:
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) reads {name} entry {int(bad[0])} before anything "
                "was loaded or computed there (a missing LOAD, or a dependency token it did not wait for)"
            )

    def _gemm(self, k: int, insn: GemmInsn) -> int:
        dst, src, wgt = self._indices(insn, k)
        if dst.size and int(dst.max()) >= len(self.acc):
            raise StreamError(
                f"instruction {k} ({_describe(insn)}) writes acc entry {int(dst.max())}, past the "
                f"buffer's {len(self.acc)}"
            )
        if insn.reset:
            self.acc[dst] = 0
            self.valid["acc"][dst] = True
            return dst.size
        self._require(k, insn, "inp", src)
        self._require(k, insn, "wgt", wgt)
        self._require(k, insn, "acc", dst)
        if self.rules:
            self._check_gemm_hazard(k, insn, dst)
        if not self.functional:
            return dst.size
        # One matrix product per distinct weight tile (a conv's GEMM reuses each over many
        # inputs): int8 x int8 sums of BLOCK_IN terms are exact in float32 (< 2^24).
        if dst.size <= SMALL_GEMM:  # a few iterations: gathering their weight tiles is cheaper
            prod = np.matmul(self.inp[src].astype(np.float32), self.wgt[wgt].astype(np.float32).transpose(0, 2, 1))
        else:
            by_wgt = np.argsort(wgt, kind="stable")
            cuts = np.flatnonzero(np.diff(wgt[by_wgt])) + 1
            prod = np.empty((dst.size,) + self.acc.shape[1:], np.float32)
            for group in np.split(by_wgt, cuts):
                w = self.wgt[wgt[group[0]]].astype(np.float32)  # (BLOCK_OUT, BLOCK_IN)
                prod[group] = self.inp[src[group]].astype(np.float32) @ w.T
        # then the sums per accumulator (int64: exact), added to it with int32 wraparound
        by_dst = np.argsort(dst, kind="stable")
        d_sorted = dst[by_dst]
        starts = np.concatenate([[0], np.flatnonzero(np.diff(d_sorted)) + 1])
        sums = np.add.reduceat(prod[by_dst].astype(np.int64), starts, axis=0)
        rows = d_sorted[starts]
        self.acc[rows] = _wrap32(self.acc[rows].astype(np.int64) + sums)
        return dst.size

    def _check_gemm_hazard(self, k: int, insn: GemmInsn, dst: np.ndarray) -> None:
        key = ("hazard", "", insn)
        if key in self._checked:
            return
        self._checked.add(key)
        for d in range(1, self.rules.gemm_dst_apart):
            same = np.flatnonzero(dst[d:] == dst[:-d])
            if same.size:
                i = int(same[0]) + d
                raise HardwareRuleError(
                    f"instruction {k} ({_describe(insn)}): micro-op iteration {i} writes acc entry {int(dst[i])}, "
                    f"which iteration {i - d} wrote {d} micro-op(s) before: the pipelined GEMM does not wait for "
                    f"it (VTA's runtime refuses this, VerifyDep); keep {self.rules.gemm_dst_apart - 1} other "
                    "accumulators between two writes of one"
                )

    def _alu(self, k: int, insn: AluInsn) -> int:
        dst, src = self._indices(insn, k)
        if insn.use_imm:
            src = dst
        if self.rules and insn.use_imm and insn.alu_opcode == AluOp.SHR:
            lo, hi = self.rules.shr_imm
            if not lo <= insn.imm <= hi:
                raise HardwareRuleError(
                    f"instruction {k} ({_describe(insn)}): shift immediate {insn.imm} outside the hardware's "
                    f"[{lo}, {hi}]"
                )
        self._require(k, insn, "acc", dst, "dst")
        self._require(k, insn, "acc", src, "src")
        if not self.functional:
            return dst.size
        if len(np.unique(dst)) == dst.size and (
            insn.use_imm or not np.isin(src, dst).any() or np.array_equal(src, dst)
        ):
            self.acc[dst] = self._alu_op(insn, self.acc[dst], self.acc[src])
        else:  # a later iteration reads what an earlier one wrote: in VTA's order, one at a time
            for d, s in zip(dst, src):
                self.acc[d] = self._alu_op(insn, self.acc[d], self.acc[s])
        return dst.size

    @staticmethod
    def _alu_op(insn: AluInsn, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        x = a.astype(np.int64)
        y = np.full_like(x, insn.imm) if insn.use_imm else b.astype(np.int64)
        op = insn.alu_opcode
        if op == AluOp.MIN:
            r = np.minimum(x, y)
        elif op == AluOp.MAX:
            r = np.maximum(x, y)
        elif op == AluOp.ADD:
            r = x + y
        elif op == AluOp.SHR:
            r = np.where(y >= 0, x >> np.clip(y, 0, 63), _wrap32(x << np.clip(-y, 0, 63)))
        else:
            r = x * y
        return _wrap32(r)


def _wrap32(x: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def _describe(insn: Insn) -> str:
    if isinstance(insn, MemInsn):
        return f"{insn.opcode.name} {insn.memory_type.name}"
    if isinstance(insn, AluInsn):
        return f"ALU {insn.alu_opcode.name}"
    return insn.opcode.name
