"""The VTA simulator on hand-written instruction streams: what each instruction computes, the
errors VTA's own simulator leaves silent, and the cycle model's sanity."""

from __future__ import annotations

import numpy as np
import pytest

from vta_pipeline.vta import isa
from vta_pipeline.vta.isa import AluInsn, AluOp, Deps, FinishInsn, GemmInsn, Mem, MemInsn, Opcode
from vta_pipeline.vta.simulator import DeadlockError, Dram, Simulator, StreamError
from vta_pipeline.vta_config import VTAConfig

CFG = VTAConfig()  # BATCH 1, BLOCK 16
LAYOUT = isa.Layout.of(CFG)
PUSH_L2G, POP_L2G = Deps(push_next=True), Deps(pop_prev=True)


def load(
    mem: Mem,
    sram: int,
    addr: int,
    elem_bytes: int,
    y: int,
    x: int,
    stride: int | None = None,
    deps=Deps(),
    pads=(0, 0, 0, 0),
) -> MemInsn:
    """A LOAD of a y x x tile from byte address `addr` (element-aligned)."""
    assert addr % elem_bytes == 0
    return MemInsn(Opcode.LOAD, mem, sram, addr // elem_bytes, y, x, stride or x, *pads, deps=deps)


def store(sram: int, addr: int, y: int, x: int, stride: int | None = None, deps=Deps()) -> MemInsn:
    return MemInsn(Opcode.STORE, Mem.OUT, sram, addr // 16, y, x, stride or x, deps=deps)


def uops(dram: Dram, dst, src, wgt) -> tuple[int, int]:
    """Micro-ops in DRAM: (byte address, count)."""
    words = isa.encode_uops(np.array(dst), np.array(src), np.array(wgt), LAYOUT)
    return dram.put(words), len(words)


def matmul_stream(dram: Dram, n: int, extra=()) -> tuple[list, int]:
    """acc[i] = inp[i] . wgt[0]^T for i < n, then `extra` instructions, stored to DRAM as int8."""
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (n, 1, 16), dtype=np.int8)
    w = rng.integers(-128, 128, (1, 16, 16), dtype=np.int8)
    ia, wa = dram.put(a), dram.put(w)
    ua, nu = uops(dram, [0], [0], [0])
    out = dram.alloc(n * 16)
    stream = [
        load(Mem.INP, 0, ia, 16, 1, n),
        load(Mem.WGT, 0, wa, 256, 1, 1, deps=PUSH_L2G),
        load(Mem.UOP, 0, ua, 4, 1, nu, deps=POP_L2G),
        GemmInsn(0, nu, n, 1, dst_factor_out=1, src_factor_out=1, reset=True),
        GemmInsn(0, nu, n, 1, dst_factor_out=1, src_factor_out=1),
        *extra,
        store(0, out, 1, n, deps=Deps()),
        FinishInsn(),
    ]
    return stream, out, a, w


def _sync_store(stream: list) -> list:
    """Hand the last compute instruction's result to the store and back to FINISH."""
    *body, st, fin = stream
    body[-1] = _with(body[-1], push_next=True)
    return [*body, _with(st, pop_prev=True, push_prev=True), _with(fin, pop_next=True)]


def _with(insn, **flags):
    from dataclasses import replace

    return replace(insn, deps=replace(insn.deps, **flags))


def test_a_gemm_accumulates_int8_products_in_int32_and_the_store_truncates():
    dram = Dram()
    stream, out, a, w = matmul_stream(dram, 8)
    stats = Simulator(CFG).run(_sync_store(stream), dram)
    acc = a[:, 0].astype(np.int64) @ w[0].astype(np.int64).T  # (8, 16) int32 sums
    assert np.array_equal(dram.get(out, np.int8, (8, 1, 16))[:, 0], acc.astype(np.int8))  # low 8 bits, no saturation
    assert np.abs(acc).max() > 127  # the truncation was exercised
    assert stats.gemm_uops == 8 and stats.store_bytes == 8 * 16


def test_the_same_stream_runs_from_its_encoded_bytes():
    dram = Dram()
    stream, out, _, _ = matmul_stream(dram, 4)
    Simulator(CFG).run(_sync_store(stream), dram)
    first = dram.get(out, np.int8, (4, 16))
    dram2 = Dram()
    stream2, out2, _, _ = matmul_stream(dram2, 4)
    Simulator(CFG).run(isa.encode_stream(_sync_store(stream2), LAYOUT), dram2)
    assert np.array_equal(dram2.get(out2, np.int8, (4, 16)), first)


@pytest.mark.parametrize(
    "op, imm, expect",
    [
        (AluOp.MIN, 100, lambda x: np.minimum(x, 100)),
        (AluOp.MAX, -5, lambda x: np.maximum(x, -5)),
        (AluOp.ADD, 7, lambda x: x + 7),
        (AluOp.SHR, 3, lambda x: x >> 3),  # arithmetic
        (AluOp.SHR, -2, lambda x: x << 2),  # a negative amount shifts left
    ],
)
def test_alu_ops_with_an_immediate(op, imm, expect):
    dram = Dram()
    alu = [AluInsn(op, 0, 1, 8, 1, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=imm)]
    stream, out, a, w = matmul_stream(dram, 8, alu)
    sim = Simulator(CFG)
    sim.run(_sync_store(stream), dram)
    acc = a[:, 0].astype(np.int64) @ w[0].astype(np.int64).T
    assert np.array_equal(sim.acc[:8, 0], expect(acc).astype(np.int32))


def test_an_alu_op_between_accumulators_and_the_requantize_that_clamps_before_the_store():
    # acc[i] = max(acc[i], acc[i + 4]) for i < 4, then VTA's requantize: shift, clamp to [-127, 127]
    dram = Dram()
    ua, nu = uops(dram, [0], [4], [0])
    alu = [
        load(Mem.UOP, 1, ua, 4, 1, nu),
        AluInsn(AluOp.MAX, 1, 2, 4, 1, dst_factor_out=1, src_factor_out=1),
        AluInsn(AluOp.SHR, 0, 1, 8, 1, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=4),
        AluInsn(AluOp.MIN, 0, 1, 8, 1, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=127),
        AluInsn(AluOp.MAX, 0, 1, 8, 1, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=-127),
    ]
    stream, out, a, w = matmul_stream(dram, 8, alu)
    Simulator(CFG).run(_sync_store(stream), dram)
    acc = a[:, 0].astype(np.int64) @ w[0].astype(np.int64).T
    acc[:4] = np.maximum(acc[:4], acc[4:])
    assert np.array_equal(dram.get(out, np.int8, (8, 16)), np.clip(acc >> 4, -127, 127))


def test_a_load_pads_the_tile_with_zeros_around_it():
    dram = Dram()
    x = np.arange(1, 2 * 3 * 16 + 1).reshape(2, 3, 1, 16).astype(np.int8)  # 2 rows x 3 elements
    addr = dram.put(x)
    sim = Simulator(CFG)
    ins = [load(Mem.INP, 0, addr, 16, 2, 3, pads=(1, 2, 1, 0)), FinishInsn()]
    sim.run(ins, dram)
    block = sim.inp[: 5 * 4, 0].reshape(5, 4, 16)  # (1 + 2 + 2) rows x (1 + 3 + 0) elements
    expect = np.zeros((5, 4, 16), np.int8)
    expect[1:3, 1:4] = x[:, :, 0]
    assert np.array_equal(block, expect)
    assert sim.valid["inp"][:20].all() and not sim.valid["inp"][20:].any()


def test_a_strided_load_reads_rows_x_stride_apart():
    dram = Dram()
    x = np.arange(4 * 5 * 16).reshape(4, 5, 1, 16).astype(np.int8)
    addr = dram.put(x)
    sim = Simulator(CFG)
    sim.run([load(Mem.INP, 0, addr + 16, 16, 4, 2, stride=5), FinishInsn()], dram)  # columns 1 and 2
    assert np.array_equal(sim.inp[:8, 0].reshape(4, 2, 16), x[:, 1:3, 0])


def test_a_dependency_deadlock_is_detected_and_names_who_waits():
    dram = Dram()
    stream, _, _, _ = matmul_stream(dram, 2)
    stream[1] = _with(stream[1], push_next=False)  # the weight load never hands over its token
    with pytest.raises(DeadlockError, match=r"compute at instruction 2 \(LOAD UOP\) waits for a l2g token"):
        Simulator(CFG).run(_sync_store(stream), dram)


def test_a_read_of_an_entry_nothing_loaded_is_an_error():
    dram = Dram()
    stream, _, _, _ = matmul_stream(dram, 4)
    del stream[0]  # no input load
    stream[0] = _with(stream[0], push_next=True)
    with pytest.raises(StreamError, match=r"instruction 3 \(GEMM\) reads inp entry 0 before anything was loaded"):
        Simulator(CFG).run(_sync_store(stream), dram)


def test_streams_must_end_in_a_finish_that_runs_last_with_no_tokens_left():
    dram = Dram()
    stream, _, _, _ = matmul_stream(dram, 2)
    with pytest.raises(StreamError, match="has no FINISH"):
        Simulator(CFG).run(_sync_store(stream)[:-1], dram)
    early = _sync_store(stream)
    early[-2], early[-1] = _with(early[-2], push_prev=False), _with(early[-1], pop_next=False)
    with pytest.raises(StreamError, match=r"FINISH \(instruction \d+\) ran before \{'store': 1\}"):
        Simulator(CFG).run(early, dram)  # FINISH does not wait for the store
    with pytest.raises(StreamError, match=r"tokens left over .*'g2s': 1"):
        s = _sync_store(stream)
        s[-2] = _with(s[-2], pop_prev=False, push_prev=False)  # the store ignores the token
        s[-1] = _with(s[-1], pop_next=False)
        Simulator(CFG).run(s, dram)


def test_a_flag_the_module_does_not_have_is_refused():
    with pytest.raises(StreamError, match=r"instruction 0 \(LOAD INP\) sets pop_prev, which the load module does not"):
        Simulator(CFG).run([load(Mem.INP, 0, 0, 16, 1, 1, deps=Deps(pop_prev=True)), FinishInsn()], Dram())


# ---- the cycle model -------------------------------------------------------------------------------
def _cycles(n: int) -> int:
    dram = Dram()
    stream, _, _, _ = matmul_stream(dram, n)
    return Simulator(CFG).run(_sync_store(stream), dram).cycles


def test_twice_the_work_takes_more_cycles():
    assert _cycles(64) > _cycles(32) > _cycles(16)


def _tiles(threads: int, tiles: int = 6, n: int = 64):
    """`tiles` tiles of n inputs, each loaded then multiplied into its own accumulators. With one
    thread the input buffer is reused, so a tile's load waits (a compute->load token) until the
    previous tile's GEMM has read it; with two, tiles alternate between two halves of the buffer
    and a load waits only for the GEMM two tiles back: VTA's virtual threads."""
    dram = Dram()
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (tiles * n, 1, 16), dtype=np.int8)
    w = rng.integers(-128, 128, (1, 16, 16), dtype=np.int8)
    ia, wa = dram.put(a), dram.put(w)
    ua, nu = uops(dram, [t * n for t in range(tiles)], [(t % threads) * n for t in range(tiles)], [0] * tiles)
    s = [load(Mem.WGT, 0, wa, 256, 1, 1, deps=PUSH_L2G), load(Mem.UOP, 0, ua, 4, 1, nu, deps=POP_L2G)]
    for t in range(tiles):
        s.append(
            load(
                Mem.INP, (t % threads) * n, ia + t * n * 16, 16, 1, n, deps=Deps(pop_next=t >= threads, push_next=True)
            )
        )
        s.append(GemmInsn(t, t + 1, n, 1, dst_factor_out=1, src_factor_out=1, reset=True, deps=POP_L2G))
        s.append(GemmInsn(t, t + 1, n, 1, dst_factor_out=1, src_factor_out=1, deps=Deps(push_prev=True)))
    drain = min(threads, tiles)  # the last GEMMs' tokens: popped by load NOPs, the last handing over to FINISH
    s += [
        MemInsn(Opcode.LOAD, Mem.INP, 0, 0, 0, 0, 0, deps=Deps(pop_next=True, push_next=k == drain - 1))
        for k in range(drain)
    ]
    s.append(FinishInsn(deps=POP_L2G))
    sim = Simulator(CFG)
    stats = sim.run(s, dram)
    expect = a[:, 0].astype(np.int64) @ w[0].astype(np.int64).T
    assert np.array_equal(sim.acc[: tiles * n, 0], expect)
    return stats


def test_two_virtual_threads_hide_the_loads_behind_compute():
    one, two = _tiles(1), _tiles(2)
    # the same work (two NOPs drain the two threads' tokens where one does for one thread)
    assert one.busy["compute"] == two.busy["compute"] and one.busy["load"] == two.busy["load"] - 1
    assert one.cycles >= one.busy["load"] + one.busy["compute"] - 2 * 16  # one module waits for the other
    assert two.cycles < 0.75 * one.cycles, (one.cycles, two.cycles)
