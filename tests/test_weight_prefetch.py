"""The next block of weights, prefetched by the nest that reads each block once.

`vta_pipeline/tir/weight_prefetch.py` inserts, at build time, prefetches into the loops a schedule
marks. These tests take real candidates of the packed-conv space for a conv whose weights
outweigh its activations (its third design space marks its innermost tile loop) and check
what the rewrite must guarantee: the lines it prefetches are exactly the next block's, spread
over the tiles of this one; the machine code has them; the kernel computes the same bits as
without them; and a function nothing marks is left as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from test_packed_conv_space import HERE, Wide, _packed_tasks, _sample, host_has_avx2
from tvm import tirx
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.sym import Analyzer

from vta_pipeline.boards.builder import fast_build
from vta_pipeline.passes.graph_pack import PackParams, graph_pack
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.tir import intrin_registry, weight_prefetch


@pytest.fixture(scope="module")
def candidates():
    """A candidate of each design space of Wide's conv: (rows, rows over pixels, weights once)."""
    from int8_nets import randomize, to_relax

    intrin_registry.load()
    model = randomize(Wide(), 0)
    x = np.random.default_rng(0).standard_normal((1, 64, 4, 4)).astype("float32")
    packed, _ = graph_pack(to_relax(model, x), PackParams(stop_name="nn.relu"))
    (task,) = _packed_tasks(lower_for_tuning(packed), HERE)
    wl = task.dispatched[0]
    found = {}
    for seed in range(1, 60):
        sch = _sample(wl, HERE, seed)
        if sch is not None:
            found.setdefault(seed % 3, sch)
        if len(found) == 3:
            return [found[i] for i in range(3)]
    raise AssertionError(f"only the spaces {sorted(found)} passed the postprocessors")


def _prepared(sch):
    """What a build compiles: the weights' layout rewrite removed (they arrive pre-packed)."""
    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)


def _prefetch_loops(stmt, around=()):
    """(the loops around, the loop) of each loop `insert` added."""
    from tvm import s_tir

    if isinstance(stmt, tirx.For):
        if stmt.loop_var.name == "prefetch_line":
            return [(list(around), stmt)]
        return _prefetch_loops(stmt.body, (*around, stmt))
    if isinstance(stmt, tirx.SeqStmt):
        return [found for s in stmt.seq for found in _prefetch_loops(s, around)]
    if isinstance(stmt, s_tir.SBlockRealize):
        return _prefetch_loops(stmt.block.body, around)
    if isinstance(stmt, (s_tir.SBlock, tirx.AttrStmt)):
        return _prefetch_loops(stmt.body, around)
    return []


def _weights(func):
    """The conv's weights: its largest parameter."""
    return max(func.params, key=lambda b: int(np.prod([int(d) for d in b.shape])))


def assert_prefetches_the_next_blocks(func, levels: int) -> None:
    """`func` (after `insert`) has one prefetch loop, `levels` tile loops under its block loop,
    all under one parallel loop; and over the tiles of each block, for the first and the last
    parallel iteration, it prefetches every line of that iteration's next block of weights
    (its largest parameter, laid out [parallel, block, rest]), each once, and nothing else."""
    assert weight_prefetch.ANNOTATION not in func.script()
    ((around, loop),) = _prefetch_loops(func.body)
    parallel, block_loop, tiles = around[0], around[-levels - 1], around[-levels:]
    assert parallel.kind == tirx.ForKind.PARALLEL
    condition, call = loop.body.condition, loop.body.then_case.value
    assert "llvm.prefetch" in call.script()
    # llvm.prefetch(tvm_access_ptr(type, data, offset, extent, mask), rw, locality, cache)
    (pointer,) = [a for a in call.args if "tvm_access_ptr" in str(getattr(a, "op", ""))]
    weights = _weights(func)
    assert pointer.args[1].args[0].same_as(weights)  # the data of the weights
    offset = pointer.args[2]
    lanes = 64 * 8 // weights.dtype.bits
    blocks = int(block_loop.extent)
    per_block = int(np.prod([int(d) for d in weights.shape])) // int(parallel.extent) // blocks

    def lines_prefetched(chunk: int, block: int) -> list[int]:
        out = []
        for tile in np.ndindex(*[int(t.extent) for t in tiles]):
            for line in range(int(loop.extent)):
                ana = Analyzer()
                for var, value in (
                    (parallel.loop_var, chunk),
                    (block_loop.loop_var, block),
                    (loop.loop_var, line),
                    *zip([t.loop_var for t in tiles], tile),
                ):
                    ana.bind(var, tirx.const(int(value), "int64"))
                if int(ana.simplify(condition)):
                    out.append(int(ana.simplify(offset)))
        return out

    for chunk in (0, int(parallel.extent) - 1):
        for block in range(blocks - 1):
            got = lines_prefetched(chunk, block)
            start = (chunk * blocks + block + 1) * per_block
            assert sorted(got) == list(range(start, start + per_block, lanes)), (chunk, block, got)


def test_each_tile_prefetches_its_share_of_the_next_block_of_weights(candidates):
    """Over the tiles of one block of input channels, the marked nest prefetches every cache
    line of the next block of its weights, each once, and nothing else: the block a thread
    reads next, whose lines would otherwise each miss when its first tile reaches them."""
    assert_prefetches_the_next_blocks(weight_prefetch.insert(_prepared(candidates[2]))["main"], levels=2)


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
def test_the_kernel_prefetches_and_computes_the_same_bits(candidates):
    """The machine code has the prefetches (`prefetcht0`: into every cache level), and the kernel
    writes exactly what the same candidate without them writes."""
    target = tvm.target.Target(HERE)
    marked = candidates[2]
    plain = _prepared(marked)
    (gv,) = plain.get_global_vars()
    func = plain[gv]
    with_ = fast_build(marked.mod, target, None)  # the tuner's builder: it inserts them
    without = tvm.driver.build(plain, target=target)  # the same nest, the mark left unread
    assert "prefetcht0" in with_.inspect_source("asm")
    assert "prefetcht0" not in without.inspect_source("asm")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in b.shape]).astype(str(b.dtype)) for b in func.params]
    outs = []
    for lib in (with_, without):
        tensors = [tvm.runtime.tensor(a, tvm.cpu()) for a in args]
        lib[gv.name_hint](*tensors)
        outs.append(tensors[-1].numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_function_nothing_marks_is_returned_as_it_was(candidates):
    """The nests over rows read a block of weights in every row of tiles: nothing to prefetch."""
    for sch in candidates[:2]:
        mod = _prepared(sch)
        assert weight_prefetch.insert(mod)["main"].same_as(mod["main"])
