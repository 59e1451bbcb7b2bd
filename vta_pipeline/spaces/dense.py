"""A design space for a CPU dense layer at small batch: each core streams its own share of the weights.

A classifier at batch 1 (mobilenet_v2's 1280 x 1000, resnet18's 512 x 1000) is a matrix-vector
product: every weight is read once, so the layer runs at the speed memory delivers its
weights. MetaSchedule's generic space tiles it as a GEMM, and the search times each
candidate back to back, the weights warm in the last-level cache, where a single-threaded
nest wins. Inside the network the weights come from DRAM: one core's bandwidth is then the
limit, and two cores stream twice the bytes (measured: docs/performance.md, "The classifier").

So for such a layer the parallel split is fixed, as the packed-conv space fixes its row
bands: the output columns in chunks of `lanes` (a loop the core vectorizes, with an
accumulator per lane in registers), the chunks split evenly between the threads (TVM's
static schedule gives each thread one contiguous range), and the weights rewritten at build
time (`RewriteLayout`) to [chunk, k, lane], so each thread reads one contiguous run of them.
Each width of chunk that divides the columns is its own design space; the search samples
the split of the reduction that is unrolled, and the unroll depth.
"""

from __future__ import annotations

from typing import Any

from .common import fuse_epilogue, is_spatial

VERSION = 1  # in the tuning state's space label (`spaces.label`)
MIN_LANES, MAX_LANES = 8, 64  # widths of a chunk of columns: a vector register's floats to what stays in registers
MAX_INNER_K = 16  # reduction steps in the unrolled inner loop
UNROLL_STEPS = [0, 16, 64, 512]


def _reduction_block(sch) -> Any | None:
    """The one block with a reduction at the root, when it is C[i, j] += A[i, k] * W[k, j]
    (or W[j, k]): two spatial axes and one reduction axis, two float inputs."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    found = [b for b in blocks if not is_spatial(sch.get(b))]
    if len(found) != 1:
        return None
    stmt = sch.get(found[0])
    kinds = [int(iv.iter_type) for iv in stmt.iter_vars]
    if kinds != [0, 0, 2] or len(stmt.reads) != 2 or len(stmt.writes) != 1:
        return None
    if not all(str(r.source.dtype).startswith("float") for r in stmt.reads):
        return None
    return found[0]


def _weights_outweigh_activations(sch, block) -> bool:
    """Whether the layer reads more weights than activations (batch smaller than the output
    columns): what makes it a stream of weights rather than a GEMM."""
    i, j, k = (int(iv.dom.extent) for iv in sch.get(block).iter_vars)
    return i < j and k > 1


def applies(workload: Any, target: Any) -> bool:
    """Whether this space schedules `workload` on `target`: a CPU target, a float dense layer
    (one reduction block of two spatial axes and one reduction axis, the rest elementwise
    consumers) with static extents, whose weights outweigh its activations and whose output
    columns divide into chunks of MIN_LANES to MAX_LANES."""
    if target.kind.name != "llvm":
        return False
    from tvm.s_tir import Schedule
    from tvm.tirx import IntImm

    try:
        sch = Schedule(workload)
        block = _reduction_block(sch)
        if block is None or not all(isinstance(sch.get(loop).extent, IntImm) for loop in sch.get_loops(block)):
            return False
        if not _weights_outweigh_activations(sch, block) or not lane_widths(sch, block):
            return False
        return all(
            is_spatial(sch.get(b))
            for b in sch.get_child_blocks(sch.get_sblock("root"))
            if not sch.get(b).same_as(sch.get(block))
        )
    except Exception:  # noqa: BLE001 - anything TIR will not analyse here: the generic space takes it
        return False


def lane_widths(sch, block) -> list[int]:
    """The chunk widths the output columns divide into, MIN_LANES to MAX_LANES."""
    columns = int(sch.get(block).iter_vars[1].dom.extent)
    return [w for w in range(MIN_LANES, MAX_LANES + 1) if columns % w == 0]


def schedule(sch, lanes: int) -> None:
    """Apply the space with chunks of `lanes` columns to `sch`, sampling its knobs."""
    block = _reduction_block(sch)
    i, j, k = sch.get_loops(block)
    j_o, j_i = sch.split(j, [None, lanes])
    k_o, k_i = sch.split(k, sch.sample_perfect_tile(k, n=2, max_innermost_factor=MAX_INNER_K))
    sch.reorder(i, j_o, k_o, k_i, j_i)
    sch.parallel(sch.fuse(i, j_o))  # contiguous chunks per thread: its own run of the rewritten weights
    acc = sch.cache_write(block, 0, "local")  # a chunk's accumulators: registers once vectorized
    outer = sch.get_loops(block)[0]
    sch.reverse_compute_at(acc, outer, preserve_unit_loops=True)
    fuse_epilogue(sch, acc)  # bias add and activation in the chunk's write-back
    sch.vectorize(j_i)
    init = sch.decompose_reduction(block, k_o)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(acc)[-1])
    unroll = sch.sample_categorical(UNROLL_STEPS, probs=[0.25] * len(UNROLL_STEPS))
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", unroll)


def design_spaces(sch) -> list:
    """One space per chunk width (`lane_widths`): a width is a choice of loop structure, which
    MetaSchedule keeps per space (see `packed_conv_space.design_spaces`)."""
    spaces = []
    for lanes in lane_widths(sch, _reduction_block(sch)):
        candidate = sch.copy()
        schedule(candidate, lanes)
        spaces.append(candidate)
    return spaces


def space_generator() -> Any:
    """MetaSchedule's space generator for a task `applies` accepted."""
    from tvm.s_tir import meta_schedule as ms

    postprocs = [
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),  # realizes the sampled unroll depth
        ms.postproc.RewriteReductionBlock(),
        ms.postproc.RewriteLayout(),  # weights as the nest reads them: [chunk, k, lane]
    ]
    return ms.space_generator.ScheduleFn(
        design_spaces,
        sch_rules=[],
        postprocs=postprocs,
        mutator_probs={ms.mutator.MutateTileSize(): 0.8, ms.mutator.MutateUnroll(): 0.2},
    )
