"""The design space of a Winograd conv task (`passes/winograd.py`) on CPUs.

MetaSchedule's generic space tiles each of the conv's five reduction blocks on its own and
never unrolls a transform's constant matrix, so its candidates evaluate TVM's `Select`
chains of the matrices at run time, slower than the direct packed kernel even after a long
search (docs/performance.md, "Winograd for the 3x3 convs"). This space fixes what is known
and samples only the GEMM's register tile:

    transforms: parallel over (tile, channel chunk); the 6 x 6 (F(2x2): 4 x 4) tile's two 1-D passes
      unrolled, the channel lanes vectorized, the tile kept in registers/L1 (`local`)
    GEMM, parallel over (e, n), then per oc_tile chunks and block of px tiles: for k: px
      tiles x oc_tile chunks of the output lanes, unrolled, accumulated in registers (a cache
      write), vectorized on the lanes
    inverse: parallel over (output chunk, tile row); per tile its two 1-D passes unrolled,
      the epilogue (bias, residual add, ReLU) fused into the write-back

Knobs (MetaSchedule sampling decisions, so records replay them and the search mutates
them): the tiles per GEMM block (`px`, a divisor of the tile count up to MAX_PX) and the
output chunks per block (`oc_tile`, up to MAX_OC_TILE), the shape that decides how many
accumulators the GEMM keeps (px x oc_tile vectors; which is fastest depends on the shape).

The GEMM's loop order is not a knob: weight-major ((e, n) outermost) reads each 6 x 6
slice of the transformed weights once, where tile-major (tile blocks outermost, each
sweeping all of U) reads U once per block. The tuner times a kernel with warm caches, where
the two are close, but in the network U comes from memory, where weight-major is the faster
on every shape measured, and warm it is as fast or faster (the measurements: docs/performance.md).

Version 3 stores U as the GEMM reads it (`RewriteLayout`: [(e, n), oc block, k, oc lanes], where
TOPI's [e, n, k, oc] gave each block of output channels 128 B of every 1 KB row) and prefetches
the next oc block's run of it over the tile blocks of this one (`weight_prefetch`): with U
evicted, as the network evicts it, both made the kernel faster (docs/performance.md).
"""

from __future__ import annotations

from typing import Any

from ..passes import winograd as wg
from ..tir import weight_prefetch
from .common import fuse_epilogue

# 2: the GEMM weight-major (a task tuned in version 1's space searches again); 3: the transformed
# weights laid out as the GEMM reads them, and its next block prefetched
VERSION = 3
MAX_PX = 8
MAX_OC_TILE = 4


def applies(workload: Any, target: Any) -> bool:
    """A CPU task with one Winograd conv (`passes.winograd`'s blocks)."""
    from tvm.s_tir import Schedule

    if target.kind.name != "llvm":
        return False
    sch = Schedule(workload)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    return all(names.count(n) == 1 for n in (wg.ROWS, wg.DATA, wg.GEMM, wg.COLS, wg.INVERSE))


def schedule(sch) -> None:
    """Apply the space to `sch` (a workload `applies` accepted), sampling its knobs."""
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):  # the constant matrices, the padding
        stmt = sch.get(block)
        if not stmt.reads or stmt.name_hint == wg.PAD:
            sch.compute_inline(block)
    inverse = sch.get_sblock(wg.INVERSE)
    lanes = int(sch.get(inverse).writes[0].source.shape[-1])
    _schedule_data(sch, lanes)
    _schedule_gemm(sch, lanes)
    _schedule_inverse(sch, inverse)


def _schedule_pass(sch, block) -> None:
    """A transform's first 1-D pass (`winograd_rows`, `winograd_cols`), computed at its tile:
    its (e, dx, lane, tap) loops become e, dx, tap unrolled around the lanes vectorized."""
    *_, e, dx, lane, tap = sch.get_loops(block)
    sch.reorder(e, dx, tap, lane)
    for loop in (e, dx, tap):
        sch.unroll(loop)
    sch.vectorize(lane)
    sch.decompose_reduction(block, tap)


def _schedule_data(sch, lanes: int) -> None:
    data, rows = sch.get_sblock(wg.DATA), sch.get_sblock(wg.ROWS)
    p, e, n, ci, r_b = sch.get_loops(data)
    chunk, lane = sch.split(ci, [None, lanes])
    sch.reorder(p, chunk, e, n, r_b, lane)
    outer = sch.fuse(p, chunk)
    sch.parallel(outer)
    write = sch.cache_write(data, 0, "local")
    sch.reverse_compute_at(write, outer)
    sch.compute_at(rows, outer)
    sch.set_scope(rows, 0, "local")
    _schedule_pass(sch, rows)
    for loop in (e, n, r_b):
        sch.unroll(loop)
    sch.vectorize(lane)
    sch.decompose_reduction(data, e)
    _, w_e, w_n, w_lane = sch.get_loops(write)
    sch.unroll(w_e)
    sch.unroll(w_n)
    sch.vectorize(w_lane)


def _schedule_gemm(sch, lanes: int) -> None:
    gemm = sch.get_sblock(wg.GEMM)
    p, e, n, co, k = sch.get_loops(gemm)
    p_o, p_i = sch.split(p, sch.sample_perfect_tile(p, n=2, max_innermost_factor=MAX_PX))
    chunks, lane = sch.split(co, [None, lanes])
    c_o, c_i = sch.split(chunks, sch.sample_perfect_tile(chunks, n=2, max_innermost_factor=MAX_OC_TILE))
    sch.reorder(e, n, c_o, p_o, k, p_i, c_i, lane)  # weight-major: each slice of U is read once
    sch.parallel(sch.fuse(e, n))
    acc = sch.cache_write(gemm, 0, "local")
    # unit loops kept: a candidate's trace replays with other tile sizes, and its loop count must not change
    sch.reverse_compute_at(acc, p_o, preserve_unit_loops=True)
    sch.unroll(p_i)
    sch.unroll(c_i)
    sch.vectorize(lane)
    sch.decompose_reduction(gemm, k)
    sch.annotate(p_o, weight_prefetch.ANNOTATION, 1)  # the next oc block's weights, over the tile blocks
    *_, acc_p, _, _, acc_co = sch.get_loops(acc)
    sch.unroll(acc_p)
    sch.vectorize(acc_co)


def _schedule_inverse(sch, inverse) -> None:
    write = sch.cache_write(inverse, 0, "local")
    fuse_epilogue(sch, write)
    b_o, c_o, y, x, b_i, lane, r_d = sch.get_loops(inverse)
    cols = sch.get_sblock(wg.COLS)
    tile = int(sch.get(cols).writes[0].source.shape[2])  # (tiles, alpha, tile, oc): F(tile x tile, 3x3)
    y_o, y_i = sch.split(y, [None, tile])
    x_o, x_i = sch.split(x, [None, tile])
    sch.reorder(b_o, c_o, y_o, x_o, b_i, y_i, x_i, r_d, lane)
    outer = sch.fuse(b_o, c_o, y_o)
    sch.parallel(outer)
    sch.reverse_compute_at(write, x_o, preserve_unit_loops=True)
    sch.compute_at(cols, x_o)
    sch.set_scope(cols, 0, "local")
    _schedule_pass(sch, cols)
    for loop in (b_i, y_i, x_i, r_d):
        sch.unroll(loop)
    sch.vectorize(lane)
    sch.decompose_reduction(inverse, y_i)
    *_, w_y, w_x, w_b, w_lane = sch.get_loops(write)
    for loop in (w_y, w_x, w_b):
        sch.unroll(loop)
    sch.vectorize(w_lane)


def space_generator() -> Any:
    """MetaSchedule's space generator for a Winograd task."""
    from tvm.s_tir import meta_schedule as ms

    def design_spaces(sch):
        schedule(sch)
        return [sch]

    # RewriteLayout: U stored as the GEMM reads it, [(e, n), oc block, k, oc lanes], so each block
    # of output channels reads one contiguous run (TOPI's order [e, n, k, oc] gave it 128 B of
    # every 1 KB row), and the prefetch of the next block is one run too
    postprocs = [ms.postproc.DisallowDynamicLoop(), ms.postproc.RewriteReductionBlock(), ms.postproc.RewriteLayout()]
    return ms.space_generator.ScheduleFn(
        design_spaces, sch_rules=[], postprocs=postprocs, mutator_probs={ms.mutator.MutateTileSize(): 1.0}
    )
