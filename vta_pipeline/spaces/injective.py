"""A small design space for injective functions on CPUs: layout transforms and quantizes.

Between its convs a packed network has a few functions without a reduction: the input's
quantize fused with its pad to the dot product's 4 channels and its transpose into the
packed layout (NCHW float -> [1, 1, H, W, 1, 4] int8), the packed stem's float layout
transform, the unpack to NCHW before a stop (the global pool's, before pack VERSION 3).
MetaSchedule's generic space has one schedule for such a function: every block inlined,
all loops fused into one, split by 64, parallel outside and vectorized inside. Over a transpose that vector runs across the
output's row-major order, so every lane's index is a chain of divisions and modulos of the
fused loop and the loads gather. Kept in the output's own loops, the outer one parallel and
the innermost (the 4 channels) vectorized, such functions ran several times faster than
either MetaSchedule's schedule or TVM's default lowering (one thread, one loop nest per
block): the measurements are in docs/performance.md, "Layout transforms and quantizes".

So for a task whose blocks are all spatial we search these schedules instead: the
producers inlined into the block that writes the output, whose loops stay in the output's
order; the first `depth` loops (0-2, loops of extent 1 not counted) fused into one parallel
loop; the innermost loop vectorized (split into 16 lanes where it is longer than 64),
unrolled (up to 32) or left alone. Each combination is its own design space (a choice made
here in Python would hold for every candidate, see `spaces.packed_conv.design_spaces`), so
the search measures each once and stops ("search-exhausted"), in a handful of trials.
MetaSchedule's own schedule is one more point (`flat`): on elementwise requantizes, whose
input and output are both row-major, it is as fast as the best of the others. The
default lowering is measured after the search as for every CPU task, so none of this can
make a function slower than TVM's own lowering.
"""

from __future__ import annotations

from typing import Any

from .common import is_spatial

VERSION = 1  # in the tuning state's space label: a change of the space searches exhausted tasks again
MAX_DEPTH = 2  # outer loops fused into the parallel one: more left too little inside
VECTOR_LANES = 16  # an innermost loop longer than MAX_VECTOR is split into vectors of this
MAX_VECTOR = 64
MAX_UNROLL = 32
INNER = ("vectorize", "unroll", "plain")
FLAT_VECTOR = 64  # MetaSchedule's own schedule of such a function: all loops fused, vectors of 64


def applies(workload: Any, target: Any) -> bool:
    """Whether this space schedules `workload` (one PrimFunc module) on `target`: a CPU
    target, and a function whose every block is spatial, whose producers all inline into
    the one block that writes its output, and whose loops have static extents."""
    if target.kind.name != "llvm":
        return False
    from tvm.s_tir import Schedule
    from tvm.tirx import IntImm

    try:
        sch = Schedule(workload)
        out = _output_block(sch)
        return out is not None and all(isinstance(sch.get(loop).extent, IntImm) for loop in sch.get_loops(out))
    except Exception:  # noqa: BLE001 - a block TIR cannot inline: the generic space takes it
        return False


def _output_block(sch) -> Any | None:
    """Inline every block into the last one and return it; None (schedule left half-done:
    callers work on a copy) where a block has a reduction or more than one block remains."""
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    if not blocks or not all(is_spatial(sch.get(b)) for b in blocks):
        return None
    for block in reversed(blocks[:-1]):
        sch.compute_inline(block)
    rest = sch.get_child_blocks(root)
    return rest[0] if len(rest) == 1 else None


def _nonunit(sch, loops) -> list[int]:
    return [i for i, loop in enumerate(loops) if int(sch.get(loop).extent) > 1]


def schedule(sch, depth: int, inner: str) -> bool:
    """Apply one point of the space to `sch`; False (nothing meaningful applied) where that
    point does not exist for this function (fewer loops than `depth`, an innermost loop
    too long to unroll, nothing left inside the parallel loop to vectorize)."""
    out = _output_block(sch)
    if out is None:
        return False
    loops = sch.get_loops(out)
    real = _nonunit(sch, loops)
    if depth > len(real) or (depth == len(real) and inner != "plain"):
        return False
    if depth:
        prefix = loops[: real[depth - 1] + 1]
        sch.parallel(sch.fuse(*prefix) if len(prefix) > 1 else prefix[0])
    if depth == len(real) or inner == "plain":
        return True
    last = loops[real[-1]]
    extent = int(sch.get(last).extent)
    if inner == "unroll":
        if extent > MAX_UNROLL:
            return False
        sch.unroll(last)
    elif extent > MAX_VECTOR:
        sch.vectorize(sch.split(last, [None, VECTOR_LANES])[1])
    else:
        sch.vectorize(last)
    return True


def flat(sch) -> bool:
    """MetaSchedule's generic schedule of an injective function, kept as one more point: all
    loops fused, parallel over vectors of 64 (the elementwise requantizes of an int8 network,
    whose loops are already row-major in and out, measured as fast this way as any other)."""
    out = _output_block(sch)
    if out is None:
        return False
    loops = sch.get_loops(out)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if int(sch.get(fused).extent) <= FLAT_VECTOR:
        sch.vectorize(fused)
        return True
    outer, inner = sch.split(fused, [None, FLAT_VECTOR])
    sch.parallel(outer)
    sch.vectorize(inner)
    return True


def design_spaces(sch) -> list:
    """Every (depth, inner) point that exists for the function, each its own space, and the
    flat one."""
    spaces = []
    candidate = sch.copy()
    if flat(candidate):
        spaces.append(candidate)
    for depth in range(MAX_DEPTH + 1):
        for inner in INNER:
            candidate = sch.copy()
            if schedule(candidate, depth, inner):
                spaces.append(candidate)
    return spaces


def space_generator() -> Any:
    """MetaSchedule's space generator for a task `applies` accepted."""
    from tvm.s_tir import meta_schedule as ms

    return ms.space_generator.ScheduleFn(
        design_spaces, sch_rules=[], postprocs=[ms.postproc.DisallowDynamicLoop()], mutator_probs={}
    )
