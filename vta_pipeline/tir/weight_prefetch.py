"""Software prefetch of a conv's next block of weights, spread over the tiles of this one.

Why: a nest that reads each block of weights once (`spaces.packed_conv._schedule_weights_once`)
computes on a block for a few microseconds, then misses on every cache line of the next one:
in a network that block comes from memory, since the layers between two calls of a conv evict
its weights. The hardware prefetcher does not run ahead across blocks, so the memory time adds
to the compute instead of hiding under it. Prefetching the next block's lines a few per row
of tiles recovers much of that; all of a block's lines at the top of the block loop is a
burst the core cannot keep in flight (docs/performance.md, "Numbers behind the library's
choices"). The Winograd GEMM marks
its tile blocks under each block of output channels (`spaces.winograd`, version 3).

A schedule marks the innermost loop over output tiles (`sch.annotate(loop, ANNOTATION,
levels)`, `levels` the tile loops from the block loop in: it is their parent), and `insert`
puts at the top of each of that loop's iterations its share of the next block's lines. It runs
on scheduled functions before lowering, where both the tuner's builder (`boards.builder.fast_build`)
and the network's build (`build.build`) call it, so a candidate is timed as it is deployed. The
prefetch is an LLVM hint: it never faults and never changes a result, so a line past the
weights' end (the last block of the last thread) is harmless.

TVM 0.27 has no Python IR mutator: the path from the function's root to the marked loop is
rebuilt node by node, and expressions are substituted by binding variables
in an arithmetic analyzer.
"""

from __future__ import annotations

import math
from typing import Any

ANNOTATION = "vta.prefetch_next_block"
LINE_BYTES = 64
# llvm.prefetch(address, rw = read, locality = 3: keep in every level, cache = data)
_READ, _LOCALITY, _DATA = 0, 3, 1


def insert(mod: Any) -> Any:
    """`mod` with every marked loop of its scheduled PrimFuncs prefetching; unchanged where
    nothing is marked. The changed functions replace the old ones in `mod` itself (both callers
    hand it a module of their own, made by the pass before). Import-light: builder workers call it."""
    import tvm

    changed = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            body = _rewrite(func.body, [])
            if not body.same_as(func.body):
                changed[gv] = func.with_body(body)
    if not changed:
        return mod
    for gv, func in changed.items():
        mod[gv] = func
    return mod


def _rewrite(stmt: Any, loops: list[Any]) -> Any:
    """`stmt` with the marked loops under it rewritten (`loops`: the For nodes around it)."""
    from tvm import s_tir, tirx

    if isinstance(stmt, tirx.For):
        body = _rewrite(stmt.body, loops + [stmt])
        annotations = dict(stmt.annotations)
        if ANNOTATION in annotations:
            prefetch = _prefetch(stmt, loops, int(annotations.pop(ANNOTATION)))
            if prefetch is not None:
                body = tirx.SeqStmt([prefetch, body])
        elif body.same_as(stmt.body):
            return stmt
        return tirx.For(
            stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, annotations, stmt.step
        )
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rewrite(s, loops) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = _rewrite(stmt.block, loops)
        return stmt if block.same_as(stmt.block) else s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, s_tir.SBlock):
        body = _rewrite(stmt.body, loops)
        return (
            stmt
            if body.same_as(stmt.body)
            else s_tir.SBlock(
                stmt.iter_vars,
                stmt.reads,
                stmt.writes,
                stmt.name_hint,
                body,
                stmt.init,
                stmt.alloc_buffers,
                stmt.match_buffers,
                stmt.annotations,
            )
        )
    if isinstance(stmt, tirx.AttrStmt):
        body = _rewrite(stmt.body, loops)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    if isinstance(stmt, tirx.IfThenElse):
        then = _rewrite(stmt.then_case, loops)
        return stmt if then.same_as(stmt.then_case) else tirx.IfThenElse(stmt.condition, then, stmt.else_case)
    return stmt


def _reduction_realize(stmt: Any) -> Any:
    """The first block under `stmt` with a reduction axis (the conv's update), as realized."""
    from tvm import s_tir, tirx

    if isinstance(stmt, s_tir.SBlockRealize) and any(
        iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.block.iter_vars
    ):
        return stmt
    for child in _children(stmt):
        found = _reduction_realize(child)
        if found is not None:
            return found
    return None


def _prefetch(tile_loop: Any, loops: list[Any], levels: int) -> Any:
    """The statement that prefetches this tile's share of the next block's lines: of the
    buffers the update block under `tile_loop` reads, the largest whose region moves with the
    block loop (a conv's weights, where the schedule marks it), from the next block's start
    to the one after. None where no region moves by a constant stride."""
    from tvm import tirx

    realize = _reduction_realize(tile_loop.body)
    if realize is None or len(loops) < levels:
        return None
    tiles = loops[len(loops) - levels + 1 :] + [tile_loop]
    block_loop = loops[len(loops) - levels]
    moving = _moving_region(realize, block_loop, _loops_under(tile_loop.body) + tiles)
    if moving is None:
        return None
    buf, here, step = moving
    dtype = str(block_loop.extent.ty)
    per_line = LINE_BYTES * 8 // buf.dtype.bits
    lines = math.ceil(step / per_line)
    extents = [int(t.extent) for t in tiles]
    share = math.ceil(lines / math.prod(extents))
    tile = tirx.const(0, dtype)
    for t, extent in zip(tiles, extents):
        tile = tile * extent + t.loop_var
    i = tirx.Var("prefetch_line", dtype)
    line = tile * share + i
    address = buf.access_ptr("r", offset=here + step + line * per_line)
    call = tirx.call_llvm_intrin("void", "llvm.prefetch.p0", address, _READ, _LOCALITY, _DATA)
    body = tirx.IfThenElse(line < lines, tirx.Evaluate(call), None)
    return tirx.For(i, tirx.const(0, dtype), tirx.const(share, dtype), tirx.ForKind.UNROLLED, body)


def _moving_region(realize: Any, block_loop: Any, inner: list[Any]) -> tuple[Any, Any, int] | None:
    """(buffer, flat index of its region's start in this iteration of `block_loop`, how far that
    start moves per iteration) of the largest buffer the block reads (not the one it writes)
    whose region moves by a positive constant; `inner`: the loops whose variables are at 0 at
    the region's start."""
    import tvm
    from tvm import tirx
    from tvm.sym import Analyzer

    update = realize.block
    reads = [r for r in update.reads if not any(r.source.same_as(w.source) for w in update.writes)]
    dtype = str(block_loop.extent.ty)
    for region in sorted(reads, key=lambda r: -math.prod(int(d) for d in r.source.shape)):
        shape = [int(d) for d in region.source.shape]
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]

        def start(block_index: Any) -> Any:
            ana = Analyzer()
            for loop in inner:
                ana.bind(loop.loop_var, tirx.const(0, str(loop.extent.ty)), allow_override=True)
            if not block_index.same_as(block_loop.loop_var):
                ana.bind(block_loop.loop_var, block_index)
            for iv, value in zip(update.iter_vars, realize.iter_values):
                ana.bind(iv.var, ana.simplify(value))
            return ana.simplify(sum(rng.min * stride for rng, stride in zip(region.region, strides)))

        step = Analyzer().simplify(start(tirx.const(1, dtype)) - start(tirx.const(0, dtype)))
        if isinstance(step, tvm.tirx.IntImm) and step.value > 0:
            return region.source, start(block_loop.loop_var), int(step.value)
    return None


def _loops_under(stmt: Any) -> list[Any]:
    """The For nodes under `stmt`."""
    from tvm import tirx

    return ([stmt] if isinstance(stmt, tirx.For) else []) + [
        loop for child in _children(stmt) for loop in _loops_under(child)
    ]


def _children(stmt: Any) -> list[Any]:
    """The statements directly under `stmt` that the walks above descend into (a realize's
    block's body, not the block: it holds no loops of its own)."""
    from tvm import s_tir, tirx

    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block.body]
    if isinstance(stmt, (tirx.For, tirx.AttrStmt, s_tir.SBlock)):
        return [stmt.body]
    if isinstance(stmt, tirx.IfThenElse):
        return [stmt.then_case]
    return []
