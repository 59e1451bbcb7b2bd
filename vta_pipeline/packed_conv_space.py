"""A small, expert design space for packed float convolutions on CPUs (NeoCPU's schedule).

MetaSchedule's generic space for a conv (multi-level tiling of all ten loops, random compute
locations, random unrolling) holds the fast schedules, but they are rare in it: at the
budgets a night gives each task (tens of trials), the search measured schedules 3-10x
slower than ONNX Runtime on the same conv. The direct NCHW[x]c convolution of the NeoCPU
paper (Liu et al., USENIX ATC 2019; Relay's x86 `conv2d_NCHWc` schedule) is known to reach
vendor-library speed with a handful of knobs, so for packed fp32 conv tasks we search only
its space:

    parallel over (batch block, output-channel chunks, output rows)
      for ow_outer:                               # a register tile of the output
        for ic_chunk, kh, kw, ic_lane:            # the reduction, innermost lanes of input
          for oh_inner, ow_inner, oc_chunk_inner: # unrolled: reg_h x reg_n x oc_tile accumulators
            for oc_lane:                          # vectorized: the packed block (16 floats)
              acc[...] += data[...] * weight[...]
      epilogue (bias, residual add, ReLU) applied to the tile while it is in registers

Knobs, each a MetaSchedule sampling decision (so the evolutionary search mutates them and a
record replays them): how many output-channel chunks one tile computes (`oc_tile`, 1-4), the
tile's output width (`reg_n`, a divisor of the width up to 8) and height (`reg_h`, up to 4),
and the unroll depth of the whole nest (0-512, as MetaSchedule's own rule samples it). Weights
are constants marked layout-free: `RewriteLayout` stores them in the order this nest reads
them ([oc_chunk, ic_chunk, kh, kw, ic_lane, oc_tile, oc_lane]), once, at build time.

What it applies to (`matches`): a task whose one reduction block is VTA's `conv2d_packed`
compute (data `N/b, C/c, H, W, b, c`, weights `O/c, I/c, kh, kw, c, c`) in float32, which
graph pack produces when it packs a float network. Everything else keeps MetaSchedule's
generic space.
"""

from __future__ import annotations

from typing import Any

from .passes.packed_ops import PACKED_CONV

MAX_REG_N = 8      # output columns per register tile
MAX_REG_H = 4      # output rows per register tile
MAX_OC_TILE = 4    # packed output-channel chunks per register tile
UNROLL_STEPS = [0, 16, 64, 512]  # MetaSchedule's CPU choices for auto-unroll


def _conv_block(sch) -> Any | None:
    """The workload's packed conv block, if it has exactly one and it is float."""
    found = [b for b in sch.get_child_blocks(sch.get_sblock("root"))
             if sch.get(b).name_hint == PACKED_CONV]
    if len(found) != 1:
        return None
    block = sch.get(found[0])
    if len(block.iter_vars) != 10 or not str(block.writes[0].source.dtype).startswith("float"):
        return None
    return found[0]


def matches(workload: Any) -> bool:
    """Is this task a float packed conv (the space below applies)?"""
    from tvm.s_tir import Schedule

    return _conv_block(Schedule(workload)) is not None


def schedule(sch) -> None:
    """Apply the space's schedule to `sch` (a workload `matches` accepted), sampling its knobs."""
    conv = _conv_block(sch)
    b_o, c_o, oh, ow, b_i, c_i, k_o, d_i, d_j, k_i = sch.get_loops(conv)

    oc_split = sch.sample_perfect_tile(c_o, n=2, max_innermost_factor=MAX_OC_TILE)
    h_split = sch.sample_perfect_tile(oh, n=2, max_innermost_factor=MAX_REG_H)
    w_split = sch.sample_perfect_tile(ow, n=2, max_innermost_factor=MAX_REG_N)
    c_o_o, c_o_i = sch.split(c_o, oc_split)
    oh_o, oh_i = sch.split(oh, h_split)
    ow_o, ow_i = sch.split(ow, w_split)
    sch.reorder(b_o, c_o_o, oh_o, ow_o, k_o, d_i, d_j, k_i, oh_i, ow_i, c_o_i, b_i, c_i)
    outer = sch.fuse(b_o, c_o_o, oh_o)
    sch.parallel(outer)
    sch.vectorize(c_i)  # before the reduction is split up: TIR checks its dataflow here
    for loop in (oh_i, ow_i, c_o_i):  # the tile's accumulators live in registers
        sch.unroll(loop)
    _schedule_producers(sch, conv)

    # Accumulate the tile in a local buffer (registers once unrolled), then write it out
    # through the epilogue in the same pass over the tile.
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, ow_o, preserve_unit_loops=True)
    _fuse_epilogue(sch, acc)

    init = sch.decompose_reduction(conv, k_o)
    for block in (init, acc):
        sch.vectorize(sch.get_loops(block)[-1])

    unroll = sch.sample_categorical(UNROLL_STEPS, probs=[0.25] * 4)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", unroll)


def _fuse_epilogue(sch, acc) -> None:
    """Fold the elementwise blocks after the conv (bias add, residual add, ReLU) into the
    tile's write-back, so the conv's output never goes to memory before them."""
    while True:
        consumers = sch.get_consumers(acc)
        if len(consumers) != 1:
            return
        try:
            sch.reverse_compute_inline(consumers[0])
        except Exception:  # noqa: BLE001 - not elementwise in the tile's indices: leave it be
            return


def _schedule_producers(sch, conv) -> None:
    """The padding block (and any other producer at the root) runs in parallel over its
    outer loops, vectorized over the packed lanes."""
    for producer in sch.get_producers(conv):
        loops = sch.get_loops(producer)
        if len(loops) < 3:
            continue
        sch.parallel(sch.fuse(*loops[:3]))
        sch.vectorize(loops[-1])


def vector_registers(target: Any) -> tuple[int, int]:
    """(float lanes per vector register, vector registers) of a CPU target: what bounds a
    register tile. AVX-512 (x86 CPUs whose LLVM name implies it): 16 x 32; other x86: AVX2's
    8 x 16; ARM: NEON's 4 x 32."""
    mcpu = str(target.attrs.get("mcpu", "")) if "mcpu" in target.attrs else ""
    triple = str(target.attrs.get("mtriple", "")) if "mtriple" in target.attrs else ""
    if triple.startswith(("arm", "aarch64")):
        return 4, 32
    if any(k in mcpu for k in AVX512_CPUS):
        return 16, 32
    return 8, 16


# LLVM CPU names with AVX-512F (Intel since Skylake-SP, AMD since Zen 4).
AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake", "tigerlake",
               "sapphirerapids", "emeraldrapids", "graniterapids", "alderlake-avx512", "rocketlake",
               "znver4", "znver5", "x86-64-v4")


def tile_floats(sch) -> int:
    """Accumulators of the conv's register tile: the extents of the loops inside its
    reduction (oh_inner, ow_inner, oc_chunk_inner, batch lane, oc lane) multiplied."""
    conv = next(b for b in _blocks(sch) if sch.get(b).name_hint == PACKED_CONV + "_update")
    n = 1
    for loop in sch.get_loops(conv)[-TILE_LOOPS:]:
        n *= int(sch.get(loop).extent)
    return n


TILE_LOOPS = 5


def _blocks(sch) -> list:
    out, todo = [], [sch.get_sblock("root")]
    while todo:
        block = todo.pop()
        out.append(block)
        todo.extend(sch.get_child_blocks(block))
    return out[1:]


def register_limit(target: Any) -> Any:
    """A postprocessor that rejects candidates whose register tile cannot fit the target's
    vector registers (two kept for a weight vector and the broadcast input): MetaSchedule
    then samples another, instead of measuring a tile that spills to the stack."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc

    lanes, regs = vector_registers(target)
    limit = lanes * (regs - 2)

    @derived_object
    class RegisterLimit(PyPostproc):
        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            return tile_floats(sch) <= limit

        def clone(self):
            return register_limit(target)

    return RegisterLimit()


def space_generator(target: Any) -> Any:
    """MetaSchedule's space generator for a task `matches` accepted."""
    from tvm.s_tir import meta_schedule as ms

    postprocs = [
        register_limit(target),
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),  # realizes the sampled unroll depth
        ms.postproc.RewriteReductionBlock(),
        ms.postproc.RewriteLayout(),
    ]
    mutators = {ms.mutator.MutateTileSize(): 0.8, ms.mutator.MutateUnroll(): 0.2}
    return ms.space_generator.ScheduleFn(schedule, sch_rules=[], postprocs=postprocs, mutator_probs=mutators)
