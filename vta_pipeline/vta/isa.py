"""VTA's instruction set: 128-bit instructions and 32-bit micro-ops, bit for bit.

The layout is VTA's hardware spec (`include/vta/hw_spec.h` of apache/tvm-vta, HW_VER 0.0.2):
each instruction is a C struct of `uint64_t` bit-fields, allocated from the least significant
bit of a 64-bit word in declaration order, a field that would cross into the next word
starting at that word instead (the unused bits are zero; VTA's Chisel decoder declares those
pads explicitly). In memory an instruction is two little-endian 64-bit words, so the same
bytes could drive a bitstream built from that spec.

Every instruction starts with a 7-bit header: the opcode and the four dependency flags
(pop_prev, pop_next, push_prev, push_next) by which the load, compute and store modules
hand each other tokens. The field widths of GEMM and ALU instructions and of micro-ops
follow from the buffer depths of the `VTAConfig` (log2 of the entries of the micro-op,
input, weight and accumulator SRAMs): 13, 11, 10 and 11 bits for the Pynq's defaults.
A config whose fields need more than 128 (or 32) bits has no encoding: `Layout` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from functools import cached_property
from typing import Union

import numpy as np

from ..errors import ConfigError
from .config import VTAConfig

INSN_BYTES = 16
UOP_BYTES = 4
# Constant field widths (hw_spec_const.h)
OPCODE_BITS, MEMOP_ID_BITS, SRAM_ADDR_BITS, DRAM_ADDR_BITS = 3, 3, 16, 32
SIZE_BITS, STRIDE_BITS, PAD_BITS, LOOP_ITER_BITS = 16, 16, 4, 14
ALU_OPCODE_BITS, ALU_IMM_BITS = 3, 16
HEADER = (("opcode", OPCODE_BITS), ("pop_prev", 1), ("pop_next", 1), ("push_prev", 1), ("push_next", 1))


class Opcode(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class Mem(IntEnum):
    """`memory_type` of a LOAD or STORE: which buffer (ACC_8BIT: int8 from DRAM, sign-extended
    into the int32 accumulators)."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC_8BIT = 5


class AluOp(IntEnum):
    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3  # arithmetic shift right; a negative amount shifts left
    MUL = 4  # VTA's functional simulator only (the HLS and Chisel designs do not decode it)


class Core(IntEnum):
    """The module an instruction runs on (VTA's fetch routing)."""

    LOAD = 1
    COMPUTE = 2
    STORE = 3


@dataclass(frozen=True)
class Deps:
    """The dependency flags: pop a token from / push a token to the previous or next module
    of load -> compute -> store before / after running."""

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False


@dataclass(frozen=True)
class MemInsn:
    """LOAD (DRAM -> SRAM, zero padding around each 2-D tile) or STORE (SRAM -> DRAM)."""

    opcode: Opcode
    memory_type: Mem
    sram_base: int
    dram_base: int  # in elements of the buffer's type
    y_size: int
    x_size: int
    x_stride: int
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0
    deps: Deps = Deps()


@dataclass(frozen=True)
class GemmInsn:
    """for y < iter_out, x < iter_in, u in [uop_bgn, uop_end):
    acc[dst] += inp[src] . wgt[wgt]^T (or acc[dst] = 0 with reset), each index the micro-op's
    plus y * factor_out + x * factor_in."""

    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    reset: bool = False
    deps: Deps = Deps()

    opcode = Opcode.GEMM


@dataclass(frozen=True)
class AluInsn:
    """The same loops over the accumulators: acc[dst] = op(acc[dst], imm or acc[src])."""

    alu_opcode: AluOp
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    use_imm: bool = False
    imm: int = 0
    reset: bool = False
    deps: Deps = Deps()

    opcode = Opcode.ALU


@dataclass(frozen=True)
class FinishInsn:
    """The end of the stream (on the compute module); it carries no pop."""

    deps: Deps = Deps()

    opcode = Opcode.FINISH


Insn = Union[MemInsn, GemmInsn, AluInsn, FinishInsn]


def core_of(insn: Insn) -> Core:
    """VTA's routing: STORE to the store module; LOADs of inputs and weights to the load module;
    everything else (GEMM, ALU, FINISH, LOADs of micro-ops and accumulators) to compute."""
    if isinstance(insn, MemInsn):
        if insn.opcode == Opcode.STORE:
            return Core.STORE
        return Core.LOAD if insn.memory_type in (Mem.INP, Mem.WGT) else Core.COMPUTE
    return Core.COMPUTE


def _place(spec: tuple[tuple[str, int], ...], word_bits: int, total_bits: int, what: str) -> dict[str, tuple[int, int]]:
    """Bit offset and width of each field, allocated as C bit-fields in `word_bits` containers."""
    out, pos = {}, 0
    for name, width in spec:
        if width > word_bits:
            raise ConfigError(f"{what}: field {name} needs {width} bits, more than a {word_bits}-bit word")
        if pos // word_bits != (pos + width - 1) // word_bits:  # would straddle: start the next word
            pos = (pos // word_bits + 1) * word_bits
        out[name] = (pos, width)
        pos += width
    if pos > total_bits:
        raise ConfigError(
            f"{what} needs {pos} bits, more than its {total_bits}: this VTA config's buffer depths have "
            "no encoding in VTA's instruction format (use smaller LOG_*_BUFF_SIZE)"
        )
    return out


@dataclass(frozen=True)
class Layout:
    """Field positions of every instruction kind and of a micro-op for one VTA config."""

    uop_depth_log: int  # U
    inp_depth_log: int  # I
    wgt_depth_log: int  # W
    acc_depth_log: int  # A

    @classmethod
    def of(cls, cfg: VTAConfig) -> Layout:
        """Depths = buffer bytes / element bytes (hw_spec_const.h's LOG_*_BUFF_DEPTH)."""
        u = cfg.LOG_UOP_BUFF_SIZE - 2
        i = cfg.LOG_INP_BUFF_SIZE - cfg.LOG_BATCH - cfg.LOG_BLOCK - cfg.LOG_INP_WIDTH + 3
        w = cfg.LOG_WGT_BUFF_SIZE - 2 * cfg.LOG_BLOCK - cfg.LOG_WGT_WIDTH + 3
        a = cfg.LOG_ACC_BUFF_SIZE - cfg.LOG_BATCH - cfg.LOG_BLOCK - cfg.LOG_ACC_WIDTH + 3
        if min(u, i, w, a) < 0:
            raise ConfigError(f"VTA config {cfg.model_dump()}: a buffer holds less than one element")
        layout = cls(u, i, w, a)
        _ = layout.gemm, layout.alu, layout.uop  # fail now, naming the field, when it has no encoding
        return layout

    @cached_property
    def mem(self) -> dict[str, tuple[int, int]]:
        spec = HEADER + (
            ("memory_type", MEMOP_ID_BITS),
            ("sram_base", SRAM_ADDR_BITS),
            ("dram_base", DRAM_ADDR_BITS),
            ("y_size", SIZE_BITS),
            ("x_size", SIZE_BITS),
            ("x_stride", STRIDE_BITS),
            ("y_pad_0", PAD_BITS),
            ("y_pad_1", PAD_BITS),
            ("x_pad_0", PAD_BITS),
            ("x_pad_1", PAD_BITS),
        )
        return _place(spec, 64, 128, "a LOAD/STORE instruction")

    def _loops(self, src_bits: int) -> tuple[tuple[str, int], ...]:
        u, a = self.uop_depth_log, self.acc_depth_log
        return HEADER + (
            ("reset", 1),
            ("uop_bgn", u),
            ("uop_end", u + 1),
            ("iter_out", LOOP_ITER_BITS),
            ("iter_in", LOOP_ITER_BITS),
            ("dst_factor_out", a),
            ("dst_factor_in", a),
            ("src_factor_out", src_bits),
            ("src_factor_in", src_bits),
        )

    @cached_property
    def gemm(self) -> dict[str, tuple[int, int]]:
        w = self.wgt_depth_log
        spec = self._loops(self.inp_depth_log) + (("wgt_factor_out", w), ("wgt_factor_in", w))
        return _place(spec, 64, 128, "a GEMM instruction")

    @cached_property
    def alu(self) -> dict[str, tuple[int, int]]:  # its source indexes the accumulators
        spec = self._loops(self.acc_depth_log) + (
            ("alu_opcode", ALU_OPCODE_BITS),
            ("use_imm", 1),
            ("imm", ALU_IMM_BITS),
        )
        return _place(spec, 64, 128, "an ALU instruction")

    @cached_property
    def finish(self) -> dict[str, tuple[int, int]]:
        return _place(HEADER, 64, 128, "a FINISH instruction")

    @cached_property
    def uop(self) -> dict[str, tuple[int, int]]:
        a = self.acc_depth_log
        spec = (("dst", a), ("src", max(a, self.inp_depth_log)), ("wgt", self.wgt_depth_log))
        return _place(spec, 32, 32, "a micro-op")

    def fields_of(self, opcode: Opcode) -> dict[str, tuple[int, int]]:
        return {
            Opcode.LOAD: self.mem,
            Opcode.STORE: self.mem,
            Opcode.GEMM: self.gemm,
            Opcode.ALU: self.alu,
            Opcode.FINISH: self.finish,
        }[opcode]


class EncodeError(ValueError):
    """A field value that does not fit its bits; the message names the instruction and the field."""


def _values(insn: Insn) -> dict[str, int]:
    vals = {f.name: getattr(insn, f.name) for f in fields(insn) if f.name != "deps"}
    vals.update({k: int(getattr(insn.deps, k)) for k in ("pop_prev", "pop_next", "push_prev", "push_next")})
    vals["opcode"] = int(insn.opcode)
    return {k: int(v) for k, v in vals.items()}


def encode(insn: Insn, layout: Layout) -> bytes:
    """The instruction's 16 bytes (two little-endian 64-bit words)."""
    word = 0
    for name, value in _values(insn).items():
        pos, width = layout.fields_of(insn.opcode)[name]
        if name == "imm":  # signed 16 bits
            if not -(1 << (width - 1)) <= value < (1 << (width - 1)):
                raise EncodeError(f"{type(insn).__name__}: imm={value} does not fit a signed {width}-bit field")
            value &= (1 << width) - 1
        elif not 0 <= value < (1 << width):
            raise EncodeError(
                f"{type(insn).__name__}: {name}={value} does not fit its {width} bits (0..{(1 << width) - 1})"
            )
        word |= value << pos
    return word.to_bytes(INSN_BYTES, "little")


def decode(raw: bytes, layout: Layout) -> Insn:
    """The instruction encoded in 16 bytes; an unknown opcode or memory type is an error."""
    if len(raw) != INSN_BYTES:
        raise ValueError(f"an instruction is {INSN_BYTES} bytes, got {len(raw)}")
    word = int.from_bytes(raw, "little")
    try:
        opcode = Opcode(word & ((1 << OPCODE_BITS) - 1))
    except ValueError:
        raise ValueError(f"instruction 0x{word:032x}: unknown opcode {word & 7}") from None
    vals = {}
    for name, (pos, width) in layout.fields_of(opcode).items():
        v = (word >> pos) & ((1 << width) - 1)
        if name == "imm" and v >> (width - 1):
            v -= 1 << width
        vals[name] = v
    deps = Deps(*(bool(vals.pop(k)) for k in ("pop_prev", "pop_next", "push_prev", "push_next")))
    vals.pop("opcode")
    if opcode in (Opcode.LOAD, Opcode.STORE):
        return MemInsn(opcode, Mem(vals.pop("memory_type")), deps=deps, **vals)
    if opcode == Opcode.GEMM:
        return GemmInsn(reset=bool(vals.pop("reset")), deps=deps, **vals)
    if opcode == Opcode.ALU:
        return AluInsn(
            AluOp(vals.pop("alu_opcode")),
            use_imm=bool(vals.pop("use_imm")),
            reset=bool(vals.pop("reset")),
            deps=deps,
            **vals,
        )
    return FinishInsn(deps=deps)


def encode_stream(insns: list[Insn], layout: Layout) -> bytes:
    return b"".join(encode(i, layout) for i in insns)


def decode_stream(raw: bytes, layout: Layout) -> list[Insn]:
    if len(raw) % INSN_BYTES:
        raise ValueError(f"an instruction stream is a multiple of {INSN_BYTES} bytes, got {len(raw)}")
    return [decode(raw[k : k + INSN_BYTES], layout) for k in range(0, len(raw), INSN_BYTES)]


def encode_uops(dst: np.ndarray, src: np.ndarray, wgt: np.ndarray, layout: Layout) -> np.ndarray:
    """Micro-ops as little-endian uint32 words (vectorized: a conv has thousands)."""
    out = np.zeros(np.shape(dst), dtype=np.uint64)
    for name, arr in (("dst", dst), ("src", src), ("wgt", wgt)):
        pos, width = layout.uop[name]
        arr = np.asarray(arr, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= (1 << width)):
            raise EncodeError(
                f"micro-op {name} index {int(arr.max()) if arr.max() >= (1 << width) else int(arr.min())} "
                f"does not fit its {width} bits (0..{(1 << width) - 1})"
            )
        out |= arr.astype(np.uint64) << np.uint64(pos)
    return out.astype("<u4")


def decode_uops(words: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dst, src, wgt) index arrays of micro-op words."""
    w = np.asarray(words, dtype=np.int64)
    return tuple((w >> pos) & ((1 << width) - 1) for pos, width in (layout.uop[k] for k in ("dst", "src", "wgt")))
