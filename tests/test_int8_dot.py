"""The x86 int8 path: graph pack's `x86` layout, the dot-product intrinsics, tensorized builds.

A tuned build is a MetaSchedule schedule per task replayed from the database. These
tests sample real schedules from the pipeline's design space (no measurements: that
is the tuning tests' job) and build them through the build step, so they check what
tuning would keep: the conv kernels tensorized with the CPU's instruction (read off the
assembly), weights re-laid out once at build time, and every output bit-identical to the
numpy integer emulation of the quantized network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm
from int8_nets import Blocks, dot_kernel, randomize, to_relax
from torch import nn
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.target import codegen

from vta_pipeline.build import LIB, build_network
from vta_pipeline.passes import emulate
from vta_pipeline.passes.graph import op_sequence
from vta_pipeline.passes.graph_pack import PackError, PackParams, graph_pack
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.passes.quantize import QuantizeParams, quantize
from vta_pipeline.search.database import open_database
from vta_pipeline.tir import int8_dot

HERE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2 (what CI and this machine run)
CASCADELAKE = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}  # AVX512-VNNI: compiled, not run
host_has_avx2 = bool(
    codegen.target_has_features(["avx2"], tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}))
)


class Signed(nn.Module):
    """c2 reads c1's output without a ReLU: its input can be negative and must stay int8."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        return torch.relu(self.c2(self.c1(x)))


def quantized(model: nn.Module, seed: int = 0, int8_activations: bool = False):
    x = np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(to_relax(randomize(model, seed), x), QuantizeParams(int8_activations=int8_activations))
    return q, x


@pytest.fixture(scope="module")
def blocks():
    return quantized(Blocks())


def packed_convs(mod):
    return [o for o in op_sequence(mod) if o.name == "nn.conv2d" and str(o.call.attrs.data_layout) != "NCHW"]


def sampled_database(lowered, target_spec, work_dir, seed: int = 0) -> int:
    """One schedule per tuning task, drawn from the pipeline's design space with its
    postprocessors applied (what a tuning trial builds), committed as the best record."""
    target = tvm.target.Target(target_spec)
    int8_dot.register()
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    n = 0
    for task in ms.relax_integration.extract_tasks(lowered, target):
        wl = task.dispatched[0]
        space = int8_dot.space_generator(target, wl)
        ctx = ms.TuneContext(mod=wl, target=target, space_generator=space, task_name=task.task_name, rand_state=seed)
        sch = ctx.generate_design_space()[0]
        if not all(p.apply(sch) for p in ctx.space_generator.postprocs):
            continue
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(wl), [1e-3], target))
        n += 1
    return n


def tuned_build(mod, target_spec, tmp_path):
    """The build step on `mod` with a sampled database; returns (library path, scheduled functions)."""
    lowered = lower_for_tuning(mod)
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "db").mkdir()
    (tmp_path / "out").mkdir()
    assert sampled_database(lowered, target_spec, tmp_path / "db") > 0
    info = build_network(tmp_path / "extract", target_spec, tmp_path / "out", best_db_dir=tmp_path / "db")
    return tmp_path / "out" / LIB, info


def run_lib(lib_path, x) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib_path)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


# ---- graph pack's x86 layout ---------------------------------------------------------------------
def test_x86_layout_packs_weights_for_the_dot_product_and_keeps_the_values(blocks):
    q, x = blocks
    vta, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4))
    x86, rep = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    assert rep.layout == "x86" and rep.uint8_convs == 5
    pairs = list(zip(packed_convs(vta), packed_convs(x86)))
    regular = [(a, b) for a, b in pairs if int(a.call.attrs.groups) == 1]
    assert len(regular) == 5
    for a, b in regular:
        assert (str(b.call.attrs.data_layout), str(b.call.attrs.kernel_layout)) == ("NCHW1n16c", "OIHW16o4i")
        wv, wx = (
            a.call.args[1].value.numpy(),
            b.call.args[1].value.numpy(),
        )  # (O/16, I/16, kh, kw, 16, 16) / (O/16, I/4, kh, kw, 16, 4)
        o16, i16, kh, kw = wv.shape[:4]
        assert wx.shape == (o16, i16 * 4, kh, kw, 16, 4)
        oihw_v = wv.transpose(0, 4, 1, 5, 2, 3).reshape(o16 * 16, i16 * 16, kh, kw)
        oihw_x = wx.transpose(0, 4, 1, 5, 2, 3).reshape(o16 * 16, i16 * 16, kh, kw)
        assert np.array_equal(oihw_v, oihw_x)
        assert str(b.call.args[0].ty.dtype) == "uint8"  # every conv input here follows a ReLU
    depthwise = [b for a, b in pairs if int(a.call.attrs.groups) != 1]
    assert depthwise and all(str(b.call.attrs.kernel_layout) == "OIHW16o" for b in depthwise)


def test_uint8_only_where_the_input_is_provably_non_negative():
    q, x = quantized(Signed())
    packed, rep = graph_pack(
        q, PackParams(start_name="nn.max_pool2d", stop_name="nn.relu", stop_name_idx=1, layout="x86")
    )
    dtypes = [str(c.call.args[0].ty.dtype) for c in packed_convs(packed)]
    assert dtypes == ["uint8", "int8"], dtypes  # c1 after max_pool(relu), c2 after c1 (signed)
    assert rep.uint8_convs == 1
    y_emu, _ = emulate.run(q, [x])
    assert (y_emu.min(), y_emu.max()) != (0, 0)
    from int8_nets import build_run

    assert np.array_equal(build_run(packed, x), y_emu)


def _signed_conv(weight_min: int):
    """max_pool -> 1x1 conv -> relu on an int8 input (signed data), one weight set to `weight_min`."""
    w = np.random.default_rng(0).integers(-127, 128, (16, 16, 1, 1)).astype("int8")
    w[3, 5] = weight_min
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 8, 8), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(relax.op.nn.max_pool2d(x, (1, 1)))
            c = bb.emit(relax.op.nn.conv2d(p, relax.const(w), out_dtype="int32"))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(c)))
        bb.emit_func_output(out)
    return bb.get()


def test_signed_data_needs_weights_in_minus_127_to_127():
    # the signed dot product flips each weight's sign with its activation's: -128 has no flip
    packed, rep = graph_pack(_signed_conv(-127), PackParams(stop_name="nn.relu", layout="x86"))
    assert rep.uint8_convs == 0 and [str(c.call.args[0].ty.dtype) for c in packed_convs(packed)] == ["int8"]
    with pytest.raises(PackError, match=r"nn.conv2d\[0\].*weights hold -128.*\[-127, 127\].*--pack-layout vta"):
        graph_pack(_signed_conv(-128), PackParams(stop_name="nn.relu", layout="x86"))


def test_x86_layout_needs_a_channel_block_of_fours(blocks):
    q, _ = blocks
    with pytest.raises(PackError, match="cfactor=6 is not divisible by 4"):
        graph_pack(q, PackParams(cfactor=6, layout="x86"))
    with pytest.raises(PackError, match="pack layout 'arm'"):
        graph_pack(q, PackParams(layout="arm"))


# ---- the intrinsics ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, expected",
    [
        (HERE, int8_dot.AVX2),
        ({"kind": "llvm", "mcpu": "haswell"}, int8_dot.AVX2),
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, int8_dot.AVX512),
        (CASCADELAKE, int8_dot.VNNI),
        ({"kind": "llvm", "mcpu": "sapphirerapids"}, int8_dot.VNNI),
        ({"kind": "llvm", "mcpu": "cortex-a72", "mtriple": "aarch64-linux-gnu"}, int8_dot.intrinsic_name("neon")),
        ({"kind": "llvm", "mcpu": "cortex-a76", "mtriple": "aarch64-linux-gnu"}, int8_dot.intrinsic_name("sdot")),
        ({"kind": "llvm", "mcpu": "cortex-a9", "mtriple": "armv7a-linux-gnueabihf"}, None),
        ({"kind": "llvm", "mcpu": "nehalem"}, None),  # SSE only: the default rules
        ({"kind": "cuda", "arch": "sm_80"}, None),
    ],
)
def test_the_intrinsic_follows_the_cpu(spec, expected):
    assert int8_dot.intrinsic_for(tvm.target.Target(spec)) == expected
    signed = int8_dot.intrinsic_for(tvm.target.Target(spec), signed=True)  # int8 data: the same ISA's signed form
    assert signed == (expected and expected.replace("16x4_", "16x4_s8_"))


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("signed", [False, True])
def test_every_dot_product_form_is_exact_at_its_operand_extremes(lanes, signed):
    """vpmaddubsw saturates a pair of products at 32767: the uint8 forms stay under it for
    data in [0, 127], the signed forms (|a| times b with a's sign) for any int8 data, weights
    in [-127, 127]. Extremes of both in every row and lane, against numpy in int64."""
    int8_dot.register()
    rng = np.random.default_rng(lanes + signed)
    lo = -128 if signed else 0
    a = rng.integers(lo, 128, (32, 64)).astype("int8" if signed else "uint8")
    a[0], a[1] = lo, 127
    a[2, ::2], a[2, 1::2] = lo, 127
    b = rng.integers(-127, 128, (16, lanes, 4)).astype("int8")
    b[:, 0], b[:, 1] = -127, 127
    b[:, 2, ::2], b[:, 2, 1::2] = -127, 127
    ref = a.astype(np.int64) @ b.transpose(0, 2, 1).reshape(64, lanes).astype(np.int64)
    for spec in (HERE, {"kind": "llvm", "mcpu": "skylake-avx512"}, CASCADELAKE):
        name, lib = dot_kernel(lanes, signed, spec)
        asm = lib.mod.inspect_source("asm") if hasattr(lib, "mod") else lib.inspect_source("asm")
        assert ("vpdpbusd" if "vnni" in name else "vpmaddubsw") in asm
        assert ("_s8_" in name) == signed and (not signed or "vpsignb" in asm or "vpabsb" in asm)
        if spec is HERE and host_has_avx2:  # the others compiled, not run
            c = tvm.runtime.tensor(np.zeros((32, lanes), "int32"))
            lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
            assert np.array_equal(c.numpy(), ref)


def test_only_uint8_by_int8_workloads_get_the_dot_product_rule(blocks):
    q, _ = blocks
    x86, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    target = tvm.target.Target(HERE)
    tasks = ms.relax_integration.extract_tasks(lower_for_tuning(x86), target)
    spaces = [(int8_dot.space_generator(target, t.dispatched[0]), int(t.weight)) for t in tasks]
    custom = [s for s, _ in spaces if s != "post-order-apply"]
    # the five uint8 convs (two identical 1x1 ones share a task); the depthwise, the float stem
    # and the elementwise functions keep the default rules
    assert sum(w for s, w in spaces if s != "post-order-apply") == 5 and len(custom) == 4
    rules = [type(r).__name__ for r in custom[0].sch_rules]
    assert rules.index("MultiLevelTilingWithIntrin") < rules.index("MultiLevelTiling")


# ---- tensorized builds ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, instruction, absent",
    [
        (HERE, "vpmaddubsw", "vpdpbusd"),
        (CASCADELAKE, "vpdpbusd", "vpmaddubsw"),
        ({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}, "vpmaddubsw", "vpdpbusd"),
    ],
)
def test_the_int8_convs_are_tensorized_with_the_cpus_dot_product(blocks, tmp_path, spec, instruction, absent):
    q, _ = blocks
    x86, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    lib, info = tuned_build(x86, spec, tmp_path)
    assert info["scheduled_functions"] >= 5
    asm = _asm(spec, tmp_path)
    assert asm.count(instruction) >= 5 and absent not in asm


def _asm(spec, tmp_path) -> str:
    """The assembly of the tuned module (the build step's own lowering, before export)."""
    lowered = tvm.ir.load_json((tmp_path / "extract" / "lowered.json").read_text())
    target = tvm.target.Target(spec)
    int8_dot.register()
    with target, ms.database.JSONDatabase(work_dir=str(tmp_path / "db")):
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)
    ex = tvm.compile(scheduled, target=target)
    return ex.mod.imports[0].inspect_source("asm") if ex.mod.imports else ex.mod.inspect_source("asm")


@pytest.fixture(scope="module")
def tensorized_db(blocks, tmp_path_factory):
    """A database of sampled tensorized records (our dot-product intrinsics), and its count."""
    q, _ = blocks
    x86, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    db = tmp_path_factory.mktemp("tensorized_db")
    n = sampled_database(lower_for_tuning(x86), HERE, db)
    assert n > 1 and "vta_pipeline.dot_16x4" in (db / "database_tuning_record.json").read_text()
    return db, n


def test_tensorized_records_open_in_a_fresh_process(tensorized_db):
    """A resumed night opens each task's database in a new process, often before anything
    there has built a design space (its graph pack and task extraction come from the cache).
    The records name our intrinsics, which TVM looks up as it parses them: the library opens
    every database with them registered (`task_database.open_database`)."""
    db, n = tensorized_db
    opened = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vta_pipeline.search.database import open_database; "
            "print(len(open_database(sys.argv[1]).get_all_tuning_records()))",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert opened.returncode == 0, opened.stderr[-2000:]
    assert int(opened.stdout.split()[-1]) == n  # (and no other module opens one: test_layering)


def test_a_record_that_no_longer_replays_is_set_aside_and_the_rest_kept(tensorized_db, tmp_path, caplog):
    """One record naming an intrinsic that is gone (we renamed it, or TVM changed a primitive)
    would fail the whole database's open, and with it the task: it is moved to
    `database_tuning_record.json.unreplayable`, the others stay."""
    db, n = tensorized_db
    for f in db.iterdir():
        shutil.copy2(f, tmp_path / f.name)
    rec = tmp_path / "database_tuning_record.json"
    lines = rec.read_text().splitlines()
    stale = next(i for i, line in enumerate(lines) if "vta_pipeline.dot_16x4" in line)
    lines[stale] = lines[stale].replace("vta_pipeline.dot_16x4", "vta_pipeline.gone_16x4")
    rec.write_text("\n".join(lines) + "\n")

    with caplog.at_level("WARNING", logger="vta_pipeline.search.database"):
        opened = open_database(tmp_path)
    assert len(opened.get_all_tuning_records()) == n - 1
    assert (tmp_path / "database_tuning_record.json.unreplayable").read_text().splitlines() == [lines[stale]]
    assert "set aside 1 record(s) that no longer replay" in caplog.text and "kept" in caplog.text
    assert len(open_database(tmp_path).get_all_tuning_records()) == n - 1  # and it opens directly now


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
@pytest.mark.parametrize("int8_activations", [False, True], ids=["int32-activations", "int8-activations"])
def test_a_tensorized_build_is_bit_identical_to_the_emulation(blocks, tmp_path, int8_activations):
    """With int8 activations (--int8-activations) the residual block's add reads int8 and
    each conv writes int8: the same exactness."""
    q, x = quantized(Blocks(), int8_activations=True) if int8_activations else blocks
    x86, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    lib, _ = tuned_build(x86, HERE, tmp_path)
    y_emu, _ = emulate.run(q, [x])
    assert np.array_equal(run_lib(lib, x), y_emu)


def test_tuned_weights_are_prepacked_once_at_build_time(tmp_path):
    """fp32: the tuned kernels read weights in their own order, rewritten when the library is
    built; `main` takes the input alone and calls no weight transform at run time."""
    model = randomize(Blocks(), 1)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    mod = to_relax(model, x)
    lowered = lower_for_tuning(mod)
    assert any(
        f.attrs and list(f.attrs.get("layout_free_buffers", []))
        for _, f in lowered.functions.items()
        if isinstance(f, tvm.tirx.PrimFunc)
    )
    (tmp_path / "db").mkdir()
    sampled_database(lowered, HERE, tmp_path / "db", seed=3)
    target = tvm.target.Target(HERE)
    with target, ms.database.JSONDatabase(work_dir=str(tmp_path / "db")):
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)
    from vta_pipeline.passes.pipeline import prepack_weights

    packed = prepack_weights(scheduled)
    names = [gv.name_hint for gv in packed.functions]
    assert any(n.endswith("_prepacked") for n in names), names  # a tuned kernel reads a rewritten weight
    assert not any(n.endswith("_weight_prepack") for n in names), names  # folded into constants: gone
    assert len(packed["main"].params) == 1
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    ex = tvm.compile(packed, target=target)
    calls = [line.split()[1] for line in ex.as_text().splitlines() if line.strip().startswith("call")]
    # the rewritten weights are constants the kernels read: nothing packs them into a tuple per call
    assert "vm.builtin.make_tuple" not in calls and "vm.builtin.tuple_getitem" not in calls, calls
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_a_block_the_intrinsic_does_not_fit_stays_plain_and_is_counted_not_printed(capfd):
    """What MetaSchedule's RewriteTensorize does, without one console warning per candidate."""
    from tvm import te

    int8_dot.register()
    a = te.placeholder((1, 8), "uint8", name="a")  # 8 lanes: the 16x4 dot product does not fit
    w = te.placeholder((8, 8), "int8", name="w")
    k = te.reduce_axis((0, 8), name="k")
    c = te.compute((1, 8), lambda i, j: te.sum(a[i, k].astype("int32") * w[j, k].astype("int32"), axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, w, c]))
    sch.annotate(sch.get_sblock("c"), int8_dot.AUTO_TENSORIZE, int8_dot.AVX2)
    failures = int8_dot.TensorizeFailures()
    assert int8_dot.quiet_rewrite_tensorize(failures).apply(sch)
    assert failures.count == 1 and "block 'c'" in failures.first and int8_dot.AVX2 in failures.first
    assert int8_dot.AUTO_TENSORIZE not in sch.get(sch.get_sblock("c")).annotations  # plain loops, built as usual
    tvm.compile(sch.mod, target=tvm.target.Target(HERE))
    assert "Tensorize failed" not in capfd.readouterr().err
