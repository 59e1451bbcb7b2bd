"""A small, expert design space for packed convolutions on CPUs (NeoCPU's schedule).

MetaSchedule's generic space for a conv (multi-level tiling of all ten loops, random compute
locations, random unrolling) holds the fast schedules, but they are rare in it: at the
budgets a night gives each task (tens of trials), the search measured schedules 3-10x
slower than ONNX Runtime on the same conv. The direct NCHW[x]c convolution of the NeoCPU
paper (Liu et al., USENIX ATC 2019; Relay's x86 `conv2d_NCHWc` and `conv2d_NCHWc_int8`
schedules) is known to reach vendor-library speed with a handful of knobs, so for packed conv
tasks we search only its space:

    parallel over (batch block, row band, output-channel chunks)   # a band of rows per core
      for oh_outer (in the band), ow_outer:       # a register tile of the output
        for ic_chunk, kh, kw, (ic_lane):          # the reduction
          for oh_inner, ow_inner, oc_chunk_inner: # unrolled: reg_h x reg_n x oc_tile accumulators
            for oc_lane (x ic_lane):              # float: vectorized over the 16 output lanes;
              acc[...] += data[...] * weight[...] # int8: the CPU's 16x4 dot product (int8_dot)
      epilogue (bias, residual add, ReLU; int8: the requantize) applied to the tile in registers

Knobs, each a MetaSchedule sampling decision (so the evolutionary search mutates them and a
record replays them): how many output-channel chunks one tile computes (`oc_tile`, 1-4), the
tile's output width (`reg_n`, 1-8) and height (`reg_h`, a divisor of the height up to 4),
and the unroll depth of the whole nest (0-512, as MetaSchedule's own rule samples it). A
float conv has a second design space whose tile runs over 1-8 pixels of the row-major H x W,
across rows (`_fuse_pixels`): small outputs (7 x 7) then split into whole tiles. Tiles
that do not fit the CPU's vector registers (accumulators, the tile's weight vectors and the
broadcast input) are rejected before they are built (`register_limit`).

The float tile's width need not divide the output's (`reg_n` is ragged: the last tile of a
row checks the bound per pixel). The widths of CNNs are 7 x 2^k (resnet's 56/28/14/7), whose
divisors give tiles of 1, 2, 4, 7 or 8 pixels: on AVX2 a 16-lane chunk is two registers, so 4
pixels leave the FMA units waiting on latency and 7 (14 accumulators, 2 weight vectors, the
broadcast: 17 of 16 registers) spill; ragged tiles of 4-6 pixels were faster on both kinds of
width (docs/performance.md, "fp32 on a CPU"). The bounds checks stay in the code: TIR's LoopPartition would peel
the last tile off under a `pragma_loop_partition_hint`, but in TVM 0.27 NarrowDataType renames
the int64 loop variables after LowerOpaqueBlock turned the hint into an attribute of the old
variable, so the hint never reaches its loop (checked on the lowered TIR: without
NarrowDataType the same module is peeled).

Each thread computes one band of the output's rows, every channel of them (`_row_bands`):
the next conv then reads its input from the core that wrote it. Version 1 of this space split
the output-channel chunks between the threads, and a thread's next conv read what the other
one wrote; across the two CCDs of a Zen 5 host that made mobilenet_v2 fp32 1.6x slower than
on one CCD, against 1.5x for ONNX Runtime (docs/performance.md). Records of version 1 are
carried into this one by `spaces.upgrade`.

A float conv whose weights outweigh its activations (resnet's 7 x 7 x 512 convs: 9.4 MB of
weights, 0.2 MB of activations) splits its output channels between the threads instead
(`_weights_outweigh_activations`), and has a third design space with a block of input
channels outside every tile (`_schedule_weights_once`): in a network its weights come from
memory, and this nest reads each block of them once and reuses it from L1 for the whole
output, where the nest over rows reads a chunk from memory in its first row of tiles at a
few FMAs per cache line. The search picks between the nests by their time, as for the
other two spaces.

Float weights are constants marked layout-free: `RewriteLayout` stores them in the order
this nest reads them ([oc_chunk, ic_chunk, kh, kw, ic_lane, oc_tile, oc_lane]), once, at
build time; int8 weights already are in the dot product's `OIHW16o4i`.

What it applies to (`conv_kind`), on CPU targets: a task whose one reduction block is a conv
of graph pack: VTA's `conv2d_packed` compute in float32 (graph pack of a float network), the
x86 layout's `conv2d_dot_packed` (int8 weights, uint8 or int8 data) on a CPU with a
dot-product intrinsic, a
packed depthwise conv (same nest, no channel reduction; int8 over non-negative data with its taps in
fours, graph pack's `depthwise_dot`, each row of taps is one 16x4 dot product where the CPU
has VNNI and VBMI, else the same nest on int32 lanes); or a plain NCHW float stem conv (an
image's few input channels, output channels filling whole vectors: the same nest over 16 or 8
output lanes). Everything else keeps the spaces it had
(`spaces.design_space`).
"""

from __future__ import annotations

import math
from typing import Any

from ..passes.packed_ops import DEPTHWISE_DOT, DOT_CONV, PACKED_CONV, PACKED_DEPTHWISE
from ..tir import int8_dot, weight_prefetch
from .common import fuse_epilogue, parallel_bands

# in the tuning state's space label (from 2 on): a change of a nest searches the tasks that
# exhausted the old one again
VERSION = 2  # 2: the parallel loop over row bands, one per core (`_row_bands`)
# a kind whose nest changed on its own since: only its tasks search again
KIND_VERSIONS = {"depthwise": 3}  # 3: the padding computed inside the conv's parallel loop (`_pad_inside`)
# a float conv whose weights outweigh its activations (`splits_by_channels`): 3, its third
# design space, the input channels outside the tiles (`_schedule_weights_once`)
WEIGHTS_ONCE_VERSION = 4  # 4: each tile prefetches its share of the next block of weights
# a conv whose result a wider block broadcasts (`broadcast_epilogue`): what it broadcasts
# computed once in the conv's write-back, the broadcast block vectorized (`_schedule_wide_consumer`)
BROADCAST_EPILOGUE_VERSION = 5
MAX_REG_N = 8  # output columns per register tile
MAX_REG_H = 4  # output rows per register tile
MAX_OC_TILE = 4  # packed output-channel chunks per register tile
MAX_IC_BLOCK = 8  # input-channel chunks per block of weights read once (`_schedule_weights_once`)
UNROLL_STEPS = [0, 16, 64, 512]  # MetaSchedule's CPU choices for auto-unroll
# Vector registers the int8 dot product's tile leaves for its operands and its int16 / int32
# partial products (float tiles count theirs exactly: `tile_registers`).
DOT_SPARE_REGISTERS = 5


NCHW_CONV = "conv2d_nchw"  # TOPI's block for a plain (groups = 1) NCHW conv
# Plain NCHW convs get this space only as a network's stem (an image's few channels: no pack
# layout covers them). Deeper NCHW convs keep MetaSchedule's generic space: with this nest
# their output stores scatter over 16 channel planes, and tinynet's 32->32 conv's candidates
# then timed up to 2.2x apart between tuning and a quiet re-time (buffer placement), which
# misleads the search (tests/test_measuring.py).
MAX_STEM_CHANNELS = 4


def _conv_block(sch) -> tuple[Any, str] | tuple[None, None]:
    """The workload's conv block and its kind, if it has exactly one this space schedules:
    "float" (packed, float), "dot" (packed, int8 weights times uint8 data, or int8 data where
    graph pack could not prove it non-negative: mobilenet_v2's 1x1 convs after a linear
    bottleneck), "depthwise" (packed), "depthwise_dot" (packed, taps in fours: the dot product's
    depthwise form), "nchw" (a plain NCHW float stem conv: at most 4 input channels, output
    channels in multiples of 8)."""
    found = [
        (b, sch.get(b))
        for b in sch.get_child_blocks(sch.get_sblock("root"))
        if sch.get(b).name_hint in (PACKED_CONV, DOT_CONV, NCHW_CONV, PACKED_DEPTHWISE, DEPTHWISE_DOT)
    ]
    if len(found) != 1:
        return None, None
    block, stmt = found[0]
    is_float = str(stmt.writes[0].source.dtype).startswith("float")
    if stmt.name_hint == PACKED_DEPTHWISE:  # any type: int8 products widen to int32 lanes
        return (block, "depthwise") if len(stmt.iter_vars) == 8 else (None, None)
    if stmt.name_hint == DEPTHWISE_DOT:
        ok = len(stmt.iter_vars) == 8 and _block_lanes(stmt) == int8_dot.LANES
        return (block, "depthwise_dot") if ok else (None, None)
    if stmt.name_hint == NCHW_CONV:
        ok = (
            len(stmt.iter_vars) == 7
            and is_float
            and int(stmt.iter_vars[4].dom.extent) <= MAX_STEM_CHANNELS
            and _nchw_lanes(int(stmt.iter_vars[1].dom.extent))
        )
        return (block, "nchw") if ok else (None, None)
    if len(stmt.iter_vars) != 10:
        return None, None
    if stmt.name_hint == DOT_CONV:  # int8 weights times uint8 or int8 data, into 16 or 8 output lanes
        ok = int8_dot.dot_operands(stmt) is not None and _block_lanes(stmt) in (int8_dot.LANES, int8_dot.NARROW_LANES)
        return (block, "dot") if ok else (None, None)
    return (block, "float") if is_float else (None, None)


def _block_lanes(stmt) -> int:
    """A packed conv block's output-channel lanes (the innermost extent of what it writes)."""
    return int(stmt.writes[0].source.shape[-1])


def _nchw_lanes(channels: int) -> int | None:
    """Output channels vectorized together in a plain NCHW conv: 16 (as a packed block), or 8."""
    return 16 if channels % 16 == 0 else 8 if channels % 8 == 0 else None


def conv_kind(workload: Any, target: Any) -> str | None:
    """ "float" or "dot" when this space applies to the task on this target, else None."""
    from tvm.s_tir import Schedule

    if target.kind.name != "llvm":
        return None
    sch = Schedule(workload)
    block, kind = _conv_block(sch)
    if kind == "dot" and _dot_intrinsic(sch, block, target) is None:
        return None
    if kind == "depthwise_dot" and int8_dot.depthwise_intrinsic_for(target) is None:
        return "depthwise"  # the taps in fours on int32 lanes (a fourth of them multiply zeros)
    return kind


def _dot_intrinsic(sch, block, target: Any) -> str | None:
    """The dot-product intrinsic for this packed int8 conv block's lanes (16 or 8) and data
    (uint8, or signed int8) on `target`."""
    stmt = sch.get(block)
    return int8_dot.intrinsic_for(target, _block_lanes(stmt), signed=int8_dot.dot_operands(stmt) == "int8")


def design_spaces(sch, intrin: str | None = None, bands: int | None = None) -> list:
    """The task's design spaces: the nest with tiles of rows x columns; for a float conv whose
    epilogue can follow a pixel axis, the nest with tiles over the row-major pixels
    (`_fuse_pixels`); for a float conv whose weights outweigh its activations, the nest with
    the input channels outside the tiles (`_schedule_weights_once`). Spaces, not sampled
    branches: MetaSchedule draws its candidates by replaying a space's trace with new
    decisions, never by calling this function again, so a choice made in Python here would
    hold for every candidate of the task."""
    over_rows = sch.copy()
    # copied from `over_rows` only where it applies: a copy forks its source's random state,
    # and the other spaces' candidates stay the ones they were
    weights_once = over_rows.copy() if splits_by_channels(sch.mod) else None
    schedule(sch, intrin, bands=bands)
    spaces = [sch]
    if schedule(over_rows, intrin, pixel_tiles=True, bands=bands):
        spaces.append(over_rows)
    if weights_once is not None and schedule(weights_once, intrin, weights_once=True, bands=bands):
        spaces.append(weights_once)
    return spaces


def schedule(
    sch, intrin: str | None = None, pixel_tiles: bool = False, bands: int | None = None, weights_once: bool = False
) -> bool:
    """Apply the space's schedule to `sch` (a workload `conv_kind` accepted), sampling its
    knobs; `intrin`: the dot-product intrinsic for an int8 conv; `pixel_tiles`: a float
    conv's tile over the row-major pixels, `weights_once`: a float conv's input channels
    outside its tiles (either False, leaving `sch` unscheduled, where it does not apply);
    `bands`: row bands of the parallel loop (`parallel_bands`: this machine's cores by
    default)."""
    conv, kind = _conv_block(sch)
    bands = bands or parallel_bands()
    _inline_elementwise(sch, conv)
    if pixel_tiles and (kind != "float" or not _pixel_axis_fits(sch, conv)):
        return False
    if weights_once:
        if kind != "float" or not _weights_outweigh_activations(sch, conv):
            return False
        _schedule_weights_once(sch, conv)
        return True
    if kind == "nchw":
        _schedule_nchw(sch, conv, bands)
        return True
    if kind == "depthwise" or (kind == "depthwise_dot" and intrin is None):
        _schedule_depthwise(sch, conv, bands, pad_inside=kind == "depthwise")
        return True
    if kind == "depthwise_dot":
        _schedule_depthwise_dot(sch, conv, intrin, bands)
        return True
    by_channels = _weights_outweigh_activations(sch, conv)
    if by_channels:
        bands = 1  # each thread its share of the output channels, all rows: half the weights each
    if pixel_tiles:
        if _fuse_pixels(sch, conv, bands):
            b_o, c_o, band, pixels, b_i, c_i, k_o, d_i, d_j, k_i = sch.get_loops(conv)
        else:
            (b_o, c_o, pixels, b_i, c_i, k_o, d_i, d_j, k_i), band = sch.get_loops(conv), None
        c_o_o, c_o_i = sch.split(c_o, sch.sample_perfect_tile(c_o, n=2, max_innermost_factor=MAX_OC_TILE))
        tile_o, tile_i = _split_width(sch, pixels, whole=band is not None)
        tile = (tile_i,)
        outer = _parallel_over_rows(
            sch, b_o, band, c_o_o, tile_o, [k_o, d_i, d_j, k_i, tile_i, c_o_i, b_i, c_i], by_channels
        )
        if band is None:
            tile_o = outer  # every tile its own parallel job
    else:
        b_o, c_o, oh, ow, b_i, c_i, k_o, d_i, d_j, k_i = sch.get_loops(conv)
        band, oh = _row_bands(sch, oh, bands)
        c_o_o, c_o_i = sch.split(c_o, sch.sample_perfect_tile(c_o, n=2, max_innermost_factor=MAX_OC_TILE))
        oh_o, oh_i = sch.split(oh, sch.sample_perfect_tile(oh, n=2, max_innermost_factor=MAX_REG_H))
        if kind == "float":
            ow_o, ow_i = _split_width(sch, ow)
            inner = [ow_o, k_o, d_i, d_j, k_i, oh_i, ow_i, c_o_i, b_i, c_i]
        else:  # the tensorized dot product takes no bounds check inside its block (whole tiles);
            # its 16 (or 8) lanes x 4 reduction steps stay innermost, as one block
            ow_o, ow_i = sch.split(ow, sch.sample_perfect_tile(ow, n=2, max_innermost_factor=MAX_REG_N))
            inner = [ow_o, k_o, d_i, d_j, oh_i, ow_i, c_o_i, b_i, c_i, k_i]
        _parallel_over_rows(sch, b_o, band, c_o_o, oh_o, inner, by_channels)
        tile = (oh_i, ow_i)
        tile_o = ow_o
    if kind == "float":
        sch.vectorize(c_i)  # before the reduction is split up: TIR checks its dataflow here
    _schedule_producers(sch, conv)
    for loop in (*tile, c_o_i):  # the tile's accumulators live in registers
        sch.unroll(loop)

    # Accumulate the tile in its own small buffer (registers once unrolled), then write it
    # out through the epilogue in the same pass over the tile. The dot-product intrinsic's
    # accumulator is declared in global scope, so int8 tiles are, too (still a tile-sized
    # buffer: TIR compacts it to the tile).
    acc = sch.cache_write(conv, 0, "local" if kind == "float" else "global")
    sch.reverse_compute_at(acc, tile_o, preserve_unit_loops=True)
    fuse_epilogue(sch, acc)

    if kind == "float":
        init = sch.decompose_reduction(conv, k_o)
        sch.vectorize(sch.get_loops(init)[-1])
    else:
        _tensorize_lanes(sch, c_i, k_o, intrin)
    sch.vectorize(sch.get_loops(acc)[-1])
    _sample_unroll(sch)
    return True


def _schedule_weights_once(sch, conv) -> None:
    """A float conv whose weights outweigh its activations (`_weights_outweigh_activations`:
    resnet's 7 x 7 x 512 convs, 9.4 MB of weights) with its input-channel chunks outside its
    register tiles:

        parallel over (batch block, output-channel chunks)   # each thread its share of the weights
          for ic_outer:                                       # a block of input chunks (a knob)
            for oh_outer, ow_outer:                           # every tile of the output
              for ic_inner, kh, kw, (ic_lane):
                for oh_inner, ow_inner, oc_chunk_inner:       # unrolled, as in the other nests
                  acc[...] += data[...] * weight[...]
          epilogue from the chunk's accumulator (all its pixels, in L1)

    In a network the weights are not in the caches: the nest over rows reads a chunk's weights
    from memory in its first row of tiles, at a few FMAs per cache line, and only the later
    rows find them in L2. Here a block of input chunks (tens of KB) is read from memory once
    and reused from L1 by every tile of the output: with the weights evicted between runs, as
    the network's other layers evict them, the faster nest (docs/performance.md, "reads each
    block of weights once")."""
    b_o, c_o, oh, ow, b_i, c_i, k_o, d_i, d_j, k_i = sch.get_loops(conv)
    c_o_o, c_o_i = sch.split(c_o, sch.sample_perfect_tile(c_o, n=2, max_innermost_factor=MAX_OC_TILE))
    oh_o, oh_i = sch.split(oh, sch.sample_perfect_tile(oh, n=2, max_innermost_factor=MAX_REG_H))
    ow_o, ow_i = _split_width(sch, ow)
    k_oo, k_oi = sch.split(k_o, sch.sample_perfect_tile(k_o, n=2, max_innermost_factor=MAX_IC_BLOCK))
    sch.reorder(b_o, c_o_o, k_oo, oh_o, ow_o, k_oi, d_i, d_j, k_i, oh_i, ow_i, c_o_i, b_i, c_i)
    outer = sch.fuse(b_o, c_o_o)
    sch.parallel(outer)
    sch.vectorize(c_i)
    _schedule_producers(sch, conv)
    # the accumulator holds the chunk's whole output: the tiles add into it, block by block
    _accumulate_locally(sch, conv, (oh_i, ow_i, c_o_i), outer, k_oo)
    # and each tile prefetches its share of the next block (`weight_prefetch`, version 4)
    sch.annotate(ow_o, weight_prefetch.ANNOTATION, 2)


def _row_bands(sch, rows, bands: int) -> tuple[Any, Any]:
    """Split an output's rows (or row-major pixels) into `bands` equal bands, one per thread:
    (the band loop, the rows of one band); (None, `rows`) where they do not divide evenly (a
    ragged band would put a bounds check on every tile, and the dot product's tensorized
    block takes none).

    Why bands: each thread then writes the same rows of every conv's output, and the next
    conv reads them back from its own core's caches. Split by channels (this space's parallel
    loop until version 2), a thread's 1x1 conv reads the channels its partner wrote: when the
    host places the two vCPUs on different Zen 5 CCDs (a core-to-core round trip four times
    as long), a chain of such kernels ran five times slower than split by rows
    (docs/performance.md, "Each thread a band of output rows")."""
    extent = int(sch.get(rows).extent)
    if bands <= 1 or extent % bands:
        return None, rows
    band, rest = sch.split(rows, [bands, extent // bands])
    return band, rest


def _parallel_over_rows(sch, batch, band, chunks, rows, inner: list, by_channels: bool = False) -> Any:
    """Order the nest (batch, band, chunks, rows, *inner) and run (batch, band, chunks) in
    parallel: the static split of that loop gives each thread its band, and inside it the
    order tuned before bands (chunks, then rows: a chunk's weights stay hot over the band's
    rows, a depthwise conv's input rows in L1). Without a band, (batch, rows, chunks) in
    parallel: still contiguous rows per thread. `by_channels` (a conv whose weights outweigh
    its activations, `_weights_outweigh_activations`): (batch, chunks, rows), each thread a
    share of the output channels. Returns the parallel loop."""
    if by_channels:
        sch.reorder(batch, chunks, rows, *inner)
        outer = sch.fuse(batch, chunks, rows)
    elif band is not None:
        sch.reorder(batch, band, chunks, rows, *inner)
        outer = sch.fuse(batch, band, chunks)
    else:
        sch.reorder(batch, rows, chunks, *inner)
        outer = sch.fuse(batch, rows, chunks)
    sch.parallel(outer)
    return outer


def _weights_outweigh_activations(sch, conv) -> bool:
    """Whether the conv reads more bytes of weights than of activations (its input and output):
    the 1x1 convs of a network's last, 7 x 7 stage (mobilenet_v2's 320->1280: 1.6 MB of weights,
    0.3 MB of activations). Split by channels, each core reads only its half of the weights,
    and keeps it in its own L2 from one inference to the next; the activations it then reads
    from the other core are the small part. Every other conv splits by rows (`_row_bands`)."""
    import tvm_ffi

    stmt = sch.get(conv)

    def nbytes(region) -> int:
        n = max(1, tvm_ffi.dtype(str(region.source.dtype)).bits // 8)
        for d in region.source.shape:
            n *= int(d)
        return n

    if len(stmt.reads) < 2:
        return False
    data, weight = stmt.reads[0], stmt.reads[1]
    return nbytes(weight) > nbytes(data) + nbytes(stmt.writes[0])


def splits_by_channels(workload: Any) -> bool:
    """Whether this space splits the workload's conv between threads by output channels, not by
    rows (`_weights_outweigh_activations`)."""
    from tvm.s_tir import Schedule

    sch = Schedule(workload)
    conv, kind = _conv_block(sch)
    _inline_elementwise(sch, conv)  # as `schedule` reads the conv's buffers
    return kind in ("float", "dot") and _weights_outweigh_activations(sch, conv)


def _split_width(sch, loop, whole: bool = False) -> tuple[Any, Any]:
    """Split an output width into register tiles of a sampled 1..8 pixels, ragged or not (the
    last tile of a ragged split computes only the pixels that exist); `whole`: only tiles that
    divide it (a band's pixels: `_fuse_pixels`)."""
    extent = int(sch.get(loop).extent)
    widths = [w for w in range(1, min(MAX_REG_N, extent) + 1) if not whole or extent % w == 0]
    factor = sch.sample_categorical(widths, probs=[1 / len(widths)] * len(widths))
    return sch.split(loop, [None, factor])


def _pixel_axis_fits(sch, conv) -> bool:
    """Whether the conv's epilogue can follow a pixel axis: a conv whose output is the
    function's own (nothing after it to fold) keeps its rows, its output buffer being a
    parameter that keeps its shape; so does one whose epilogue is not an elementwise block
    over the conv's output shape."""
    shape = [int(d) for d in sch.get(conv).writes[0].source.shape]
    consumers = sch.get_consumers(conv)
    return bool(consumers) and all([int(v.dom.extent) for v in sch.get(c).iter_vars] == shape for c in consumers)


def _fuse_pixels(sch, conv, bands: int) -> bool:
    """Lay the conv's output (an intermediate before its epilogue) out as [.., H * W, ..], and
    iterate the conv and its epilogue over that one pixel axis, so a tile of pixels may span
    rows. On resnet's 7 x 7 outputs a row tile is 4 + 3 or 6 + 1 pixels (the short tile
    leaves the FMA units waiting); 49 pixels in tiles of 5 or 6 are nearly all whole tiles,
    and measured faster (docs/performance.md, "fp32 on a CPU").

    Where the pixels divide into `bands` (`_row_bands`), the axis is [.., band, pixel of the
    band, ..], and the tiles divide the band (`_split_width(whole=True)`): the tile's
    write-back takes its extent from the region TIR proves the tile writes, which does not
    see a ragged tile's bound, so the last tile of a band would write the whole band (or,
    over one axis of H * W, the next band's first pixels, from accumulators it never
    computed). Returns whether it made bands."""
    width = int(sch.get(sch.get_loops(conv)[3]).extent)
    pixels = width * int(sch.get(sch.get_loops(conv)[2]).extent)
    if bands > 1 and pixels % bands == 0:
        per = pixels // bands
        sch.transform_layout(
            conv, ("write", 0), lambda b, c, h, w, bi, ci: (b, c, (h * width + w) // per, (h * width + w) % per, bi, ci)
        )
        sch.transform_block_layout(
            conv,
            lambda b, c, h, w, bi, ci, ko, di, dj, ki: (
                b,
                c,
                (h * width + w) // per,
                (h * width + w) % per,
                bi,
                ci,
                ko,
                di,
                dj,
                ki,
            ),
        )
        for consumer in sch.get_consumers(conv):  # the epilogue (inlined into one block by now)
            sch.transform_block_layout(
                consumer, lambda b, c, h, w, bi, ci: (b, c, (h * width + w) // per, (h * width + w) % per, bi, ci)
            )
        return True
    sch.transform_layout(conv, ("write", 0), lambda b, c, h, w, bi, ci: (b, c, h * width + w, bi, ci))
    sch.transform_block_layout(
        conv, lambda b, c, h, w, bi, ci, ko, di, dj, ki: (b, c, h * width + w, bi, ci, ko, di, dj, ki)
    )
    for consumer in sch.get_consumers(conv):
        sch.transform_block_layout(consumer, lambda b, c, h, w, bi, ci: (b, c, h * width + w, bi, ci))
    return False


def _sample_unroll(sch) -> None:
    unroll = sch.sample_categorical(UNROLL_STEPS, probs=[0.25] * 4)
    sch.annotate(sch.get_sblock("root"), "meta_schedule.unroll_explicit", unroll)


def version(kind: str, workload: Any = None) -> int:
    """The version of the nest of a conv of `kind` (`conv_kind`), in its tasks' space label
    (`workload`: the task's, which says whether a float conv splits by channels and whether
    its result is broadcast)."""
    if workload is not None and broadcast_epilogue(workload):
        return BROADCAST_EPILOGUE_VERSION
    if kind == "float" and workload is not None and splits_by_channels(workload):
        return WEIGHTS_ONCE_VERSION
    return KIND_VERSIONS.get(kind, VERSION)


def _schedule_depthwise(sch, conv, bands: int, pad_inside: bool = True) -> None:
    """A packed depthwise conv: each lane of the 16-channel block is its own channel, so the
    nest is the same without the input-channel reduction (the taps kh x kw are the reduction,
    a register tile of output pixels reuses nothing but the tap's weight vector).
    `pad_inside`: the padding in the parallel loop (`_pad_inside`; False: the nest of an
    int8 depthwise conv where the CPU has no dot product for it, unchanged since version 2)."""
    b_o, c_o, oh, ow, b_i, c_i, d_i, d_j = sch.get_loops(conv)
    band, oh = _row_bands(sch, oh, bands)
    oh_o, oh_i = sch.split(oh, sch.sample_perfect_tile(oh, n=2, max_innermost_factor=MAX_REG_H))
    ow_o, ow_i = _split_width(sch, ow)
    outer = _parallel_over_rows(sch, b_o, band, c_o, oh_o, [ow_o, d_i, d_j, oh_i, ow_i, b_i, c_i])
    sch.vectorize(c_i)
    if pad_inside:
        _pad_inside(sch, conv, outer)
    else:
        _schedule_producers(sch, conv)
    _accumulate_locally(sch, conv, (oh_i, ow_i), ow_o, d_i)


def _accumulate_locally(sch, conv, tile: tuple, at, reduction) -> None:
    """The end of a float nest: the register tile's loops unrolled, the conv accumulated in a
    local buffer written back at loop `at` through the epilogue, its initialization split off
    at loop `reduction`, both vectorized over the lanes; then the unroll depth sampled."""
    for loop in tile:
        sch.unroll(loop)
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, at, preserve_unit_loops=True)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(conv, reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(acc)[-1])
    _sample_unroll(sch)


def _schedule_depthwise_dot(sch, conv, intrin: str, bands: int) -> None:
    """A packed depthwise conv with its taps in fours: the same tile of output pixels, each
    pixel's row of taps one dot product (`intrin`) into its 16 lanes. The intrinsic reads
    whole tiles (no bounds check inside it), so the tile's width divides the output's."""
    b_o, c_o, oh, ow, b_i, c_i, d_i, d_j = sch.get_loops(conv)
    band, oh = _row_bands(sch, oh, bands)
    oh_o, oh_i = sch.split(oh, sch.sample_perfect_tile(oh, n=2, max_innermost_factor=MAX_REG_H))
    ow_o, ow_i = sch.split(ow, sch.sample_perfect_tile(ow, n=2, max_innermost_factor=MAX_REG_N))
    _parallel_over_rows(sch, b_o, band, c_o, oh_o, [ow_o, d_i, oh_i, ow_i, b_i, c_i, d_j])
    _schedule_producers(sch, conv)
    for loop in (oh_i, ow_i):
        sch.unroll(loop)
    acc = sch.cache_write(conv, 0, "global")  # the intrinsic's accumulator is declared global
    sch.reverse_compute_at(acc, ow_o, preserve_unit_loops=True)
    fuse_epilogue(sch, acc)
    _tensorize_lanes(sch, c_i, d_i, intrin)
    sch.vectorize(sch.get_loops(acc)[-1])
    _sample_unroll(sch)


def _tensorize_lanes(sch, lanes_loop, reduction_outer, intrin: str) -> None:
    """The loops from `lanes_loop` in (the lanes x the intrinsic's reduction) made one block and
    tensorized with `intrin`; its zeroing split off above `reduction_outer`, and the init of the
    lanes (inside the blockized one) vectorized."""
    dot = sch.blockize(lanes_loop)
    init = sch.decompose_reduction(dot, reduction_outer)
    (lanes,) = sch.get_child_blocks(init)
    sch.vectorize(sch.get_loops(lanes)[-1])
    sch.tensorize(dot, intrin)


def _schedule_nchw(sch, conv, bands: int) -> None:
    """The same nest for a plain NCHW conv: the output channels split into chunks of 16 (or 8)
    lanes, vectorized; weights re-laid out by RewriteLayout as if packed; the tile written
    back to NCHW once its reduction is done (one strided store per lane and pixel, against
    C_in x kh x kw FMAs: the stem conv has 147)."""
    nn, ff, yy, xx, rc, ry, rx = sch.get_loops(conv)
    lanes = _nchw_lanes(int(sch.get(ff).extent))
    ff_c, ff_l = sch.split(ff, [None, lanes])
    band, yy = _row_bands(sch, yy, bands)
    ff_o, ff_t = sch.split(ff_c, sch.sample_perfect_tile(ff_c, n=2, max_innermost_factor=MAX_OC_TILE))
    yy_o, yy_i = sch.split(yy, sch.sample_perfect_tile(yy, n=2, max_innermost_factor=MAX_REG_H))
    xx_o, xx_i = _split_width(sch, xx)
    _parallel_over_rows(sch, nn, band, ff_o, yy_o, [xx_o, rc, ry, rx, yy_i, xx_i, ff_t, ff_l])
    sch.vectorize(ff_l)
    _schedule_producers(sch, conv)
    for loop in (yy_i, xx_i, ff_t):
        sch.unroll(loop)
    acc = sch.cache_write(conv, 0, "local")
    sch.reverse_compute_at(acc, xx_o, preserve_unit_loops=True)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(conv, rc)
    sch.vectorize(sch.get_loops(init)[-1])
    _sample_unroll(sch)


def _inline_elementwise(sch, conv) -> None:
    """Inline every elementwise block at the root other than the conv and its padding (casts
    of a residual input, the steps of a requantize) into its consumers, so the epilogue is one
    block after the conv. A block that a wider block broadcasts (a squeeze-and-excitation
    gate: the activation of a 1x1 conv's few outputs, multiplied into every pixel of another
    tensor) stays, to be folded into the conv's write-back: inlined into the broadcast, it
    would be computed again for every pixel."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        name = sch.get(block).name_hint
        if name.startswith("pad") or sch.get(block).same_as(sch.get(conv)):
            continue
        if any(_elements(sch, consumer) > _elements(sch, block) for consumer in sch.get_consumers(block)):
            continue
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 - an output, or not elementwise: it stays a block
            pass


def _elements(sch, block) -> int:
    """How many elements `block` writes (its output buffer's size)."""
    return _size(sch.get(block).writes[0].source)


def _size(buffer) -> int:
    return math.prod(int(d) for d in buffer.shape)


def broadcast_epilogue(workload: Any) -> bool:
    """Whether the task's output is wider than its conv's (`_inline_elementwise`): the conv's
    result is broadcast into a larger tensor (a squeeze-and-excitation gate's multiply)."""
    from tvm import s_tir

    sch = s_tir.Schedule(workload)
    conv, _ = _conv_block(sch)
    if conv is None:
        return False
    return _size(sch.mod["main"].params[-1]) > _elements(sch, conv)  # the last parameter: the output


def _schedule_producers(sch, conv) -> None:
    """The padding block (and any other producer at the root) runs in parallel over its
    outer loops, vectorized over the packed lanes."""
    for producer in sch.get_producers(conv):
        loops = sch.get_loops(producer)
        if len(loops) < 3:
            continue
        sch.reorder(loops[2], loops[1])  # rows before channels: a thread pads the rows its band reads
        sch.parallel(sch.fuse(loops[0], loops[2], loops[1]))
        if int(sch.get(loops[-1]).extent) <= 64:  # a packed block's lanes, not a whole NCHW row
            sch.vectorize(loops[-1])


def _pad_inside(sch, conv, outer) -> None:
    """Compute a depthwise conv's padding inside its parallel loop: each iteration pads the
    rows (and halo) of its own channel chunk just before reading them, from its own core's
    caches, instead of a parallel pass over the whole input first and a wait for every
    thread at its end. A depthwise chunk reads only its own channels, so nothing is padded
    twice but the halo rows; every depthwise task of mobilenet_v2 measured faster so
    (docs/performance.md, "A depthwise conv pads inside its parallel loop"). A conv that reads every input
    channel would pad them all again for each chunk, so the others keep `_schedule_producers`."""
    for producer in sch.get_producers(conv):
        sch.compute_at(producer, outer, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(producer)[-1])  # the 16 (or 8) lanes of the packed block


def vector_registers(target: Any) -> tuple[int, int]:
    """(32-bit lanes per vector register, vector registers) of a CPU target: what bounds a
    register tile. AVX-512: 16 x 32; other x86 (AVX2): 8 x 16; ARM (NEON): 4 x 32."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or "") if "mtriple" in target.attrs else ""
    if triple.startswith(("arm", "aarch64")):
        return 4, 32
    try:
        if codegen.target_has_features(["avx512f"], target):
            return 16, 32
    except Exception:  # noqa: BLE001 - a CPU LLVM does not know: assume AVX2's registers
        pass
    return 8, 16


def tile_shape(sch) -> tuple[str, int, int, int]:
    """(kind, pixels, output-channel chunks, lanes per chunk) of the conv's register tile, read
    off the extents of the loops inside its reduction (oh_inner, ow_inner, [oc_chunk_inner],
    [batch lane], lanes; a float tile over rows has one unrolled pixel loop for the two)."""
    from tvm.tirx import ForKind

    names = {
        PACKED_CONV + "_update": "float",
        DOT_CONV + "_o_update": "dot",
        NCHW_CONV + "_update": "nchw",
        PACKED_DEPTHWISE + "_update": "depthwise",
        DEPTHWISE_DOT + "_update": "depthwise",
        DEPTHWISE_DOT + "_o_update": "depthwise_dot",
    }
    conv = next(b for b in _blocks(sch) if sch.get(b).name_hint in names)
    kind = names[sch.get(conv).name_hint]
    loops = sch.get_loops(conv)
    ext = [int(sch.get(loop).extent) for loop in loops]
    if kind == "float":  # (oh_i, ow_i) or pixels_i (unrolled), oc_chunk_i, batch lane, oc lane
        pixels = ext[-2]
        for loop, extent in zip(reversed(loops[:-3]), reversed(ext[:-3])):
            if sch.get(loop).kind != ForKind.UNROLLED:
                break
            pixels *= extent
        return kind, pixels, ext[-3], ext[-1]
    if kind == "dot":  # oh_i, ow_i, oc_chunk_i, batch lane; the 16 or 8 lanes are in the blockized update
        return kind, ext[-4] * ext[-3] * ext[-1], ext[-2], _block_lanes(sch.get(conv))
    if kind == "nchw":  # yy_i, xx_i, ff chunk, ff lane
        return kind, ext[-4] * ext[-3], ext[-2], ext[-1]
    if kind == "depthwise_dot":  # oh_i, ow_i, batch lane; the 16 lanes are in the blockized update
        return kind, ext[-3] * ext[-2] * ext[-1], 1, _block_lanes(sch.get(conv))
    return kind, ext[-4] * ext[-3] * ext[-2], 1, ext[-1]  # depthwise: oh_i, ow_i, batch lane, lanes


def tile_registers(sch, lanes: int) -> int:
    """Vector registers (of `lanes` 32-bit lanes) the conv's register tile keeps live in its
    reduction loop. Float: one accumulator per pixel and vector of output channels, the tile's
    weight vectors (each reused by every pixel, so the compiler holds them), the broadcast
    input. int8: the accumulators and `DOT_SPARE_REGISTERS` for the dot product's operands."""
    kind, pixels, chunks, chunk_lanes = tile_shape(sch)
    vectors = chunks * -(-chunk_lanes // lanes)  # vectors of output channels in the tile
    if kind in ("dot", "depthwise_dot"):
        return pixels * vectors + DOT_SPARE_REGISTERS
    return pixels * vectors + vectors + 1


def _blocks(sch) -> list:
    out, todo = [], [sch.get_sblock("root")]
    while todo:
        block = todo.pop()
        out.append(block)
        todo.extend(sch.get_child_blocks(block))
    return out[1:]


def register_limit(target: Any) -> Any:
    """A postprocessor that rejects candidates whose register tile cannot fit the target's
    vector registers (`tile_registers`): MetaSchedule then samples another, instead of
    measuring a tile that spills to the stack (on AVX2, 7 pixels of a 16-lane float chunk
    spill: docs/performance.md, "fp32 on a CPU")."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.postproc import PyPostproc

    lanes, regs = vector_registers(target)

    @derived_object
    class RegisterLimit(PyPostproc):
        def _initialize_with_tune_context(self, context) -> None:
            pass

        def apply(self, sch) -> bool:
            return tile_registers(sch, lanes) <= regs

        def clone(self):
            return register_limit(target)

    return RegisterLimit()


def space_generator(target: Any, kind: str, workload: Any = None) -> Any:
    """MetaSchedule's space generator for a task of `conv_kind` `kind` on `target` (a "dot"
    task's `workload` says which dot product: 16 or 8 lanes)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    intrin = None
    if kind == "dot":
        int8_dot.register()
        sch = Schedule(workload)
        intrin = _dot_intrinsic(sch, _conv_block(sch)[0], target)
    elif kind == "depthwise_dot":
        int8_dot.register()
        intrin = int8_dot.depthwise_intrinsic_for(target)
    postprocs = [
        register_limit(target),
        ms.postproc.DisallowDynamicLoop(),
        ms.postproc.RewriteParallelVectorizeUnroll(),  # realizes the sampled unroll depth
        ms.postproc.RewriteReductionBlock(),
    ]
    if kind in ("float", "nchw"):  # dot: weights already in the dot product's layout; depthwise: read once
        postprocs.append(ms.postproc.RewriteLayout())
    mutators = {ms.mutator.MutateTileSize(): 0.8, ms.mutator.MutateUnroll(): 0.2}
    bands = parallel_bands(target)
    return ms.space_generator.ScheduleFn(
        lambda sch: design_spaces(sch, intrin, bands), sch_rules=[], postprocs=postprocs, mutator_probs=mutators
    )
