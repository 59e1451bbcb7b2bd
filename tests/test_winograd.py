"""Winograd F(4x4, 3x3) for packed float convs (`--winograd`): which convs it takes, that the
network it builds equals PyTorch's, and that its design space tunes for real.

`passes/winograd.py` rewrites graph pack's float 3x3 stride-1 convs (output at least 14
wide) into a weight transform, which the build folds into a constant, and a Winograd conv
with the epilogue fused in; `winograd_space.py` schedules those tasks. The weights of these
tests are random, the input seeded, the tuning real (MetaSchedule on this CPU, 4 trials).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
from int8_nets import randomize, to_relax
from torch import nn
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
from tvm.target import codegen

from vta_pipeline import extract
from vta_pipeline.boards import builder as ms_build
from vta_pipeline.build import LIB, build_network
from vta_pipeline.passes import winograd
from vta_pipeline.passes.graph_pack import PackParams, graph_pack
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.spaces import design_space
from vta_pipeline.spaces import label as space_label
from vta_pipeline.spaces import winograd as winograd_space

HERE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2 (CI's floor)
host_has_avx2 = bool(
    codegen.target_has_features(["avx2"], tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}))
)


class Net(nn.Module):
    """A stem and a max pool (where packing starts), then at 18 x 18: a 3x3 conv (taken), a
    3x3 conv with a residual add (taken); a strided 3x3 conv and a 1x1 (not taken); at 9 x 9,
    narrower than MIN_SIZE: a 3x3 conv (not taken)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.proj = nn.Conv2d(32, 16, 1)
        self.small = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + y)
        y = torch.relu(self.small(self.proj(torch.relu(self.down(y)))))
        return nn.functional.adaptive_avg_pool2d(y, 1)


def _network(small_below: int):
    model = randomize(Net(), 0)
    x = np.random.default_rng(0).standard_normal((1, 3, 36, 36)).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    packed, _ = graph_pack(to_relax(model, x), PackParams())
    rewritten, count = winograd.rewrite(packed, small_below=small_below)
    return lower_for_tuning(rewritten), count, x, ref


@pytest.fixture(scope="module")
def network():
    """The test network with F(4x4, 3x3) at 18 x 18."""
    return _network(small_below=0)


@pytest.fixture(scope="module")
def network_f2():
    """The same network with F(2x2, 3x3) at 18 x 18 (narrower than small_below)."""
    return _network(small_below=28)


def _tasks(lowered):
    return ms.relax_integration.extract_tasks(lowered, tvm.target.Target(HERE))


def _winograd_tasks(lowered):
    target = tvm.target.Target(HERE)
    return [t for t in _tasks(lowered) if winograd_space.applies(t.dispatched[0], target)]


def test_only_the_wide_stride_1_3x3_convs_become_winograd_with_their_epilogue_fused(network):
    lowered, count, _, _ = network
    assert count == 2
    names = sorted(gv.name_hint for gv in lowered.functions)
    wino = [n for n in names if "winograd" in n]
    # c1 (+ bias, relu) and c2 (+ bias, residual add, relu): one fused function each
    assert len(wino) == 2 and all("relu" in n for n in wino), names
    assert any("add2" in n for n in wino), names  # the residual add fused in too
    # the weight transform ran at lowering on the constant weights: no function of it is left
    assert not any(winograd.WEIGHT in n for n in names), names
    # the strided conv, the 1x1 and the 9 x 9 conv stay direct packed convs
    assert sum("conv2d_packed" in n and "winograd" not in n for n in names) == 3, names
    target = tvm.target.Target(HERE)
    labels = {t.task_name: space_label(target, t.dispatched[0]) for t in _tasks(lowered)}
    assert (
        sorted(v for v in labels.values() if v.startswith("winograd")) == [f"winograd:{winograd_space.VERSION}"] * 2
    ), labels
    assert not winograd_space.applies(_winograd_tasks(lowered)[0].dispatched[0], tvm.target.Target({"kind": "cuda"}))


def test_a_winograd_task_is_read_as_the_conv_it_computes(network):
    """Task extraction names a Winograd task's op and gives the workload of its direct conv
    (`conv_gap.py` compares it with ONNX Runtime's conv by that workload; `--task-filter
    conv2d` keeps it)."""
    assert (extract.WINOGRAD_PAD, extract.WINOGRAD_GEMM, extract.WINOGRAD_INVERSE) == (
        winograd.PAD,
        winograd.GEMM,
        winograd.INVERSE,
    )
    lowered, _, _, _ = network
    found = sorted(extract.conv2d_workload(t.dispatched[0]) for t in _winograd_tasks(lowered))
    # (batch, height, width, in, out, kh, kw, pad_h, pad_w, stride_h, stride_w): c1 16 -> 32, c2 32 -> 32
    assert found == [("packed_conv2d_winograd", [1, 18, 18, c, 32, 3, 3, 1, 1, 1, 1]) for c in (16, 32)]
    assert "packed_conv2d_winograd" in extract.CONV_OPS


def test_float_convs_in_other_layouts_are_left_alone():
    x = np.zeros((1, 16, 16, 16), "float32")
    plain = to_relax(randomize(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1)), 0), x)
    assert winograd.rewrite(plain)[1] == 0  # NCHW, not packed


def _sample(wl, seed: int):
    target = tvm.target.Target(HERE)
    ctx = ms.TuneContext(
        mod=wl, target=target, space_generator=design_space(target, wl), task_name="t", rand_state=seed
    )
    (sch,) = ctx.generate_design_space()
    assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
    return sch


def test_the_space_unrolls_the_transforms_and_tiles_the_gemm_in_registers(network):
    lowered, _, _, _ = network
    wl = _winograd_tasks(lowered)[0].dispatched[0]
    sch = _sample(wl, 3)
    text = sch.mod.script()
    loops = re.findall(r"for (\w+) in T\.(\w+)\(T\.int64\((\d+)\)\)", text)
    # the transforms' 6-tap passes (rows, data, columns, inverse): unrolled, never a loop
    assert sum(kind == "unroll" and n == "6" for _, kind, n in loops) >= 12, loops
    # the channel lanes: vectorized in every block that computes or writes back (16 lanes;
    # the GEMM's write-back spans its 2 chunks)
    assert sum(kind == "vectorized" and n in ("16", "32") for _, kind, n in loops) >= 12, loops
    # one parallel loop per stage (data transform, GEMM, inverse); none of them unrolled
    parallel = [name for name, kind, _ in loops if kind == "parallel"]
    assert len(parallel) == 3, loops
    assert not any(kind == "unroll" and name.startswith(("x_0", "p_0", "y_0")) for name, kind, _ in loops), loops
    # the tile's accumulators live in a local buffer (registers), written back once per tile
    assert 'scope="local"' in text
    # two knobs: the GEMM's tiles per block (a divisor of 25 tiles: 1, 5) and output chunks (of 2)
    decisions = [[int(v) for v in d] for d in sch.trace.decisions.values()]
    assert sorted(int(np.prod(d)) for d in decisions) == [2, 25], decisions


def test_the_gemm_reads_each_block_of_weights_as_one_run_and_prefetches_the_next(network):
    """The transformed weights are stored as the GEMM reads them, [(e, n), output block, k,
    lanes] (RewriteLayout; TOPI's [e, n, k, oc] gave a block 128 B of every 1 KB row), so a
    block of output channels reads one contiguous run, and each block of tiles prefetches its
    share of the next one (`weight_prefetch`). Measured on resnet18's 14x14x256 F(2x2) GEMM
    with 12 copies of its weights called in turn (Intel Xeon with AMX): 0.735 ms in TOPI's
    order, 0.594 laid out, 0.557 laid out and prefetching."""
    from test_weight_prefetch import _weights, assert_prefetches_the_next_blocks

    from vta_pipeline.tir import weight_prefetch

    lowered, _, _, _ = network
    wl = _winograd_tasks(lowered)[0].dispatched[0]
    _, (_, _, _, ci, co, *_) = extract.conv2d_workload(wl)
    for seed in range(1, 20):  # a candidate with blocks of one output chunk: two blocks
        func = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(_sample(wl, seed).mod)["main"]
        shape = [int(d) for d in _weights(func).shape]  # [(e, n), output block, k, lanes] (unit loops dropped)
        if shape[1] == co // 16:
            break
    assert shape == [36, co // 16, ci, 16], shape
    assert_prefetches_the_next_blocks(weight_prefetch.insert(tvm.IRModule({"main": func}))["main"], levels=1)


def test_a_version_2_record_is_carried_into_version_3_with_its_decisions(network):
    """Version 3 changed what a record builds (the weights' layout, the prefetch), not its knobs:
    a task searched in version 2 keeps that search aside and its records, replayed through
    version 3 with their decisions, are measured first (`spaces.upgrade`)."""
    from tvm.s_tir.schedule import Trace

    from vta_pipeline.spaces import upgrade as space_upgrade
    from vta_pipeline.tir import weight_prefetch

    lowered, _, _, _ = network
    wl = _winograd_tasks(lowered)[0].dispatched[0]
    target = tvm.target.Target(HERE)
    assert space_upgrade.upgrades("winograd:2", space_label(target, wl))
    assert not space_upgrade.upgrades(None, "winograd:3") and not space_upgrade.upgrades(
        "packed-conv:float:2", "winograd:3"
    )
    current = _sample(wl, 5).trace
    marks = [i for i in current.insts if i.kind.name == "Annotate" and str(i.attrs[0]) == weight_prefetch.ANNOTATION]
    assert len(marks) == 1
    old = Trace([i for i in current.insts if not i.same_as(marks[0])], {i: d for i, d in current.decisions.items()})
    (carried,) = space_upgrade.upgrade_traces([old], wl, target, design_space(target, wl))
    assert carried is not None and weight_prefetch.ANNOTATION in str(carried)
    assert [[int(v) for v in d] for d in carried.decisions.values()] == [
        [int(v) for v in d] for d in current.decisions.values()
    ]


def _build_sampled_equals_pytorch(network, tmp_path, seed: int) -> None:
    """Build the network with a schedule sampled from the space for each Winograd task, run
    it, and compare with PyTorch."""
    lowered, _, x, ref = network
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "out").mkdir()
    (tmp_path / "db").mkdir()
    db = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
    target = tvm.target.Target(HERE)
    for t in _winograd_tasks(lowered):
        wl = t.dispatched[0]
        db.commit_tuning_record(
            ms.database.TuningRecord(_sample(wl, seed).trace, db.commit_workload(wl), [1e-3], target)
        )
    assert (
        build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")["scheduled_functions"]
        == 2
    )
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
@pytest.mark.parametrize("seed", [2, 9])
def test_a_build_with_winograd_schedules_equals_pytorch(network, tmp_path, seed):
    _build_sampled_equals_pytorch(network, tmp_path, seed)


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
def test_the_search_measures_candidates_of_the_space_and_keeps_the_fastest(network, tmp_path):
    lowered, _, _, _ = network
    wl = _winograd_tasks(lowered)[1].dispatched[0]
    target = tvm.target.Target(HERE)
    # the project's builder: the stock one imports every tensor intrinsic in each fresh worker,
    # which on a loaded 2-core machine outlasted its 30 s timeout and failed every candidate
    db = ms.tir_integration.tune_tir(
        wl,
        target,
        str(tmp_path),
        max_trials_global=4,
        num_trials_per_iter=4,
        space=design_space(target, wl),
        num_tuning_cores=1,
        builder=ms_build.make_builder(timeout_sec=120, max_workers=1),
        runner=ms.runner.LocalRunner(timeout_sec=120),
    )
    records = db.get_all_tuning_records()
    assert 1 <= len(records) <= 4
    assert all(r.run_secs and all(float(s) < 1.0 for s in r.run_secs) for r in records)
    best = db.get_top_k(db.commit_workload(wl), 1)[0]
    assert float(best.run_secs[0]) == min(float(r.run_secs[0]) for r in records)


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
def test_a_conv_narrower_than_small_below_runs_f2_and_equals_pytorch(network_f2, tmp_path):
    """F(2x2, 3x3): 4 x 4 tiles of input per 2 x 2 outputs, so the transformed weights are
    4 x 4 slices (16/9 of the direct conv's, where F(4x4)'s 6 x 6 are 36/9)."""
    lowered, count, _, _ = network_f2
    assert count == 2
    tasks = _winograd_tasks(lowered)
    assert len(tasks) == 2
    for t in tasks:
        wl = t.dispatched[0]
        assert [int(d) for d in wl["main"].params[1].ty.shape][:2] == [4, 4]  # U: (alpha, alpha, C, OC)
        loops = re.findall(r"for (\w+) in T\.(\w+)\(T\.int64\((\d+)\)\)", _sample(wl, 3).mod.script())
        # the transforms' 4-tap passes unrolled, and the inverse's 2 x 2 outputs per tile
        assert sum(kind == "unroll" and n == "4" for _, kind, n in loops) >= 12, loops
        assert not any(kind == "unroll" and n == "6" for _, kind, n in loops), loops
    _build_sampled_equals_pytorch(network_f2, tmp_path, 2)
