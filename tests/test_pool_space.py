"""A packed max pool gets a space where each thread pools one band of output rows (the rows the
packed conv before it wrote on the same core); its builds compute the pool; a task that
MetaSchedule's generic space searched before is kept and searched again in this one."""

from __future__ import annotations

import numpy as np
import tvm
from loop_nests import candidates, rows_by_thread
from space_research import generic_then_current
from tvm import relax
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from vta_pipeline import spaces
from vta_pipeline.search.trial_log import read_state
from vta_pipeline.spaces import pool as pool_space
from vta_pipeline.spaces.upgrade import ARCHIVED, archive_name, upgrades
from vta_pipeline.tir import schedule_rules

HERE = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 2})  # AVX2 (what CI runs)
PACKED = (1, 2, 32, 32, 1, 16)  # NCHW1n16c: 32 channels, 32 x 32


def pool(shape=PACKED, layout="NCHW1n16c", kind="max", dtype="float32") -> tvm.IRModule:
    """resnet's stem pool (3 x 3, stride 2, padding 1) as Relax legalizes it: TOPI's pad and pool
    blocks in one function."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    f = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(f(x, (3, 3), (2, 2), (1, 1, 1, 1), layout=layout, out_layout=layout))
        bb.emit_func_output(y)
    legal = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for gv, f in legal.functions.items() if gv.name_hint != "main"]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def sampled(mod) -> list:
    return candidates(mod, HERE, pool_space.space_generator())


def test_the_space_takes_packed_max_pools_on_cpus():
    assert pool_space.applies(pool(), HERE)
    assert pool_space.applies(pool(dtype="int8"), HERE)  # an int8 network's pool
    assert not pool_space.applies(pool((1, 32, 32, 32), "NCHW"), HERE), "an unpacked pool"
    assert not pool_space.applies(pool(kind="avg"), HERE), "an avg pool: a sum and a division"
    assert not pool_space.applies(pool(), tvm.target.Target("cuda"))
    assert spaces.label(HERE, pool()) == f"pool:{pool_space.VERSION}"


def test_each_thread_pools_one_band_of_output_rows_in_every_point():
    # the stem conv before it wrote its output rows in two bands, one per core: each thread
    # reads the input rows of its own band (and one row of the other's)
    spaces = sampled(pool())
    assert len(spaces) == len(pool_space.DEPTHS) * len(pool_space.TAPS)
    for sch in spaces:
        assert rows_by_thread(sch.mod) == [(0, 7), (8, 15)], sch.trace
        assert rows_by_thread(sch.mod, threads=4) == [(0, 3), (4, 7), (8, 11), (12, 15)], sch.trace


def test_the_generic_space_splits_the_channel_blocks_instead():
    # why the space exists: MetaSchedule's generic space gives a thread whole channel blocks, every row of them
    schedule_rules.register()  # TOPI's pool rule left to the generic rules, as the pipeline does
    ctx = ms.TuneContext(mod=pool(), target=HERE, space_generator="post-order-apply", task_name="pool", rand_state=0)
    for space in ctx.generate_design_space():
        sch = Schedule(pool())
        space.trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        if all(p.apply(sch) for p in ctx.space_generator.postprocs):
            assert rows_by_thread(sch.mod)[0] == (0, 15), sch.trace


def test_a_build_of_every_point_computes_the_pool():
    x = np.random.default_rng(0).standard_normal(PACKED).astype("float32")
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1), (0, 0), (0, 0)], constant_values=-np.inf)
    want = np.full((1, 2, 16, 16, 1, 16), -np.inf, "float32")
    for i in range(3):
        for j in range(3):
            want = np.maximum(want, padded[:, :, i : i + 32 : 2, j : j + 32 : 2])
    for sch in sampled(pool()):
        lib = tvm.compile(sch.mod, target=HERE)
        y = tvm.runtime.tensor(np.zeros(want.shape, "float32"))
        lib["main"](tvm.runtime.tensor(x), y)
        np.testing.assert_array_equal(y.numpy(), want)


def test_a_generic_search_is_kept_and_the_task_searched_again_in_the_pool_space(
    board, host_target, tmp_path, monkeypatch
):
    assert upgrades("metaschedule", "pool:1") and not upgrades("pool:1", "pool:1")
    assert not upgrades("dense:1", "pool:1")
    after, work = generic_then_current(
        pool(), "max_pool2d", 9 * 2 * 16 * 16 * 16, "pool-32", host_target, board, tmp_path, monkeypatch
    )
    assert read_state(work)["space"] == f"pool:{pool_space.VERSION}"
    assert (work / archive_name("metaschedule") / ARCHIVED).exists()
    assert after.trials == after.trials_this_run == len(pool_space.DEPTHS) * len(pool_space.TAPS)
