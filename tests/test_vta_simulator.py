"""The VTA simulator on hand-written instruction streams: what each instruction computes, the
errors VTA's own simulator leaves silent, and the cycle model's sanity."""

from __future__ import annotations

import numpy as np
import pytest

from vta_pipeline.vta import isa
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.isa import AluInsn, AluOp, Deps, FinishInsn, GemmInsn, Mem, MemInsn, Opcode
from vta_pipeline.vta.simulator import FSIM, STRICT, DeadlockError, Dram, HardwareRuleError, Simulator, StreamError

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


# ---- the hardware's rules (strict mode) ----------------------------------------------------------------
def test_a_legal_stream_runs_the_same_under_the_hardwares_rules():
    dram = Dram()
    stream, out, a, w = matmul_stream(dram, 4)
    fsim = Simulator(CFG, rules=FSIM).run(_sync_store(stream), dram)
    first = dram.get(out, np.int8, (4, 16))
    strict = Simulator(CFG, rules=STRICT).run(_sync_store(stream), dram)
    assert np.array_equal(dram.get(out, np.int8, (4, 16)), first) and strict.cycles == fsim.cycles


def _run_ahead_stream(n: int) -> list:
    """n input loads, each waiting for a token that a compute NOP after all of them pushes."""
    loads = [load(Mem.INP, 0, 0, 16, 1, 1, deps=Deps(pop_next=True)) for _ in range(n)]
    loads[-1] = _with(loads[-1], push_next=True)
    nops = [MemInsn(Opcode.LOAD, Mem.UOP, 0, 0, 0, 0, 0, deps=Deps(push_prev=True)) for _ in range(n)]
    return [*loads, *nops, FinishInsn(deps=Deps(pop_prev=True))]


def test_a_stream_needing_more_run_ahead_than_a_command_queue_holds_deadlocks_in_order_dispatch():
    """VTA's fetch module dispatches in program order into 512-entry command queues: 600 loads
    that wait on compute instructions placed after them fill the load queue, and the compute
    instructions are never fetched. fsim, which splits the stream up front, runs it."""
    Simulator(CFG, rules=FSIM).run(_run_ahead_stream(600), Dram())
    Simulator(CFG, rules=STRICT).run(_run_ahead_stream(500), Dram())  # fits the queue
    with pytest.raises(
        DeadlockError,
        match=r"fetch module at instruction 512 \(LOAD INP\) waits for room in the load command queue, full with 512",
    ):
        Simulator(CFG, rules=STRICT).run(_run_ahead_stream(600), Dram())


def test_an_acc_8bit_load_runs_on_fsim_only():
    dram = Dram()
    addr = dram.put(np.arange(16, dtype=np.int8))
    stream = [load(Mem.ACC_8BIT, 0, addr, 16, 1, 1), FinishInsn()]
    Simulator(CFG, rules=FSIM).run(stream, dram)
    with pytest.raises(
        HardwareRuleError, match=r"instruction 0 \(LOAD ACC_8BIT\): the hardware designs have no ACC_8BIT load"
    ):
        Simulator(CFG, rules=STRICT).run(stream, dram)


@pytest.mark.parametrize("dsts, iters, apart", [([0], 3, 1), ([0, 1], 2, 2), ([0, 1, 2], 2, None)])
def test_a_gemm_writing_an_accumulator_one_of_the_two_micro_ops_before_wrote_is_refused(dsts, iters, apart):
    """The pipelined GEMM does not wait for its own write-back (VTA's runtime: VerifyDep)."""
    dram = Dram()
    rng = np.random.default_rng(1)
    ia = dram.put(rng.integers(-128, 128, (8, 1, 16), dtype=np.int8))
    wa = dram.put(rng.integers(-128, 128, (1, 16, 16), dtype=np.int8))
    n = len(dsts)
    ua, nu = uops(dram, dsts, list(range(n)), [0] * n)
    stream = [
        load(Mem.INP, 0, ia, 16, 1, 8),
        load(Mem.WGT, 0, wa, 256, 1, 1, deps=PUSH_L2G),
        load(Mem.UOP, 0, ua, 4, 1, nu, deps=POP_L2G),
        GemmInsn(0, nu, 1, 1, reset=True),
        GemmInsn(0, nu, iters, 1, src_factor_out=n),
        store(0, dram.alloc(16 * n), 1, n),
        FinishInsn(),
    ]
    Simulator(CFG, rules=FSIM).run(_sync_store(stream), dram)
    if apart is None:
        Simulator(CFG, rules=STRICT).run(_sync_store(stream), dram)
        return
    with pytest.raises(
        HardwareRuleError,
        match=rf"instruction 4 \(GEMM\): micro-op iteration {n} writes acc entry 0, which iteration 0 wrote {apart} micro-op",
    ):
        Simulator(CFG, rules=STRICT).run(_sync_store(stream), dram)


def test_a_shift_immediate_outside_the_hardwares_range_is_refused():
    dram = Dram()
    for imm, ok in ((15, True), (-16, True), (16, False), (-17, False)):
        shr = AluInsn(AluOp.SHR, 0, 1, 4, 1, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=imm)
        stream, _, _, _ = matmul_stream(dram, 4, [shr])
        if ok:
            Simulator(CFG, rules=STRICT).run(_sync_store(stream), dram)
        else:
            with pytest.raises(HardwareRuleError, match=rf"shift immediate {imm} outside the hardware's \[-16, 15\]"):
                Simulator(CFG, rules=STRICT).run(_sync_store(stream), dram)


def test_micro_ops_past_the_chisel_designs_memory_are_refused():
    dram = Dram()
    ua, _ = uops(dram, [0], [0], [0])
    stream = [load(Mem.UOP, 2048, ua, 4, 1, 1), AluInsn(AluOp.ADD, 2048, 2049, 1, 1, use_imm=True, imm=1), FinishInsn()]
    with pytest.raises(HardwareRuleError, match=r"micro-ops \[2048, 2049\) past the 2048"):
        Simulator(CFG, rules=STRICT).run(stream, dram)


def test_an_alu_reading_an_accumulator_nothing_wrote_is_refused_in_both_modes():
    """The second operand of an ALU instruction is checked too (it used to pass unchecked, and one
    past the buffer raised a bare IndexError the knob tuner did not catch)."""
    dram = Dram()
    ua, nu = uops(dram, [0], [8], [0])  # its source: acc 8.., which nothing wrote

    def with_add(src_factor_out: int) -> list:
        stream, _, _, _ = matmul_stream(dram, 4)
        add = AluInsn(AluOp.ADD, 1, 2, 4, 1, dst_factor_out=1, src_factor_out=src_factor_out)
        return _sync_store([*stream[:-2], load(Mem.UOP, 1, ua, 4, 1, nu), add, *stream[-2:]])

    for rules in (None, STRICT):
        with pytest.raises(StreamError, match=r"\(ALU ADD\) reads acc entry 8 before anything was loaded or computed"):
            Simulator(CFG, rules=rules).run(with_add(1), dram)
    with pytest.raises(StreamError, match=r"\(ALU ADD\) reads acc entry 3008, past the buffer's 2048"):
        Simulator(CFG).run(with_add(1000), dram)


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
    # the shorter module's time (here compute's) mostly hidden behind the longer one's
    assert one.cycles - two.cycles > 0.5 * min(one.busy["compute"], one.busy["load"]), (one.cycles, two.cycles)


def test_a_boards_sim_mode_sets_what_its_simulators_enforce():
    """`rpc_server --sim-mode fsim` (`board up --vta-sim --sim-mode fsim`): the board's programs run
    under fsim's rules only; strict, the default, under the hardware's."""
    from vta_pipeline.vta import runtime
    from vta_pipeline.vta.conv import ConvWorkload, Epilogue, Knobs
    from vta_pipeline.vta.runtime import ConvSpec
    from vta_pipeline.vta.simulator import SIM_MODES

    spec = ConvSpec(CFG.model_dump(), ConvWorkload(1, 8, 8, 16, 16, 1, 1, 0, 0, 1, 1), Epilogue(), Knobs(tile_w=8))
    assert runtime.rules() is STRICT and runtime._get(spec.to_json()).sim.rules is STRICT
    try:
        runtime.set_rules(SIM_MODES["fsim"])
        assert runtime._get(spec.to_json()).sim.rules is FSIM and runtime._get(spec.to_json()).timing.rules is FSIM
    finally:
        runtime.set_rules(STRICT)
    assert runtime._get(spec.to_json()).sim.rules is STRICT
