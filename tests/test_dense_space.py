"""A float dense layer at small batch (the classifier) gets a space where each thread computes
its own contiguous range of output columns from its own contiguous run of the weights, laid
out [chunk, k, lane] at build time; its builds compute what the layer computes; a task that
MetaSchedule's generic space searched before is kept and searched again in this one."""

from __future__ import annotations

import numpy as np
import tvm
from loop_nests import candidates, rows_by_thread
from space_research import generic_then_current
from tvm.s_tir import Schedule
from tvm.script import tirx as T

from vta_pipeline import spaces
from vta_pipeline.search.trial_log import read_state
from vta_pipeline.spaces import dense as dense_space
from vta_pipeline.spaces.upgrade import ARCHIVED, archive_name, upgrades

HERE = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})  # AVX2 (what CI runs)


def dense(batch: int, k: int, n: int, dtype: str = "float32", relu: bool = True):
    """y = relu(x @ w + b), as Relax lowers a classifier: w a layout-free parameter."""

    @T.prim_func(s_tir=True)
    def main(
        x: T.Buffer((batch, k), dtype),
        w: T.Buffer((k, n), dtype),
        b: T.Buffer((n,), dtype),
        y: T.Buffer((batch, n), dtype),
    ):
        T.func_attr({"layout_free_buffers": [1, 2], "tirx.noalias": True})
        mm = T.sblock_alloc_buffer((batch, n), dtype)
        biased = T.sblock_alloc_buffer((batch, n), dtype)
        for i, j, r in T.grid(batch, n, k):
            with T.sblock("matmul"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    mm[vi, vj] = T.cast(0, dtype)
                mm[vi, vj] = mm[vi, vj] + x[vi, vr] * w[vr, vj]
        for i, j in T.grid(batch, n):
            with T.sblock("bias"):
                vi, vj = T.axis.remap("SS", [i, j])
                biased[vi, vj] = mm[vi, vj] + b[vj]
        for i, j in T.grid(batch, n):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.max(biased[vi, vj], T.cast(0, dtype)) if relu else biased[vi, vj]

    return tvm.IRModule({"main": main})


def sampled(mod, seed: int = 0) -> list:
    """Every design space of the task as a candidate is built (RewriteLayout among the
    postprocessors: the weights' build-time layout)."""
    return candidates(mod, HERE, dense_space.space_generator(), seed)


def test_the_space_takes_float_dense_layers_whose_weights_outweigh_their_activations():
    assert dense_space.applies(dense(1, 96, 40), HERE)
    assert dense_space.applies(dense(4, 1280, 1000, relu=False), HERE)
    assert not dense_space.applies(dense(64, 96, 40), HERE), "a batch above the columns is a GEMM"
    assert not dense_space.applies(dense(1, 96, 4), HERE), "too few columns for one vector"
    assert not dense_space.applies(dense(1, 96, 40, "int32"), HERE), "integer layers take the dot-product rules"
    assert not dense_space.applies(dense(1, 96, 40), tvm.target.Target("cuda"))
    assert spaces.label(HERE, dense(1, 1280, 1000)) == f"dense:{dense_space.VERSION}"


def test_there_is_one_space_per_chunk_width_that_divides_the_columns():
    sch = Schedule(dense(1, 1280, 1000))
    assert dense_space.lane_widths(sch, dense_space._reduction_block(sch)) == [8, 10, 20, 25, 40, 50]
    assert len(sampled(dense(1, 96, 40))) == 4  # 8, 10, 20 and 40


def _weights_read(sch):
    """The buffer the matmul's update reads its weights from (after RewriteLayout)."""
    from loop_nests import _blocks

    found, _ = _blocks(sch.mod["main"])
    (update,) = [r.block for _, r in found if r.block.name_hint == "matmul_update"]
    return update.reads[-1].source


def test_each_thread_writes_one_contiguous_range_of_columns_from_its_own_run_of_weights():
    for sch in sampled(dense(1, 1280, 1000)):
        (first, last), (first1, last1) = rows_by_thread(sch.mod, threads=2, row_axis=1)
        w = _weights_read(sch)
        lanes = int(w.shape[-1])
        assert (first, last1, first1) == (0, 999, last + 1), f"{lanes} lanes"
        assert abs((last + 1) - (1000 - first1)) <= lanes, "the threads' shares differ by at most one chunk"
        # [chunk, k, ..., lane]: a thread's chunks are one contiguous run of the weights
        assert [int(d) for d in w.shape][0] == 1000 // lanes and np.prod([int(d) for d in w.shape[1:-1]]) == 1280


def test_a_build_of_every_space_computes_the_layer():
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((1, 96), (96, 40), (40,)))
    want = np.maximum(x @ w + b, 0)
    for sch in sampled(dense(1, 96, 40), seed=3):
        lib = tvm.compile(sch.mod, target=HERE)  # the weights' layout rewrite runs inside it here
        y = tvm.runtime.tensor(np.zeros((1, 40), "float32"))
        lib["main"](*(tvm.runtime.tensor(a) for a in (x, w, b)), y)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_generic_search_is_kept_and_the_task_searched_again_in_the_dense_space(
    board, host_target, tmp_path, monkeypatch
):
    assert upgrades("metaschedule", "dense:1") and not upgrades("dense:1", "dense:1")
    assert not upgrades("injective:1", "dense:1") and not upgrades("metaschedule", "injective:1")
    after, work = generic_then_current(
        dense(1, 64, 16), "fused_matmul_add", 2 * 64 * 16, "dense-1x64x16", host_target, board, tmp_path, monkeypatch
    )
    assert read_state(work)["space"] == f"dense:{dense_space.VERSION}"
    assert (work / archive_name("metaschedule") / ARCHIVED).exists()
    assert after.trials == after.trials_this_run >= 1
