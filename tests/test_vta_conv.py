"""Packed conv2d compiled to VTA instructions: every resnet18 workload of the recipe, under
several knob configs, bit-exact with numpy on the simulator; the knob space pruned by VTA's
buffers; the cycle model's answer to the knobs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vta_pipeline.vta import conv
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.conv import ConvWorkload, Epilogue, KnobError, Knobs
from vta_pipeline.vta.simulator import CycleModel, Dram, Simulator

CFG = VTAConfig()
# The recipe's resnet18 conv workloads (the packed region: the stem stays on the CPU)
RESNET18 = [
    ConvWorkload(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1),
    ConvWorkload(1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
    ConvWorkload(1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2),
    ConvWorkload(1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
    ConvWorkload(1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2),
    ConvWorkload(1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
    ConvWorkload(1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1),
    ConvWorkload(1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
    ConvWorkload(1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2),
    ConvWorkload(1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
]
# what our quantize pass fuses after a resnet18 conv: bias, residual, requantize, ReLU
EPILOGUE = Epilogue(bias=True, residual_shift=1, round_add=1 << 8, shift=9, clip_min=0, clip_max=127)


def tensors(wl: ConvWorkload, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cib, cob = wl.in_filter // 16, wl.out_filter // 16

    def i8(*shape):
        return rng.integers(-127, 128, shape).astype(np.int8)

    return {
        "data": i8(1, cib, wl.height, wl.width, 1, 16),
        "kernel": i8(cob, cib, wl.kh, wl.kw, 16, 16),
        "bias": rng.integers(-4000, 4000, (1, cob, 1, 1, 1, 16)).astype(np.int32),
        "residual": i8(1, cob, wl.out_height, wl.out_width, 1, 16),
    }


def simulate(wl: ConvWorkload, k: Knobs, epi: Epilogue = EPILOGUE, seed: int = 0):
    dram, sim = Dram(), Simulator(CFG)
    prog = conv.compile_conv(wl, k, epi, CFG, dram)
    t = tensors(wl, seed)
    out, stats = conv.run_conv(prog, dram, sim, t)
    return out, stats, conv.reference(wl, epi, t["data"], t["kernel"], t["bias"], t["residual"])


def _configs(wl: ConvWorkload) -> list[Knobs]:
    """Three configs of the space: the largest one-thread tile, a two-thread one, a random one
    that splits the reduction (all with tiles of 7+ pixels: the simulation stays quick)."""
    space = [k for k in conv.knob_space(wl, CFG, EPILOGUE) if k.tile_h * k.tile_w >= 7]
    one = max((k for k in space if k.h_nthread * k.oc_nthread == 1), key=lambda k: k.tile_h * k.tile_w * k.tile_co)
    two = max((k for k in space if k.h_nthread * k.oc_nthread == 2), key=lambda k: k.tile_h * k.tile_w * k.tile_ci)
    split = [k for k in space if k.tile_ci < wl.in_filter // 16]
    rng = np.random.default_rng(hash((wl.height, wl.in_filter, wl.out_filter, wl.kh, wl.stride_h)) % 2**32)
    return [one, two, split[int(rng.integers(len(split)))]]


@pytest.mark.parametrize("wl", RESNET18, ids=lambda w: f"{w.height}x{w.in_filter}-{w.out_filter}k{w.kh}s{w.stride_h}")
def test_each_resnet18_workload_is_bit_exact_under_several_configs(wl):
    for k in _configs(wl):
        out, stats, ref = simulate(wl, k)
        assert np.array_equal(out, ref), k
        residual = wl.out_filter // 16 * wl.out_height * wl.out_width  # one identity GEMM per output entry
        assert (stats.gemm_uops - residual) * 2 * 16 * 16 == wl.ops()  # every multiply-add once, none twice
    assert np.abs(ref.astype(int)).max() > 0 and (ref == 127).any()  # the clip was exercised


def test_the_untuned_config_is_the_smallest_tile_the_gemm_can_run_and_also_exact():
    """AutoTVM's fallback (one accumulator per tile) breaks VerifyDep; the untuned config grows
    the tile to three accumulators: along a row where it is that wide, else over channel blocks."""
    wl = ConvWorkload(1, 7, 7, 32, 32, 3, 3, 1, 1, 1, 1)
    assert conv.default_knobs(wl, CFG) == Knobs(tile_w=7)  # 7 has no divisor 3..6
    out, _, ref = simulate(wl, conv.default_knobs(wl, CFG))
    assert np.array_equal(out, ref)
    assert conv.default_knobs(RESNET18[0], CFG) == Knobs(tile_w=4)
    assert conv.default_knobs(RESNET18[-1], CFG) == Knobs(tile_co=4)  # fewer accumulators than a row of 7
    with pytest.raises(KnobError, match=r"a tile of 1 accumulator\(s\): the pipelined GEMM needs 3"):
        conv.default_knobs(ConvWorkload(1, 1, 1, 16, 16, 1, 1, 0, 0, 1, 1), CFG)


def test_an_epilogue_without_bias_or_residual_a_left_shifted_residual_and_a_second_rounding_shift():
    wl = ConvWorkload(1, 14, 14, 32, 32, 1, 1, 0, 0, 1, 1)
    k = Knobs(1, 7, 14, 2, 1, 1, 2)
    for epi in (
        Epilogue(bias=False, shift=4, round_add=8),
        Epilogue(residual_shift=-2, shift=6, round_add=32),
        Epilogue(residual_shift=6, shift=6, round_add=32, post_round_add=2, post_shift=2, clip_min=0),
    ):
        out, _, ref = simulate(wl, k, epi)
        assert np.array_equal(out, ref), epi


def test_the_knob_space_holds_only_configs_that_fit_vtas_buffers():
    wl = RESNET18[0]
    space = conv.knob_space(wl, CFG, EPILOGUE)
    assert len(space) > 100 and len(set(space)) == len(space)
    for k in space:
        threads = k.h_nthread * k.oc_nthread
        assert k.tile_ci * ((k.tile_h - 1) + 3) * ((k.tile_w - 1) + 3) * threads <= 2048  # input buffer
        assert k.tile_co * k.tile_ci * 9 * threads <= 1024  # weights
    with pytest.raises(
        KnobError,
        match=r"the input tiles need \d+ entries \(2 thread\(s\)\), more than the input "
        r"buffer's 2048",
    ):
        conv.check(wl, Knobs(1, 28, 56, 1, 1, 2, 1), EPILOGUE, CFG)
    with pytest.raises(KnobError, match=r"tile_w: 5 \(with its threads\) does not divide the extent 56"):
        conv.check(wl, Knobs(1, 1, 5, 1, 1, 1, 1), EPILOGUE, CFG)


def test_the_cycle_model_answers_to_work_and_to_virtual_threads():
    wl = ConvWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, 1, 1)
    wide = ConvWorkload(1, 14, 14, 64, 128, 3, 3, 1, 1, 1, 1)  # twice the output channels
    k = Knobs(1, 7, 14, 1, 2, 1, 1)
    assert simulate(wide, k)[1].cycles > 1.5 * simulate(wl, k)[1].cycles
    one = simulate(wl, k)[1]
    two = simulate(wl, Knobs(1, 7, 14, 1, 1, 1, 2))[1]  # the same tile work, two threads over channels
    assert two.cycles < one.cycles
    assert conv.describe(two, wl, CFG, CycleModel())["of_peak"] < 1


def test_the_compiler_emits_in_program_order_so_in_order_dispatch_never_overflows_a_queue():
    """VTA's fetch dispatches in program order into 512-entry command queues. The untuned 1x1
    conv (one output pixel per tile) has thousands of loads: emitted all before the compute
    that frees their buffers, as the compiler once did, they fill the load queue and the
    compute instructions are never fetched; in program order the same instructions run, with
    the same cycles as VTA's functional simulator gives them."""
    from vta_pipeline.vta.isa import Core, core_of
    from vta_pipeline.vta.simulator import STRICT, DeadlockError

    wl = RESNET18[2]  # 56x56, 64 -> 128, 1x1 stride 2
    plain = Epilogue(bias=True, round_add=1 << 8, shift=9, clip_min=0, clip_max=127)
    dram = Dram()
    prog = conv.compile_conv(wl, conv.default_knobs(wl, CFG, plain), plain, CFG, dram)
    loads = [i for i in prog.instructions if core_of(i) == Core.LOAD]
    assert len(loads) > STRICT.cmd_queue_depth
    strict = Simulator(CFG, functional=False, rules=STRICT).run(prog.instructions, dram)
    assert strict.cycles == Simulator(CFG, functional=False).run(prog.instructions, dram).cycles
    by_module = [[i for i in prog.instructions[:-1] if core_of(i) == c] for c in (Core.LOAD, Core.COMPUTE, Core.STORE)]
    split = [*by_module[0], *by_module[1], *by_module[2], prog.instructions[-1]]
    with pytest.raises(DeadlockError, match="waits for room in the load command queue"):
        Simulator(CFG, functional=False, rules=STRICT).run(split, dram)


@pytest.mark.parametrize(
    "knobs, fold",
    [
        (Knobs(tile_h=2, tile_w=4, tile_ci=2, tile_co=2), 0),  # rows of 4: the columns keep writes apart
        (Knobs(tile_h=4, tile_w=1, tile_ci=2, tile_co=1), 1),  # one column: the micro-ops take in the rows
        (Knobs(tile_h=1, tile_w=1, tile_ci=1, tile_co=4), 2),  # one pixel: and the channel blocks
    ],
)
def test_narrow_tiles_fold_loops_into_the_micro_ops_so_no_gemm_writes_an_accumulator_twice_in_a_row(knobs, fold):
    """VerifyDep: the pipelined GEMM must not write an accumulator either of the two micro-ops
    before it wrote. A tile narrower than 3 columns takes its rows (and, narrower still, its
    channel blocks) into its micro-ops; the stream then keeps the rule, bit-exact as before."""
    from vta_pipeline.vta.simulator import STRICT

    wl = ConvWorkload(1, 8, 8, 32, 64, 3, 3, 1, 1, 1, 1)
    assert conv.gemm_fold(knobs) == fold
    out, _, ref = simulate(wl, knobs, Epilogue(bias=True, round_add=1 << 8, shift=9, clip_min=0, clip_max=127))
    assert np.array_equal(out, ref)
    plain = Epilogue(bias=True, round_add=1 << 8, shift=9, clip_min=0, clip_max=127)
    dram = Dram()
    prog = conv.compile_conv(wl, knobs, plain, CFG, dram)
    Simulator(CFG, functional=False, rules=STRICT).run(prog.instructions, dram)


def test_a_tile_of_fewer_than_three_accumulators_is_pruned_because_its_gemm_cannot_keep_verifydep():
    wl = ConvWorkload(1, 8, 8, 32, 64, 3, 3, 1, 1, 1, 1)
    space = conv.knob_space(wl, CFG, EPILOGUE)
    assert space and min(k.tile_co * k.tile_h * k.tile_w for k in space) == 4  # 8 and 4 blocks: no 3
    with pytest.raises(KnobError, match=r"a tile of 2 accumulator\(s\).*VerifyDep"):
        conv.check(wl, Knobs(tile_h=1, tile_w=2, tile_co=1), EPILOGUE, CFG)


def test_more_micro_ops_than_the_chisel_designs_memory_are_pruned():
    """The HLS design's micro-op buffer holds 8192 (32 KiB), the Chisel design's 2048: a stream
    both designs run keeps to the smaller."""
    wl = ConvWorkload(1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1)
    k = Knobs(tile_h=1, tile_w=14, tile_ci=16, tile_co=1)  # 16 x 9 x 14 = 2016 GEMM micro-ops + 5
    with pytest.raises(KnobError, match=r"4042 micro-ops, more than the 2048"):
        conv.check(wl, replace(k, oc_nthread=2), EPILOGUE, CFG)
    conv.check(wl, k, EPILOGUE, CFG)
    assert all(
        (k.h_nthread * k.oc_nthread) * (conv.gemm_uops(wl, k) + conv.GEMM_UOP) <= 2048
        for k in conv.knob_space(wl, CFG, EPILOGUE)
    )


def test_shift_immediates_outside_the_alus_range_are_refused_before_compiling():
    wl = ConvWorkload(1, 8, 8, 32, 64, 3, 3, 1, 1, 1, 1)
    with pytest.raises(KnobError, match=r"shift 16: the ALU's shift immediate holds \[-16, 15\]"):
        conv.check(wl, Knobs(tile_w=8), Epilogue(shift=16), CFG)
    with pytest.raises(KnobError, match=r"residual_shift 17"):
        conv.check(wl, Knobs(tile_w=8), Epilogue(residual_shift=-17), CFG)


def _torch_conv(wl: ConvWorkload, epi: Epilogue, data, weight_oihw, bias):
    """An independent reference: torch's grouped conv2d in float64 (exact for these sums), then the
    epilogue, packed back into VTA's layout."""
    import torch

    cin, cout = wl.in_filter, wl.out_filter
    x = torch.tensor(data.transpose(0, 4, 1, 5, 2, 3).reshape(1, cin, wl.height, wl.width), dtype=torch.float64)
    acc = torch.nn.functional.conv2d(
        x, torch.tensor(weight_oihw, dtype=torch.float64), stride=wl.stride_h, padding=wl.pad_h, groups=wl.groups
    ).numpy()
    acc = acc.astype(np.int64).reshape(1, cout // 16, 16, wl.out_height, wl.out_width).transpose(0, 1, 3, 4, 2)
    acc = acc[:, :, :, :, None, :] + bias
    return np.clip((acc + epi.round_add) >> epi.shift, epi.clip_min, epi.clip_max).astype(np.int8)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_conv_runs_as_gemms_against_diagonal_weight_tiles_bit_exact(stride):
    """VTA's GEMM has no per-channel product: each output block multiplies its own input block by
    a diagonal tile per tap (mobilenet_v2's depthwise convs, packed by graph pack as OIHW16o)."""
    wl = ConvWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, stride, stride, groups=64)
    epi = Epilogue(bias=True, round_add=1 << 7, shift=8, clip_min=0, clip_max=127)
    rng = np.random.default_rng(stride)
    data = rng.integers(-127, 128, (1, 4, 14, 14, 1, 16)).astype(np.int8)
    dw = rng.integers(-127, 128, (4, 1, 3, 3, 16)).astype(np.int8)  # OIHW16o
    bias = rng.integers(-3000, 3000, (1, 4, 1, 1, 1, 16)).astype(np.int32)
    ref = _torch_conv(wl, epi, data, dw.transpose(0, 4, 1, 2, 3).reshape(64, 1, 3, 3), bias)
    space = conv.knob_space(wl, CFG, epi)
    assert space and all(k.tile_ci == 1 and k.tile_co == 1 for k in space)  # one block a group
    for k in [conv.default_knobs(wl, CFG, epi), space[len(space) // 2], space[-1]]:
        dram = Dram()
        prog = conv.compile_conv(wl, k, epi, CFG, dram)
        t = {"data": data, "kernel": conv.depthwise_weights(dw), "bias": bias}
        out, stats = conv.run_conv(prog, dram, Simulator(CFG), t)
        assert np.array_equal(out, ref), k
        assert stats.gemm_uops * 2 * 16 * 16 == wl.ops() * 16  # each block's 16 products, 15 of them zero


def test_a_grouped_conv_whose_groups_hold_whole_blocks_is_bit_exact_and_other_groups_are_refused():
    wl = ConvWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, 1, 1, groups=2)  # 32 channels: 2 blocks a group
    epi = Epilogue(bias=True, round_add=1 << 7, shift=8, clip_min=0, clip_max=127)
    rng = np.random.default_rng(0)
    data = rng.integers(-127, 128, (1, 4, 14, 14, 1, 16)).astype(np.int8)
    kernel = rng.integers(-127, 128, (4, 2, 3, 3, 16, 16)).astype(np.int8)  # a group's 2 input blocks
    bias = rng.integers(-3000, 3000, (1, 4, 1, 1, 1, 16)).astype(np.int32)
    ref = _torch_conv(wl, epi, data, kernel.transpose(0, 4, 1, 5, 2, 3).reshape(64, 32, 3, 3), bias)
    space = conv.knob_space(wl, CFG, epi)
    assert {k.tile_ci for k in space} == {1, 2} and {k.tile_co for k in space} == {1, 2}  # within a group
    for k in space[:: max(len(space) // 6, 1)]:
        dram = Dram()
        prog = conv.compile_conv(wl, k, epi, CFG, dram)
        out, _ = conv.run_conv(prog, dram, Simulator(CFG), {"data": data, "kernel": kernel, "bias": bias})
        assert np.array_equal(out, ref), k
    with pytest.raises(KnobError, match=r"groups=8 over 64 -> 64 channels: VTA runs grouped convs whose groups hold"):
        conv.check(ConvWorkload(1, 14, 14, 64, 64, 3, 3, 1, 1, 1, 1, groups=8), Knobs(tile_w=7), epi, CFG)
