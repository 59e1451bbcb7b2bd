"""Functions without a reduction (the input's quantize into the packed stem's layout, the
unpack before the pool) get a space that keeps the output's loops: each point inlines the
whole function into one parallel nest, and a build from any point is bit for bit the network's
integer emulation. A task that exhausted an older space searches this one."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from int8_nets import Blocks, randomize, to_relax
from tvm import relax
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.target import codegen

from vta_pipeline import spaces
from vta_pipeline import tune as tuning
from vta_pipeline.boards import BoardSpec
from vta_pipeline.build import LIB, build_network
from vta_pipeline.config import MeasureConfig, TuneConfig
from vta_pipeline.extract import load_tasks
from vta_pipeline.passes import emulate
from vta_pipeline.passes.graph_pack import PackParams, graph_pack
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.passes.quantize import QuantizeParams, quantize
from vta_pipeline.search.trial_log import read_state, task_work_dir
from vta_pipeline.spaces import design_space
from vta_pipeline.spaces import injective as injective_space
from vta_pipeline.tir import int8_dot, intrin_registry

HERE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2 (what CI runs)
host_has_avx2 = bool(
    codegen.target_has_features(["avx2"], tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}))
)
QUANTIZE_INPUT = "multiply_tir_round"  # the image's quantize, fused with the stem's pad and transpose


@pytest.fixture(scope="module")
def int8_stem_network():
    """An int8 network whose stem is packed: its input is quantized, padded to 4 channels and
    transposed to [1, 1, H, W, 1, 4] in one function; the output is unpacked in another."""
    intrin_registry.load()
    int8_dot.register()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(to_relax(randomize(Blocks(), 0), x), QuantizeParams(skip_conv_layers=()))
    packed, _ = graph_pack(
        q, PackParams(layout="x86", stem=True, start_name="nn.conv2d", stop_name="nn.relu", stop_name_idx=4)
    )
    return q, lower_for_tuning(packed), x


def _tasks(lowered):
    return ms.relax_integration.extract_tasks(lowered, tvm.target.Target(HERE))


def _injective(lowered):
    target = tvm.target.Target(HERE)
    return [t for t in _tasks(lowered) if injective_space.applies(t.dispatched[0], target)]


def test_the_space_takes_the_functions_without_a_reduction_on_cpus(int8_stem_network):
    _, lowered, _ = int8_stem_network
    target = tvm.target.Target(HERE)
    tasks = _tasks(lowered)
    names = {t.task_name for t in _injective(lowered)}
    assert any(QUANTIZE_INPUT in n and "transpose" in n for n in names)  # the input's quantize + layout
    assert any("transpose" in n and QUANTIZE_INPUT not in n for n in names)  # the unpack at the end
    for t in tasks:  # convs and pools (reductions) keep their spaces
        if "conv2d" in t.task_name or "pool" in t.task_name:
            assert not injective_space.applies(t.dispatched[0], target), t.task_name
    quantize_input = next(t for t in tasks if QUANTIZE_INPUT in t.task_name and "transpose" in t.task_name)
    assert not injective_space.applies(quantize_input.dispatched[0], tvm.target.Target("cuda"))  # GPUs: not here


def test_each_point_is_one_nest_in_the_outputs_order_parallel_outside(int8_stem_network):
    _, lowered, _ = int8_stem_network
    task = next(t for t in _injective(lowered) if QUANTIZE_INPUT in t.task_name and "transpose" in t.task_name)
    wl = task.dispatched[0]
    ctx = ms.TuneContext(
        mod=wl,
        target=tvm.target.Target(HERE),
        space_generator=design_space(tvm.target.Target(HERE), wl),
        task_name="t",
        rand_state=1,
    )
    spaces = ctx.generate_design_space()
    # flat + (depth 0, 1, 2) x (vectorize, unroll, plain) where they exist: the output
    # [1, 1, 16, 16, 1, 4] has three loops longer than 1
    assert len(spaces) == 10
    bodies = [s.mod.script() for s in spaces]
    for body in bodies:
        assert "alloc_buffer" not in body  # multiply, round, clamp, cast, pad, reshape: inlined, no buffer between
        assert body.count('T.sblock("') - body.count('T.sblock("root")') == 1  # one block, the output's
    assert sum("T.parallel(" in b for b in bodies) == 7  # flat, and depth 1 and 2 with each inner choice
    assert any("T.vectorized(T.int64(4))" in b for b in bodies)  # the 4 channels of a pixel as one vector
    assert any("T.unroll(T.int64(4))" in b for b in bodies)
    # the flat point is MetaSchedule's own schedule: everything fused, vectors of 64
    assert "T.vectorized(T.int64(64))" in bodies[0]


def test_a_loop_too_long_is_split_into_vectors_and_never_unrolled():
    a = tvm.te.placeholder((1, 3, 8, 200), "float32", name="a")
    doubled = tvm.te.compute(a.shape, lambda *i: a(*i) * 2.0, name="double")
    wl = tvm.IRModule({"main": tvm.te.create_prim_func([a, doubled])})
    assert injective_space.applies(wl, tvm.target.Target(HERE))
    bodies = [s.mod.script() for s in injective_space.design_spaces(Schedule(wl))]
    assert not any("T.unroll(T.int64(200))" in b for b in bodies)
    assert any(
        f"T.vectorized({injective_space.VECTOR_LANES})" in b
        or f"T.vectorized(T.int64({injective_space.VECTOR_LANES}))" in b
        for b in bodies
    )


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
def test_a_build_from_every_point_is_bit_identical_to_the_emulation(int8_stem_network, tmp_path):
    q, lowered, x = int8_stem_network
    y_emu, _ = emulate.run(q, [x])
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    target = tvm.target.Target(HERE)
    tasks = _injective(lowered)
    spaces = {t.task_name: injective_space.design_spaces(Schedule(t.dispatched[0])) for t in tasks}
    for point in range(max(len(s) for s in spaces.values())):
        db_dir, out = tmp_path / f"db{point}", tmp_path / f"out{point}"
        db_dir.mkdir(), out.mkdir()
        db = ms.database.JSONDatabase(work_dir=str(db_dir))
        for t in tasks:  # each injective function built from its point-th space (its last where fewer)
            sch = spaces[t.task_name][min(point, len(spaces[t.task_name]) - 1)]
            db.commit_tuning_record(
                ms.database.TuningRecord(sch.trace, db.commit_workload(t.dispatched[0]), [1e-3], target)
            )
        build_network(tmp_path / "extract", HERE, out, best_db_dir=db_dir)
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(out / LIB)), tvm.cpu())
        assert np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), y_emu), f"point {point}"


def test_a_task_that_exhausted_an_older_space_searches_this_one(micronet, board, host_target, tmp_path, monkeypatch):
    # a store tuned before this space: MetaSchedule's one generic schedule of micronet's
    # reshape, measured, the search exhausted
    _, extracted = micronet
    task = next(t for t in load_tasks(extracted.path) if t.name.startswith("reshape"))
    work = task_work_dir(tmp_path, host_target.id, task.workload_hash)
    args = (
        extracted.path / task.file,
        task.name,
        task.flops,
        task.workload_hash,
        host_target.target_json,
        BoardSpec(board.host, board.port, board.key, 1),
        TuneConfig(trials_per_task=8, trials_per_batch=8),
        MeasureConfig(number=2, repeat=1, timeout_s=60),
        work,
    )
    monkeypatch.setattr(spaces, "design_space", lambda target, wl, failures=None: "post-order-apply")
    monkeypatch.setattr(spaces, "label", lambda target, wl: "metaschedule")
    before = tuning.tune_task(tuning.TaskJob(*args))
    assert (before.trials, before.stopped, read_state(work)["space"]) == (1, "search-exhausted", "metaschedule")
    monkeypatch.undo()

    after = tuning.tune_task(tuning.TaskJob(*args))  # the same budget, a new space: searched, not "finished"
    assert read_state(work)["space"] == f"injective:{injective_space.VERSION}"
    assert after.stopped == "search-exhausted" and after.trials_this_run >= 3
    assert after.trials == 1 + after.trials_this_run
    assert after.best_latency_ms <= before.best_latency_ms
    bigger = list(args)
    bigger[6] = TuneConfig(trials_per_task=16, trials_per_batch=8)
    again = tuning.tune_task(tuning.TaskJob(*bigger))  # exhausted this space: stays so, at any budget
    assert again.trials_this_run == 0 and again.stopped == "search-exhausted"
