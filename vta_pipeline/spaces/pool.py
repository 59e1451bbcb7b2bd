"""A design space for a packed max pool on CPUs: each thread pools the rows its producer wrote.

resnet's max pool reads the stem conv's output, 112 x 112 x 64 floats (3.2 MB) in the packed
layout NCHW1n16c. The packed-conv space has each thread write one band of output rows
(`spaces.packed_conv`), so right after the stem conv each core holds its band in its own L2.
MetaSchedule's generic space fuses the pool's outer loops in the layout's order (channel
blocks, then rows) and splits that between the threads: one thread pools the first channel
blocks of every row, so half of what each thread reads sits in the other core's cache.
Timed alone, back to back, both splits read a warm input and measure the same, so the search
cannot tell them apart; in the network the row split is much the faster (measured:
docs/performance.md, "The max pool in row bands").

So the split is fixed here, as the dense and packed-conv spaces fix theirs: the producers
(the pad) inlined, the loops reordered to (batch blocks, rows, channel blocks, columns,
batch lane, taps, channel lane), the outer ones fused into the parallel loop with the rows
first (TVM's static schedule gives each thread one contiguous range: a band of rows), the
channel lanes vectorized. Each combination of the parallel depth (rows, or rows and channel
blocks) and the taps (a loop, or unrolled) is its own design space, measured once each.
Avg pools keep MetaSchedule's generic space (a sum and a division in two blocks; none in the
networks we tune sits after a conv that writes row bands).
"""

from __future__ import annotations

from typing import Any

from .common import is_spatial

VERSION = 1  # in the tuning state's space label (`spaces.label`)
POOL_RULE = "meta_schedule.pool_max"  # TOPI's annotation on its max pool's block
PACKED_RANK = 6  # NCHW{b}n{c}c
DEPTHS = ("rows", "rows+blocks")
TAPS = ("loop", "unrolled")


def _pool_block(sch) -> Any | None:
    """Inline the producers into the max pool's block and return it; None (schedule left
    half-done: callers work on a copy) where the function is not one packed max pool: one
    reduction block annotated as TOPI's max pool, 6 spatial axes (the packed layout) and 2
    taps, static extents, every other block a spatial producer that inlines."""
    from tvm.tirx import IntImm

    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    reductions = [b for b in blocks if not is_spatial(sch.get(b))]
    if len(reductions) != 1 or reductions[0] != blocks[-1]:
        return None
    pool = reductions[0]
    stmt = sch.get(pool)
    if str(stmt.annotations.get("schedule_rule", "")) != POOL_RULE:
        return None
    if [int(iv.iter_type) for iv in stmt.iter_vars] != [0] * PACKED_RANK + [2, 2]:
        return None
    for block in reversed(blocks[:-1]):
        sch.compute_inline(block)
    if len(sch.get_child_blocks(root)) != 1:
        return None
    if not all(isinstance(sch.get(loop).extent, IntImm) for loop in sch.get_loops(pool)):
        return None
    sch.unannotate(pool, "schedule_rule")
    return pool


def applies(workload: Any, target: Any) -> bool:
    """Whether this space schedules `workload` (one PrimFunc module) on `target`: a CPU
    target and a packed max pool (`_pool_block`)."""
    if target.kind.name != "llvm":
        return False
    from tvm.s_tir import Schedule

    try:
        return _pool_block(Schedule(workload)) is not None
    except Exception:  # noqa: BLE001 - a producer TIR cannot inline: the generic space takes it
        return False


def schedule(sch, depth: str, taps: str) -> bool:
    """Apply one point of the space to `sch`; False where the function is not a packed max pool."""
    pool = _pool_block(sch)
    if pool is None:
        return False
    n, c, h, w, b, lane, kh, kw = sch.get_loops(pool)
    sch.reorder(n, h, c, w, b, kh, kw, lane)
    outer = [n, h] if depth == "rows" else [n, h, c]
    sch.parallel(sch.fuse(*outer))
    if taps == "unrolled":
        sch.unroll(kw)
        sch.unroll(kh)
    sch.vectorize(lane)
    return True


def design_spaces(sch) -> list:
    """Every (depth, taps) point, each its own space."""
    spaces = []
    for depth in DEPTHS:
        for taps in TAPS:
            candidate = sch.copy()
            if schedule(candidate, depth, taps):
                spaces.append(candidate)
    return spaces


def space_generator() -> Any:
    """MetaSchedule's space generator for a task `applies` accepted."""
    from tvm.s_tir import meta_schedule as ms

    postprocs = [ms.postproc.DisallowDynamicLoop(), ms.postproc.RewriteReductionBlock()]
    return ms.space_generator.ScheduleFn(design_spaces, sch_rules=[], postprocs=postprocs, mutator_probs={})
