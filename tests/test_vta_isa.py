"""VTA's instruction set: bit positions as VTA's hardware spec lays them out, round trips, and
errors that name the field that does not fit."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from vta_pipeline.errors import ConfigError
from vta_pipeline.vta import isa
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.isa import AluInsn, AluOp, Deps, FinishInsn, GemmInsn, Layout, Mem, MemInsn, Opcode

PYNQ = Layout.of(VTAConfig())


def test_the_pynq_configs_fields_sit_where_vtas_hardware_spec_puts_them():
    assert (PYNQ.uop_depth_log, PYNQ.inp_depth_log, PYNQ.wgt_depth_log, PYNQ.acc_depth_log) == (13, 11, 10, 11)
    # GEMM: word 0 holds the loops, bit 63 is padding, word 1 is exactly the six factors
    assert PYNQ.gemm == {
        "opcode": (0, 3),
        "pop_prev": (3, 1),
        "pop_next": (4, 1),
        "push_prev": (5, 1),
        "push_next": (6, 1),
        "reset": (7, 1),
        "uop_bgn": (8, 13),
        "uop_end": (21, 14),
        "iter_out": (35, 14),
        "iter_in": (49, 14),
        "dst_factor_out": (64, 11),
        "dst_factor_in": (75, 11),
        "src_factor_out": (86, 11),
        "src_factor_in": (97, 11),
        "wgt_factor_out": (108, 10),
        "wgt_factor_in": (118, 10),
    }
    assert {k: PYNQ.alu[k] for k in ("src_factor_in", "alu_opcode", "use_imm", "imm")} == {
        "src_factor_in": (97, 11),
        "alu_opcode": (108, 3),
        "use_imm": (111, 1),
        "imm": (112, 16),
    }
    # LOAD/STORE: y_size would straddle the words, so it starts word 1 (bits 58-63 are padding)
    assert PYNQ.mem["dram_base"] == (26, 32) and PYNQ.mem["y_size"] == (64, 16) and PYNQ.mem["x_pad_1"] == (124, 4)
    assert PYNQ.uop == {"dst": (0, 11), "src": (11, 11), "wgt": (22, 10)}


def test_a_load_encodes_to_the_bytes_written_out_by_hand():
    load = MemInsn(
        Opcode.LOAD,
        Mem.INP,
        sram_base=5,
        dram_base=0x1234,
        y_size=7,
        x_size=9,
        x_stride=56,
        y_pad_0=1,
        y_pad_1=2,
        x_pad_0=3,
        x_pad_1=15,
        deps=Deps(pop_next=True, push_next=True),
    )
    word0 = 0 | 1 << 4 | 1 << 6 | 2 << 7 | 5 << 10 | 0x1234 << 26
    word1 = 7 | 9 << 16 | 56 << 32 | 1 << 48 | 2 << 52 | 3 << 56 | 15 << 60
    assert isa.encode(load, PYNQ) == word0.to_bytes(8, "little") + word1.to_bytes(8, "little")
    assert isa.decode(isa.encode(load, PYNQ), PYNQ) == load


def _random(kind, rng, layout):
    """An instruction of `kind` with every field drawn over its whole range."""
    spec = layout.fields_of(kind.opcode if kind is not MemInsn else Opcode.LOAD)
    vals = {}
    for f in fields(kind):
        if f.name in ("deps", "opcode"):
            continue
        width = spec[f.name][1]
        vals[f.name] = (
            int(rng.integers(-(1 << (width - 1)), 1 << (width - 1)))
            if f.name == "imm"
            else int(rng.integers(0, 1 << width))
        )
    deps = Deps(*(bool(b) for b in rng.integers(0, 2, 4)))
    if kind is MemInsn:
        return MemInsn(
            Opcode(int(rng.integers(0, 2))), **{**vals, "memory_type": Mem(vals["memory_type"] % 6)}, deps=deps
        )
    if kind is AluInsn:
        vals["alu_opcode"] = AluOp(vals["alu_opcode"] % 5)
    return kind(**{k: bool(v) if k in ("reset", "use_imm") else v for k, v in vals.items()}, deps=deps)


@pytest.mark.parametrize("kind", [MemInsn, GemmInsn, AluInsn, FinishInsn])
def test_every_instruction_round_trips_through_its_16_bytes(kind):
    rng = np.random.default_rng(0)
    small = Layout.of(
        VTAConfig(LOG_BLOCK=3, LOG_UOP_BUFF_SIZE=12, LOG_INP_BUFF_SIZE=14, LOG_WGT_BUFF_SIZE=16, LOG_ACC_BUFF_SIZE=15)
    )  # other widths: 10, 11, 10, 10 bits
    for layout in (PYNQ, small):
        insns = [_random(kind, rng, layout) for _ in range(200)]
        raw = isa.encode_stream(insns, layout)
        assert len(raw) == 16 * len(insns)
        assert isa.decode_stream(raw, layout) == insns


def test_micro_ops_round_trip_as_little_endian_words():
    rng = np.random.default_rng(1)
    dst, src, wgt = rng.integers(0, 2048, 1000), rng.integers(0, 2048, 1000), rng.integers(0, 1024, 1000)
    words = isa.encode_uops(dst, src, wgt, PYNQ)
    assert words.dtype == np.dtype("<u4") and int(words[0]) == int(dst[0]) | int(src[0]) << 11 | int(wgt[0]) << 22
    for a, b in zip(isa.decode_uops(words, PYNQ), (dst, src, wgt)):
        assert np.array_equal(a, b)


def test_values_that_do_not_fit_name_the_field():
    gemm = GemmInsn(uop_bgn=0, uop_end=1, iter_out=1, iter_in=1)
    with pytest.raises(isa.EncodeError, match=r"GemmInsn: iter_out=16384 does not fit its 14 bits"):
        isa.encode(replace(gemm, iter_out=1 << 14), PYNQ)
    with pytest.raises(isa.EncodeError, match=r"imm=40000 does not fit a signed 16-bit field"):
        isa.encode(AluInsn(AluOp.ADD, 0, 1, 1, 1, use_imm=True, imm=40000), PYNQ)
    with pytest.raises(isa.EncodeError, match=r"micro-op wgt index 1024 does not fit its 10 bits"):
        isa.encode_uops([0], [0], [1024], PYNQ)


def test_a_config_whose_fields_overflow_the_instruction_is_refused():
    with pytest.raises(ConfigError, match=r"GEMM instruction needs \d+ bits, more than its 128"):
        Layout.of(VTAConfig(LOG_INP_BUFF_SIZE=20, LOG_WGT_BUFF_SIZE=22, LOG_ACC_BUFF_SIZE=22))


def test_instructions_run_on_the_module_vtas_fetch_routes_them_to():
    load = MemInsn(Opcode.LOAD, Mem.INP, 0, 0, 1, 1, 1)
    assert isa.core_of(load) == isa.Core.LOAD and isa.core_of(replace(load, memory_type=Mem.WGT)) == isa.Core.LOAD
    for m in (Mem.UOP, Mem.ACC, Mem.ACC_8BIT):
        assert isa.core_of(replace(load, memory_type=m)) == isa.Core.COMPUTE
    assert isa.core_of(replace(load, opcode=Opcode.STORE, memory_type=Mem.OUT)) == isa.Core.STORE
    assert isa.core_of(FinishInsn()) == isa.core_of(GemmInsn(0, 1, 1, 1)) == isa.Core.COMPUTE
