"""The builder and runner pools: workers that outlive a batch and a task, so a process pays
TVM's import once per worker instead of once per batch (the pipeline's tuning overhead)."""

import os

import psutil
import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from vta_pipeline.boards import BoardSpec, pools
from vta_pipeline.config import MeasureConfig

MEASURE = MeasureConfig(number=2, repeat=1, timeout_s=60)


def _add_one(n=64):
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


@pytest.fixture(autouse=True)
def fresh_pools():
    pools.close_all()
    yield
    pools.close_all()


def test_a_second_batch_and_a_second_task_reuse_the_same_builder_workers(host_target):
    target = host_target.tvm_target()
    before = _children()
    with pools.builder(60, workers=2) as b:
        first = b.build([ms.builder.BuilderInput(_add_one(), target)] * 2)
    workers = _children() - before
    assert all(r.error_msg is None and os.path.exists(r.artifact_path) for r in first)
    assert workers, "the pool's worker processes stay up between leases"
    with pools.builder(60, workers=2) as b:  # the next task's lease
        second = b.build([ms.builder.BuilderInput(_add_one(32), target)] * 2)
    assert all(r.error_msg is None for r in second)
    assert _children() - before == workers  # no new process: no TVM import per batch
    assert pools.pool_counts()["builders"] == 1


def test_a_build_error_names_the_candidate_failure_and_the_pool_goes_on(host_target):
    target = host_target.tvm_target()
    sch = Schedule(_add_one())
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    sch.bind(loop, "threadIdx.x")  # GPU threads: no CPU build of this exists
    bad = sch.mod
    with pools.builder(60, workers=1) as b:
        broken, ok = b.build([ms.builder.BuilderInput(bad, target), ms.builder.BuilderInput(_add_one(), target)])
    assert broken.artifact_path is None and "LocalBuilder: An exception occurred" in broken.error_msg
    assert ok.error_msg is None


def test_idle_pools_beyond_the_kept_few_are_shut_down():
    for timeout in range(pools.IDLE_KEPT + 2):
        with pools.builder(30 + timeout, workers=1):
            pass
    assert pools.pool_counts()["builders"] == pools.IDLE_KEPT
    pools.close_all()
    assert pools.pool_counts() == {"builders": 0, "runners": 0}


def test_the_shared_runner_measures_on_the_board_and_is_shared_by_concurrent_leases(board, host_target):
    target = host_target.tvm_target()
    mod = _add_one()
    spec = BoardSpec(board.host, board.port, board.key, 2)
    with pools.builder(60, workers=1) as b:
        (built,) = b.build([ms.builder.BuilderInput(mod, target)])
    args = ms.arg_info.ArgInfo.from_entry_func(mod)
    with pools.runner(spec, MEASURE) as r1, pools.runner(spec, MEASURE) as r2:
        assert r1 is r2
        futures = r1.run([ms.runner.RunnerInput(built.artifact_path, "cpu", args)] * 3)
        results = [f.result() for f in futures]
    assert all(res.error_msg is None and 0 < float(res.run_secs[0]) < 1 for res in results)
    assert pools.pool_counts()["runners"] == 1
    # another measure config is another pool: its deadline differs
    with pools.runner(spec, MeasureConfig(number=1, repeat=1, timeout_s=30)):
        assert pools.pool_counts()["runners"] == 2
