"""NeoCPU's design space for packed convs: what its schedules are, and that they are right.

The space is the lever for fp32 speed on CPUs (`vta_pipeline/packed_conv_space.py`). These
tests draw real schedules from it through the tuning step's own `design_space` (no
measurements), and check what a tuned build keeps: the loop nest NeoCPU prescribes (a
parallel outer loop, the reduction outside an unrolled register tile, the packed lanes
vectorized, the epilogue fused into the tile's write-back, weights re-laid out for the
nest), tiles that fit the CPU's vector registers, FMA on vector registers in the machine
code, and a built network equal to PyTorch's output, also in blocks of 8 channels (what packs
mobilenet_v2's 24- and 144-channel layers). The int8 convs of the x86 pack layout
get the same nest around the CPU's dot product: tensorized (read off the assembly) and bit
for bit equal to the integer emulation.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
from int8_nets import Blocks, randomize, to_relax
from torch import nn
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.target import codegen

from vta_pipeline.build import LIB, build_network
from vta_pipeline.passes import emulate
from vta_pipeline.passes.cpu_layout import cpu_layout
from vta_pipeline.passes.graph_pack import PackError, PackParams, graph_pack
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.passes.quantize import QuantizeParams, quantize
from vta_pipeline.spaces import design_space
from vta_pipeline.spaces import packed_conv as packed_conv_space
from vta_pipeline.tir import int8_dot, intrin_registry

HERE = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # AVX2 (what CI and this machine run)
SKYLAKE = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}  # AVX-512: compiled, not run
CASCADELAKE = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}  # AVX512-VNNI: compiled, not run
host_has_avx2 = bool(
    codegen.target_has_features(["avx2"], tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()}))
)


class Residual(nn.Module):
    """A stem, a max pool (where packing starts), a residual block, a strided conv, a 1x1, a
    depthwise conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.proj = nn.Conv2d(32, 32, 1)
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        x = torch.relu(self.c2(torch.relu(self.c1(x))) + x)
        x = torch.relu(self.dw(self.proj(torch.relu(self.down(x)))))
        return nn.functional.adaptive_avg_pool2d(x, 1)


@pytest.fixture(scope="module")
def network():
    intrin_registry.load()  # what a TuneContext imports, in seconds (as tuning does)
    model = randomize(Residual(), 0)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    packed, report = graph_pack(to_relax(model, x), PackParams())
    lowered = lower_for_tuning(packed)
    return lowered, x, ref


def _tasks(lowered, spec):
    return ms.relax_integration.extract_tasks(lowered, tvm.target.Target(spec))


def _packed_tasks(lowered, spec, kind: str = "float"):
    target = tvm.target.Target(spec)
    return [t for t in _tasks(lowered, spec) if packed_conv_space.conv_kind(t.dispatched[0], target) == kind]


def _sample(wl, spec, seed: int):
    """One candidate of the task's space (of one of its design spaces, by the seed) with its
    postprocessors applied, as a trial builds it (None when a postprocessor rejects it)."""
    target = tvm.target.Target(spec)
    ctx = ms.TuneContext(
        mod=wl, target=target, space_generator=design_space(target, wl), task_name="t", rand_state=seed
    )
    spaces = ctx.generate_design_space()
    sch = spaces[seed % len(spaces)]
    return sch if all(p.apply(sch) for p in ctx.space_generator.postprocs) else None


def _samples(wl, spec, n: int, draws: int = 40):
    out = []
    for seed in range(1, draws + 1):
        sch = _sample(wl, spec, seed * 7919)
        if sch is not None:
            out.append(sch)
        if len(out) == n:
            return out
    raise AssertionError(f"only {len(out)} of {draws} draws passed the postprocessors")


def test_the_space_applies_to_packed_convs_and_plain_ones_with_whole_vectors_of_channels(network):
    lowered, _, _ = network
    target = tvm.target.Target(HERE)
    kinds = {t.task_name: packed_conv_space.conv_kind(t.dispatched[0], target) for t in _tasks(lowered, HERE)}
    # c1, c2 (with the residual add), down, proj: packed; dw: packed depthwise; the stem conv
    # (before the max pool) is plain NCHW with 16 output channels; the rest (pools, layout
    # transforms) is not a conv
    assert sorted(k for k in kinds.values() if k) == ["depthwise"] + ["float"] * 4 + ["nchw"], kinds
    assert all("conv2d_packed" in name for name, k in kinds.items() if k == "float")
    # a plain conv whose output channels fill no vector (12), a plain conv past the stem (16
    # input channels: MetaSchedule's generic space), or a GPU target: not this space
    for cin, cout in ((3, 12), (16, 16)):
        x = np.zeros((1, cin, 8, 8), "float32")
        plain = lower_for_tuning(to_relax(randomize(nn.Sequential(nn.Conv2d(cin, cout, 3)), 0), x))
        (conv,) = [t for t in _tasks(plain, HERE) if "conv2d" in t.task_name]
        assert packed_conv_space.conv_kind(conv.dispatched[0], target) is None, (cin, cout)
    stem = next(t for t in _tasks(lowered, HERE) if kinds[t.task_name] == "nchw")
    assert packed_conv_space.conv_kind(stem.dispatched[0], tvm.target.Target({"kind": "cuda"})) is None


def test_the_stem_conv_is_the_same_nest_over_16_output_lanes(network):
    lowered, _, _ = network
    (stem,) = _packed_tasks(lowered, HERE, "nchw")
    for sch in _samples(stem.dispatched[0], HERE, 3):
        body = sch.mod.script()
        update = body[: body.index('T.sblock("conv2d_nchw_update")')]
        nest = re.findall(r"for (\w+(?:, \w+)*) in (T\.\w+|range)\(", update)
        names = [n for group, _ in nest for n in group.split(", ")]
        assert names.index("rx") < names.index("ff_1") and nest[-1][1] == "T.vectorized", nest[-6:]
        assert "T.vectorized(T.int64(16))" in update and "T.parallel(" in body
        assert 'T.sblock("T_add' not in body and "meta_schedule.layout_rewrite_preproc" in body


def test_a_depthwise_conv_is_vectorized_over_its_channel_block(network):
    lowered, _, _ = network
    (dw,) = _packed_tasks(lowered, HERE, "depthwise")
    for sch in _samples(dw.dispatched[0], HERE, 3):
        body = sch.mod.script()
        update = body[: body.index('T.sblock("depthwise_conv2d_packed_update")')]
        nest = re.findall(r"for (\w+(?:, \w+)*) in (T\.\w+|range)\(", update)
        names = [n for group, _ in nest for n in group.split(", ")]
        assert names.index("d_j") < names.index("c_i") and nest[-1] == ("c_i", "T.vectorized"), nest[-6:]
        assert "T.parallel(" in body and 'T.sblock("compute' not in body  # ReLU in the write-back


def test_a_depthwise_conv_pads_its_chunk_inside_its_one_parallel_loop(network, bottlenecks):
    # no parallel pass over the whole input and no wait for every thread before the conv:
    # each iteration of the conv's parallel loop pads its own chunk's rows, vectorized
    from loop_nests import _blocks, parallel_loops

    for lowered, spec in ((network[0], HERE), (bottlenecks[0], HERE)):
        for task in _packed_tasks(lowered, spec, "depthwise"):
            for sch in _samples(task.dispatched[0], spec, 2):
                assert parallel_loops(sch.mod) == 1, sch.mod.script()
                found, _ = _blocks(sch.mod["main"])
                (pad,) = [(loops, r) for loops, r in found if r.block.name_hint.startswith("pad")]
                assert pad[0][0].kind == tvm.tirx.ForKind.PARALLEL and pad[0][-1].kind == tvm.tirx.ForKind.VECTORIZED
                lanes = int(pad[1].block.writes[0].source.shape[-1])
                assert int(pad[0][-1].extent) == lanes
    assert packed_conv_space.version("depthwise") == 3 and packed_conv_space.version("float") == 2


def test_a_candidate_is_neocpus_loop_nest(network):
    lowered, _, _ = network
    for task in _packed_tasks(lowered, HERE):
        for sch in _samples(task.dispatched[0], HERE, 3):
            text = sch.mod.script()
            body = text[text.index("def main") :]
            assert "T.parallel(" in body
            # the update: the reduction loops (k_o, d_i, d_j, k_i) outside the unrolled tile (rows x
            # columns or pixels over rows, times output-channel chunks), then the batch lane and the
            # vectorized lanes
            at = body.index('T.sblock("conv2d_packed_update")')
            nest = re.findall(r"for (\w+(?:, \w+)*) in (T\.\w+|range)\(", body[:at])
            names = [n for group, _ in nest for n in group.split(", ")]
            kinds = [k for group, k in nest for _ in group.split(", ")]
            bindings = body[at : body.index("T.writes(", at)]
            reduction = [
                loop
                for roles, loops in re.findall(r'T\.axis\.remap\("(\w+)", \[([\w, ]+)\]\)', bindings)
                for role, loop in zip(roles, loops.split(", "))
                if role == "R"
            ]
            reduction += re.findall(r"T\.axis\.reduce\([^,]+, (\w+)", bindings)
            assert reduction and all(loop in names for loop in reduction), (reduction, names)
            tile = kinds[max(names.index(loop) for loop in reduction) + 1 :]
            assert tile[-2:] == ["range", "T.vectorized"] and tile[:-2] in (["T.unroll"] * 2, ["T.unroll"] * 3), nest
            # the epilogue (bias, residual add, ReLU) is written from the tile: no block of its own
            assert 'T.sblock("T_add' not in body and 'T.sblock("compute' not in body
            # weights read in the nest's order: RewriteLayout's rewrite of the layout-free weight
            assert "meta_schedule.layout_rewrite_preproc" in text


def _output_rows(sch) -> int:
    from loop_nests import output_shape

    return output_shape(sch.mod)[2]


def test_each_thread_writes_one_band_of_output_rows_in_every_kind_of_conv(network, int8_network, depthwise_dot_network):
    """The parallel loop is (batch, row band, channel chunks), a band per core of the target: the
    static split gives each thread the same rows of every conv's output, so the next conv reads
    what this thread wrote (across Zen 5's CCDs a kernel chain split by channels measured 5x
    slower, docs/performance.md). Version 1 of the space split the channel chunks instead."""
    from loop_nests import rows_by_thread

    seen = set()
    for lowered, spec, kinds in (
        (network[0], HERE, ("float", "depthwise", "nchw")),
        (int8_network[1], HERE, ("dot",)),
        (depthwise_dot_network[2], ICELAKE, ("depthwise_dot",)),
    ):
        for kind in kinds:
            for task in _packed_tasks(lowered, spec, kind):
                # a conv whose weights outweigh its activations splits its output channels
                # instead: each thread every row, half the weights
                by_channels = packed_conv_space.splits_by_channels(task.dispatched[0])
                for sch in _samples(task.dispatched[0], spec, 4):
                    rows = _output_rows(sch)
                    by_rows = rows_by_thread(sch.mod) == [(0, rows // 2 - 1), (rows // 2, rows - 1)]
                    chunks = rows_by_thread(sch.mod, row_axis=1)  # the output-channel chunks each thread writes
                    if by_channels and chunks[0][1] < chunks[1][0]:
                        assert rows_by_thread(sch.mod) == [(0, rows - 1)] * 2, (task.task_name, sch.trace)
                        seen.add("channels " + kind)
                    else:  # by rows (a conv split by channels whose tile holds all its chunks has one to split)
                        assert by_rows, (task.task_name, sch.trace)
                        seen.add(("rows " if not by_channels else "one chunk ") + kind)
    assert {"rows float", "rows depthwise", "rows nchw", "rows dot", "rows depthwise_dot", "channels dot"} <= seen, seen
    # one band per core: four cores, four bands of the 16 rows
    (c1, *_) = [t for t in _packed_tasks(network[0], HERE) if _output_rows(_samples(t.dispatched[0], HERE, 1)[0]) == 16]
    four = dict(HERE, **{"num-cores": 4})
    for sch in _samples(c1.dispatched[0], four, 2):
        assert rows_by_thread(sch.mod, threads=4) == [(0, 3), (4, 7), (8, 11), (12, 15)]


@pytest.mark.parametrize("spec, lanes, regs", [(HERE, 8, 16), (SKYLAKE, 16, 32)])
def test_register_tiles_fit_the_cpus_vector_registers(network, spec, lanes, regs):
    lowered, _, _ = network
    target = tvm.target.Target(spec)
    assert packed_conv_space.vector_registers(target) == (lanes, regs)
    seen = []
    for task in _packed_tasks(lowered, spec):
        for sch in _samples(task.dispatched[0], spec, 4):
            seen.append(packed_conv_space.tile_registers(sch, lanes))
    assert max(seen) <= regs and min(seen) >= 3, seen
    # and the limit is what rejects: a plain draw of the same space exceeds it at times
    wl = _packed_tasks(lowered, spec)[0].dispatched[0]
    drawn = []
    for seed in range(1, 30):
        sch = tvm.s_tir.Schedule(wl, seed=seed * 7919)
        packed_conv_space.schedule(sch)
        drawn.append(packed_conv_space.tile_registers(sch, lanes))
    if spec is HERE:
        assert max(drawn) > regs, drawn


def test_a_16_lane_float_tile_on_avx2_holds_six_pixels_not_seven(network):
    # two registers per pixel, two weight vectors, the broadcast input: 6 pixels take 15 of
    # AVX2's 16 registers, 7 take 17 (they spilled, measured 2x slower); AVX-512: one each
    lowered, _, _ = network
    wl = _packed_tasks(lowered, HERE)[0].dispatched[0]
    fits = {}
    for seed in range(1, 80):
        sch = tvm.s_tir.Schedule(wl, seed=seed * 7919)
        packed_conv_space.schedule(sch)
        kind, pixels, chunks, chunk_lanes = packed_conv_space.tile_shape(sch)
        assert (kind, chunk_lanes) == ("float", 16)
        if chunks == 1:
            fits[pixels] = (packed_conv_space.tile_registers(sch, 8), packed_conv_space.tile_registers(sch, 16))
    assert fits[6] == (15, 8) and fits[7] == (17, 9), fits


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
@pytest.mark.parametrize("size, pixel_tiles", [(7, {5, 6}), (14, {2})])
def test_ragged_register_tiles_are_sampled_and_compute_every_pixel(tmp_path, size, pixel_tiles):
    """Tile widths that do not divide the output's (resnet's 7 x 2^k widths: 6 of 56, 4 of 7)
    are in the space, and so are tiles over the row-major pixels across rows (5 or 6 of a 7 x 7
    output's 49); the last, partial tile of either writes exactly the pixels that exist. At
    14 x 14 the pixels split into two bands of 98, one per core, and tiles over the pixels
    divide the band (98 = 49 x 2; 7 x 2 pixels of 16 lanes need 17 AVX2 registers)."""
    intrin_registry.load()  # what a TuneContext imports, in seconds
    x = np.random.default_rng(0).standard_normal((1, 16, size, size)).astype("float32")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):  # no global pool: every output pixel is compared
            return torch.relu(self.c(nn.functional.max_pool2d(x, 1)))

    model = randomize(Net(), 0)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    packed, _ = graph_pack(to_relax(model, x), PackParams(stop_name="nn.relu"))
    lowered = lower_for_tuning(packed)
    (task,) = _packed_tasks(lowered, HERE)
    wl = task.dispatched[0]
    # two design spaces: MetaSchedule replays a space's trace for each candidate, so a choice
    # between the nests must be a space of its own to reach the candidates
    target = tvm.target.Target(HERE)
    ctx = ms.TuneContext(mod=wl, target=target, space_generator=design_space(target, wl), task_name="t")
    spaces = ctx.generate_design_space()  # at 7 x 7 the weights outweigh the activations: a third space
    assert [_over_rows(sch) for sch in spaces] == [False, True] + [False] * (size == 7)
    tiles = {}  # (over rows?, pixels) -> a candidate
    for seed in range(1, 300):
        sch = _sample(wl, HERE, seed * 7919)
        if sch is not None:
            _, pixels, chunks, _ = packed_conv_space.tile_shape(sch)
            tiles.setdefault((_over_rows(sch), pixels if chunks == 1 else -pixels), sch)
        if {(True, w) for w in pixel_tiles} | {(False, 4), (False, 5), (False, 6)} <= set(tiles):
            break
    ragged = sorted(w for over, w in tiles if not over and w > 0 and size % w)
    assert ragged and max(w for _, w in tiles) <= packed_conv_space.MAX_REG_N, sorted(tiles)
    over_rows = {w for over, w in tiles if over}
    assert pixel_tiles <= over_rows, over_rows  # 49 = 9 x 5 + 4 = 8 x 6 + 1
    assert size == 7 or all(98 % abs(w) == 0 for w in over_rows), over_rows  # whole tiles of a band
    for key in [(False, w) for w in ragged[-2:]] + [(True, w) for w in sorted(pixel_tiles)]:
        out = _network_output(lowered, wl, tiles[key], x, tmp_path / f"tile{key}")
        np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, err_msg=f"tile {key}")


def _network_output(lowered, wl, sch, x, work) -> np.ndarray:
    """The network `lowered` built with `sch` as its one tuned record (for the task `wl`), run on `x`."""
    for d in ("extract", "db", "out"):
        (work / d).mkdir(parents=True)
    (work / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    db = ms.database.JSONDatabase(work_dir=str(work / "db"))
    db.commit_tuning_record(
        ms.database.TuningRecord(sch.trace, db.commit_workload(wl), [1e-3], tvm.target.Target(HERE))
    )
    build_network(work / "extract", HERE, work / "out", best_db_dir=work / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(work / "out" / LIB)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


class Wide(nn.Module):
    """One conv on a small map with many channels: 147 KB of weights, 4 KB of activations
    each way (resnet's 7x7x512 convs in small)."""

    def __init__(self, channels: int = 64):
        super().__init__()
        self.c = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):  # no global pool: every output pixel is compared
        return torch.relu(self.c(nn.functional.max_pool2d(x, 1)))


@pytest.fixture(scope="module")
def wide():
    intrin_registry.load()
    model = randomize(Wide(), 0)
    x = np.random.default_rng(0).standard_normal((1, 64, 4, 4)).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    packed, _ = graph_pack(to_relax(model, x), PackParams(stop_name="nn.relu"))
    lowered = lower_for_tuning(packed)
    (task,) = _packed_tasks(lowered, HERE)
    return lowered, task.dispatched[0], x, ref


def _tiles_inside_the_reduction(realize, loops) -> int:
    """How many tiles of the output each step of the outermost reduction loop computes: the
    product of the serial loops inside it that the block's spatial iterators are bound to (in
    NeoCPU's nest none: only the unrolled register tile is inside)."""
    from tvm.tirx.analysis import undefined_vars

    def bound(iter_type: int) -> list:
        return [
            v
            for iv, value in zip(realize.block.iter_vars, realize.iter_values)
            if int(iv.iter_type) == iter_type
            for v in undefined_vars(value)
        ]

    reduction, spatial = bound(2), bound(0)
    first = min(i for i, loop in enumerate(loops) if any(loop.loop_var.same_as(v) for v in reduction))
    tiles = 1
    for loop in loops[first + 1 :]:
        if loop.kind == tvm.tirx.ForKind.SERIAL and any(loop.loop_var.same_as(v) for v in spatial):
            tiles *= int(loop.extent)
    return tiles


def test_a_conv_whose_weights_outweigh_its_activations_reads_each_block_of_weights_once(wide, network):
    """Its third design space puts a block of input channels outside every tile of the output:
    a block of weights comes from memory once and every tile reuses it from L1, where the nest
    over rows reads a chunk's weights from memory in its first row of tiles at a few FMAs per
    cache line (in a network resnet's 7x7x512 convs find their 9.4 MB of weights there). The
    threads split the output channels, the chunk's accumulator holds all its pixels, and
    the tasks such a space applies to search again (their space's version 3; 4: it prefetches,
    `test_weight_prefetch.py`)."""
    from loop_nests import _blocks, rows_by_thread

    from vta_pipeline.spaces import label as space_label
    from vta_pipeline.spaces import upgrade as space_upgrade

    _, wl, _, _ = wide
    target = tvm.target.Target(HERE)
    assert packed_conv_space.splits_by_channels(wl)
    assert space_label(target, wl) == "packed-conv:float:4"
    assert space_upgrade.upgrades("packed-conv:float:2", space_label(target, wl))
    assert space_upgrade.upgrades("packed-conv:float:3", space_label(target, wl))
    # seeded: an unseeded draw of the third space's tile split was 1 x 1 tiles on the 4 x 4 map in
    # some runs (nothing inside the reduction but the register tile), and the test failed by chance
    ctx = ms.TuneContext(mod=wl, target=target, space_generator=design_space(target, wl), task_name="t", rand_state=1)
    spaces = ctx.generate_design_space()
    assert len(spaces) == 3
    for index, sch in enumerate(spaces):
        found, _ = _blocks(sch.mod["main"])
        ((loops, update),) = [(loops, r) for loops, r in found if r.block.name_hint == "conv2d_packed_update"]
        assert (_tiles_inside_the_reduction(update, loops) > 1) == (index == 2), (index, sch.mod.script())
    for seed in range(1, 40):
        sch = _sample(wl, HERE, seed * 3)  # spaces[seed * 3 % 3]: the third
        if sch is not None:
            break
    rows = _output_rows(sch)
    assert rows_by_thread(sch.mod) == [(0, rows - 1)] * 2  # every row, half the output chunks each
    chunks = rows_by_thread(sch.mod, row_axis=1)
    assert chunks[0][1] < chunks[1][0], chunks
    # a conv that splits by rows keeps its two spaces and its version
    for task in _packed_tasks(network[0], HERE):
        if not packed_conv_space.splits_by_channels(task.dispatched[0]):
            ctx = ms.TuneContext(
                mod=task.dispatched[0],
                target=target,
                space_generator=design_space(target, task.dispatched[0]),
                task_name="t",
            )
            assert len(ctx.generate_design_space()) <= 2
            assert space_label(target, task.dispatched[0]) == "packed-conv:float:2"


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
def test_a_build_that_reads_each_block_of_weights_once_equals_pytorch(wide, tmp_path):
    """Candidates of the third space (blocks of 1 to 4 input chunks, ragged tiles among them)
    built into the network compute every output pixel as PyTorch does."""
    lowered, wl, x, ref = wide
    blocks = {}
    for seed in range(1, 200):
        sch = _sample(wl, HERE, seed * 3)
        if sch is None:
            continue
        (decision,) = [sch.trace.decisions[i] for i in sch.trace.insts if i.kind.name == "SamplePerfectTile"][-1:]
        blocks.setdefault(int(decision[1]), sch)
        if len(blocks) == 3:
            break
    assert set(blocks) == {1, 2, 4}, sorted(blocks)
    for block, sch in sorted(blocks.items()):
        out = _network_output(lowered, wl, sch, x, tmp_path / f"block{block}")
        np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, err_msg=f"block {block}")


def _over_rows(sch) -> bool:
    """Whether the candidate's float tile runs over the row-major pixels (the conv's output laid
    out as [.., H x W, ..] or [.., band, pixel of the band, ..] before the epilogue)."""
    return any(inst.kind.name == "TransformBlockLayout" for inst in sch.trace.insts)


@pytest.mark.parametrize("spec, register", [(HERE, "ymm"), (SKYLAKE, "zmm")])
def test_the_kernels_are_fused_multiply_adds_on_vector_registers(network, tmp_path, spec, register):
    lowered, _, _ = network
    _commit_samples(lowered, spec, tmp_path / "db", seed=5, kinds=("float", "nchw"))
    asm = _tuned_asm(lowered, spec, tmp_path / "db")
    fmas = re.findall(rf"vfmadd\w+ps\s+[^\n]*%{register}", asm)
    assert len(fmas) >= 16, f"{len(fmas)} vector FMAs on {register}"


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
@pytest.mark.parametrize("seed", [2, 9])
def test_a_tuned_build_from_the_space_equals_pytorch(network, tmp_path, seed):
    lowered, x, ref = network
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "out").mkdir()
    assert _commit_samples(lowered, HERE, tmp_path / "db", seed, kinds=("float", "nchw", "depthwise")) == 6
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def _tuned_asm(lowered, spec, db_dir) -> str:
    """The assembly of `lowered` built with the records in `db_dir` (the build step's lowering)."""
    target = tvm.target.Target(spec)
    with target, ms.database.JSONDatabase(work_dir=str(db_dir)):
        scheduled = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(lowered)
    ex = tvm.compile(scheduled, target=target)
    return ex.mod.imports[0].inspect_source("asm") if ex.mod.imports else ex.mod.inspect_source("asm")


def _commit_samples(lowered, spec, db_dir, seed: int, kinds: tuple[str, ...] = ("float",)) -> int:
    """A sampled candidate per task of these kinds, committed as that task's best record."""
    db_dir.mkdir(exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(db_dir))
    target = tvm.target.Target(spec)
    n = 0
    for task in [t for kind in kinds for t in _packed_tasks(lowered, spec, kind)]:
        wl = task.dispatched[0]
        sch = next(s for s in (_sample(wl, spec, seed + k * 101) for k in range(40)) if s is not None)
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(wl), [1e-3], target))
        n += 1
    return n


# ---- 8-channel blocks: mobilenet_v2's early layers ------------------------------------------------
class Bottlenecks(nn.Module):
    """mobilenet_v2's first layers in small: a stem, a depthwise conv, linear bottlenecks of 24
    channels (not a multiple of 16) expanded to 48, a strided depthwise conv, a residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.project = nn.Conv2d(16, 24, 1)
        self.expand = nn.Conv2d(24, 48, 1)
        self.dw2 = nn.Conv2d(48, 48, 3, stride=2, padding=1, groups=48)
        self.project2 = nn.Conv2d(48, 24, 1)
        self.expand2 = nn.Conv2d(24, 48, 1)
        self.dw3 = nn.Conv2d(48, 48, 3, padding=1, groups=48)
        self.project3 = nn.Conv2d(48, 24, 1)

    def forward(self, x):
        r6 = nn.functional.relu6
        x = self.project(r6(self.dw(r6(self.stem(x)))))
        x = self.project2(r6(self.dw2(r6(self.expand(x)))))
        x = x + self.project3(r6(self.dw3(r6(self.expand2(x)))))
        return nn.functional.adaptive_avg_pool2d(x, 1)


AFTER_THE_STEM = {"start_name": "nn.conv2d", "start_name_idx": 0}


@pytest.fixture(scope="module")
def bottlenecks():
    intrin_registry.load()
    model = randomize(Bottlenecks(), 0)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    return to_relax(model, x), x, ref


def test_blocks_of_8_channels_pack_the_layers_16_does_not_divide(bottlenecks):
    mod, _, _ = bottlenecks
    with pytest.raises(PackError, match=r"weight 24x16x1x1.*cfactor=16.*cfactor=8 divides"):
        graph_pack(mod, PackParams(**AFTER_THE_STEM))
    packed, report = graph_pack(mod, PackParams(cfactor=8, **AFTER_THE_STEM))
    assert report.cfactor == 8 and sum("nn.conv2d" in op for op in report.packed_ops) == 8
    lowered = lower_for_tuning(packed)
    target = tvm.target.Target(HERE)
    kinds = sorted(k for t in _tasks(lowered, HERE) if (k := packed_conv_space.conv_kind(t.dispatched[0], target)))
    # every conv after the stem is in the packed space: five 1x1 convs (project3 with the
    # residual add is a task of its own), three depthwise convs; the stem is the NCHW nest
    assert kinds == ["depthwise"] * 3 + ["float"] * 5 + ["nchw"], kinds
    for task in _packed_tasks(lowered, HERE):
        for sch in _samples(task.dispatched[0], HERE, 2):
            kind, pixels, chunks, chunk_lanes = packed_conv_space.tile_shape(sch)
            # one AVX2 register per chunk: a tile of 1-4 chunks holds 8-32 output channels
            assert chunk_lanes == 8 and packed_conv_space.tile_registers(sch, 8) == pixels * chunks + chunks + 1
            assert "T.vectorized(T.int64(8))" in sch.mod.script()


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the module cannot run here")
def test_a_build_in_blocks_of_8_channels_equals_pytorch(bottlenecks, tmp_path):
    mod, x, ref = bottlenecks
    packed, _ = graph_pack(mod, PackParams(cfactor=8, **AFTER_THE_STEM))
    lowered = lower_for_tuning(packed)
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "out").mkdir()
    assert _commit_samples(lowered, HERE, tmp_path / "db", 3, kinds=("float", "nchw", "depthwise")) == 9
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


# ---- int8: the same nest around the dot product ---------------------------------------------------
@pytest.fixture(scope="module")
def int8_network():
    intrin_registry.load()
    int8_dot.register()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(to_relax(randomize(Blocks(), 0), x), QuantizeParams())
    x86, report = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    return q, lower_for_tuning(x86), x, report


def test_int8_convs_get_the_nest_around_the_cpus_dot_product(int8_network):
    _, lowered, _, report = int8_network
    dot = _packed_tasks(lowered, HERE, "dot")
    # five uint8 convs, b1 and b2 one workload (a task of weight 2)
    assert sum(int(t.weight) for t in dot) == report.uint8_convs == 5 and len(dot) == 4
    # a CPU without a dot product (no AVX2) keeps the generic space for them
    assert (
        packed_conv_space.conv_kind(
            dot[0].dispatched[0], tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2})
        )
        is None
    )
    lanes, regs = packed_conv_space.vector_registers(tvm.target.Target(HERE))
    for task in dot:
        for sch in _samples(task.dispatched[0], HERE, 2):
            body = sch.mod.script()
            assert "T.parallel(" in body and "llvm.x86.avx2.pmadd.ub.sw" in body  # tensorized: AVX2's pair
            init = body[body.index('T.sblock("conv2d_dot_packed_init")') - 200 :]
            assert "T.vectorized(T.int64(16))" in init[:200]  # the tile's zeroing is vectorized too
            assert packed_conv_space.tile_registers(sch, lanes) <= regs
            assert 'T.sblock("T_right_shift' not in body  # the requantize is in the tile's write-back


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
@pytest.mark.parametrize("seed", [4, 11])
def test_an_int8_build_from_the_space_is_bit_identical_to_the_emulation(int8_network, tmp_path, seed):
    q, lowered, x, _ = int8_network
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "out").mkdir()
    assert _commit_samples(lowered, HERE, tmp_path / "db", seed, kinds=("dot",)) == 4
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    y_emu, _ = emulate.run(q, [x])
    assert np.array_equal(out, y_emu)
    asm = _tuned_asm(lowered, HERE, tmp_path / "db")
    assert asm.count("vpmaddubsw") >= 5


class LinearBottleneck(nn.Module):
    """mobilenet_v2's linear bottleneck: a 1x1 projection with no activation after it, so the
    1x1 expansion after it reads signed activations."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 32, 3, padding=1)
        self.proj = nn.Conv2d(32, 16, 1)
        self.expand = nn.Conv2d(16, 32, 1)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        x = self.proj(torch.relu(self.c1(x)))
        return nn.functional.adaptive_avg_pool2d(torch.relu(self.expand(x)), 1)


@pytest.fixture(scope="module")
def signed_network():
    intrin_registry.load()
    int8_dot.register()
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(to_relax(randomize(LinearBottleneck(), 0), x), QuantizeParams())
    x86, report = graph_pack(q, PackParams(layout="x86"))
    return q, lower_for_tuning(x86), x, report


@pytest.mark.parametrize(
    "spec, intrin, signs",
    [
        (HERE, int8_dot.intrinsic_name("avx2", signed=True), "vpsignb"),
        (SKYLAKE, int8_dot.intrinsic_name("avx512", signed=True), "vpabsb"),
        (CASCADELAKE, int8_dot.intrinsic_name("vnni", signed=True), "vpabsb"),
    ],
)
def test_an_int8_conv_reading_signed_data_gets_the_signed_dot_product(signed_network, tmp_path, spec, intrin, signs):
    # mobilenet_v2's expansions read a linear bottleneck's int8 output: the dot product's signed
    # form (|a| times the weight with a's sign), in the same nest as the uint8 convs. Before it,
    # they kept MetaSchedule's generic space (mobilenet_v2 int8's costliest task, 29% of its time)
    _, lowered, _, report = signed_network
    target = tvm.target.Target(spec)
    packed = [t for t in _tasks(lowered, spec) if "conv2d_dot_packed" in t.task_name]
    kinds = [packed_conv_space.conv_kind(t.dispatched[0], target) for t in packed]
    assert report.uint8_convs == 2 and len(packed) == 3 and kinds == ["dot"] * 3, kinds
    signed = [t for t in packed if '"uint8"' not in t.dispatched[0].script()]
    assert len(signed) == 1
    (sch,) = _samples(signed[0].dispatched[0], spec, 1)
    assert intrin in str(sch.trace)  # tensorized with the signed form
    assert _commit_samples(lowered, spec, tmp_path / "db", 4, kinds=("dot",)) == 3
    asm = _tuned_asm(lowered, spec, tmp_path / "db")
    assert signs in asm and ("vpdpbusd" if "vnni" in intrin else "vpmaddubsw") in asm


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
@pytest.mark.parametrize("seed", [4, 11])
def test_a_build_with_signed_data_is_bit_identical_to_the_emulation(signed_network, tmp_path, seed):
    q, lowered, x, _ = signed_network
    for d in ("extract", "out"):
        (tmp_path / d).mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    assert _commit_samples(lowered, HERE, tmp_path / "db", seed, kinds=("dot",)) == 3
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    y_emu, _ = emulate.run(q, [x])
    assert np.abs(y_emu).max() > 0
    assert np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), y_emu)


@pytest.mark.parametrize(
    "spec, intrin, instruction",
    [
        (HERE, int8_dot.AVX2_8, "vpmaddubsw"),
        (SKYLAKE, int8_dot.AVX2_8, "vpmaddubsw"),
        (CASCADELAKE, int8_dot.VNNI_8, "vpdpbusd"),
    ],
)
def test_int8_convs_in_blocks_of_8_get_the_8_lane_dot_product(int8_network, tmp_path, spec, intrin, instruction):
    # graph pack in blocks of 8 (mobilenet_v2's 24 and 144 channels): OIHW8o4i weights, the
    # dot product over 8 int32 lanes (one 256-bit register), the same nest around it
    q, _, _, _ = int8_network
    x86, report = graph_pack(q, PackParams(cfactor=8, stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    assert report.uint8_convs == 5
    lowered = lower_for_tuning(x86)
    dot = _packed_tasks(lowered, spec, "dot")
    assert sum(int(t.weight) for t in dot) == 5 and int8_dot.intrinsic_for(tvm.target.Target(spec), 8) == intrin
    for sch in _samples(dot[0].dispatched[0], spec, 2):
        assert packed_conv_space.tile_shape(sch)[3] == 8
        body = sch.mod.script()
        assert "int32x8" in body and "int32x16" not in body  # one 8-lane dot product per step
    # and LLVM takes it: the instruction on 256-bit registers in every conv (compiled, not run)
    assert _commit_samples(lowered, spec, tmp_path / "db", 4, kinds=("dot",)) == 4
    asm = _tuned_asm(lowered, spec, tmp_path / "db")
    on_ymm = re.findall(rf"{instruction}\s+[^\n]*%ymm", asm)
    assert len(on_ymm) >= 4 and not re.search(rf"{instruction}\s+[^\n]*%zmm", asm)


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
def test_an_int8_build_in_blocks_of_8_is_bit_identical_to_the_emulation(int8_network, tmp_path):
    q, _, x, _ = int8_network
    x86, _ = graph_pack(q, PackParams(cfactor=8, stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    lowered = lower_for_tuning(x86)
    (tmp_path / "extract").mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    (tmp_path / "out").mkdir()
    assert _commit_samples(lowered, HERE, tmp_path / "db", 4, kinds=("dot",)) == 4
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    y_emu, _ = emulate.run(q, [x])
    assert np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), y_emu)
    asm = _tuned_asm(lowered, HERE, tmp_path / "db")
    assert len(re.findall(r"vpmaddubsw\s+[^\n]*%ymm", asm)) >= 5


# ---- an int8 stem: the image's channels padded to 4, one dot-product group ------------------------
@pytest.fixture(scope="module")
def int8_stem_network():
    intrin_registry.load()
    int8_dot.register()
    model = randomize(Residual(), 0)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    q, _ = quantize(to_relax(model, x), QuantizeParams(skip_conv_layers=()))
    x86, _ = graph_pack(q, PackParams(start_name="nn.conv2d", layout="x86", stem=True))
    lowered = lower_for_tuning(x86)
    (stem,) = [t for t in _tasks(lowered, HERE) if _data_lanes(t.dispatched[0]) == 4]
    return q, lowered, x, stem


def _data_lanes(workload) -> int | None:
    """The innermost extent of the data a task's conv reads (a packed conv's data block)."""
    from tvm.s_tir import Schedule

    sch = Schedule(workload)
    block, _ = packed_conv_space._conv_block(sch)
    return None if block is None else int(sch.get(block).reads[0].source.shape[-1])


@pytest.mark.parametrize("spec, instruction", [(HERE, "vpmaddubsw"), (CASCADELAKE, "vpdpbusd")])
def test_an_int8_stem_gets_the_signed_dot_product_over_its_4_channels(int8_stem_network, tmp_path, spec, instruction):
    # the image is signed (normalized): the dot product's signed form, 16 lanes x the 4 channels
    _, lowered, _, stem = int8_stem_network
    target = tvm.target.Target(spec)
    assert packed_conv_space.conv_kind(stem.dispatched[0], target) == "dot"
    (sch,) = _samples(stem.dispatched[0], spec, 1)
    assert int8_dot.intrinsic_for(target, 16, signed=True) in str(sch.trace)
    assert _commit_samples(lowered, spec, tmp_path / "db", 4, kinds=("dot",)) >= 4
    asm = _tuned_asm(lowered, spec, tmp_path / "db")
    assert instruction in asm


@pytest.mark.skipif(not host_has_avx2, reason="this CPU has no AVX2: the tensorized module cannot run here")
def test_a_build_with_an_int8_stem_is_bit_identical_to_the_emulation(int8_stem_network, tmp_path):
    q, lowered, x, _ = int8_stem_network
    for d in ("extract", "out"):
        (tmp_path / d).mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    assert _commit_samples(lowered, HERE, tmp_path / "db", 11, kinds=("dot",)) >= 4
    build_network(tmp_path / "extract", HERE, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    y_emu, _ = emulate.run(q, [x])
    assert np.abs(y_emu).max() > 0
    assert np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), y_emu)


# ---- int8 depthwise convs on the dot product (graph pack's depthwise_dot) -------------------------
ICELAKE = {"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2}  # AVX512-VNNI and VBMI
host_has_vbmi = bool(
    codegen.target_has_features(
        ["avx512vnni", "avx512vbmi"], tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    )
)


def packed_convs(mod):
    from vta_pipeline.passes.graph import op_sequence

    return [o for o in op_sequence(mod) if o.name == "nn.conv2d" and str(o.call.attrs.data_layout) != "NCHW"]


@pytest.fixture(scope="module")
def depthwise_dot_network(int8_network):
    q, _, x, _ = int8_network
    x86, report = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86", depthwise_dot=True))
    return q, x86, lower_for_tuning(x86), x, report


def test_an_int8_depthwise_conv_on_non_negative_data_takes_its_taps_in_fours(int8_network, depthwise_dot_network):
    q, _, _, _ = int8_network
    _, x86, lowered, _, report = depthwise_dot_network
    plain, _ = graph_pack(q, PackParams(stop_name="nn.relu", stop_name_idx=4, layout="x86"))
    (before,) = [c for c in packed_convs(plain) if int(c.call.attrs.groups) != 1]
    (after,) = [c for c in packed_convs(x86) if int(c.call.attrs.groups) != 1]
    assert str(after.call.attrs.kernel_layout) == "OIHW16o4w"
    # its input keeps the type it had (int8, proven in [0, 127]): the conv writing it keeps its workload
    assert str(after.call.args[0].ty.dtype) == str(before.call.args[0].ty.dtype) == "int8"
    w3, w4 = before.call.args[1].value.numpy(), after.call.args[1].value.numpy()  # (C/16,1,3,3,16), (C/16,1,3,1,16,4)
    assert w4.shape == w3.shape[:3] + (1, 16, 4)
    assert np.array_equal(w4[:, :, :, 0, :, :3], w3.transpose(0, 1, 2, 4, 3)) and not w4[..., 3].any()
    pads = [int(p) for p in before.call.attrs.padding]
    assert [int(p) for p in after.call.attrs.padding] == pads[:3] + [pads[3] + 1]  # the zero tap reads one more column
    (task,) = [t for t in _tasks(lowered, ICELAKE) if "depthwise_conv2d_dot_packed" in t.task_name]
    kind = {
        name: packed_conv_space.conv_kind(task.dispatched[0], tvm.target.Target(spec))
        for name, spec in (("icelake", ICELAKE), ("cascadelake", CASCADELAKE), ("here", HERE))
    }
    # VNNI and VBMI: a row of taps per dot product; VNNI alone or AVX2: the same taps on int32 lanes
    assert kind == {"icelake": "depthwise_dot", "cascadelake": "depthwise", "here": "depthwise"}, kind
    for sch in _samples(task.dispatched[0], ICELAKE, 2):
        assert int8_dot.DEPTHWISE_VNNI in str(sch.trace)
        assert packed_conv_space.tile_registers(sch, 16) <= 32
    for sch in _samples(task.dispatched[0], HERE, 1):
        assert "T.vectorized(T.int64(16))" in sch.mod.script()


@pytest.mark.parametrize("seed", [4, 11])
def test_a_depthwise_dot_build_is_bit_identical_to_the_emulation(depthwise_dot_network, tmp_path, seed):
    """Built for this CPU: with VNNI and VBMI the depthwise kernel is `vpermb` + `vpdpbusd`
    (read off the assembly), else the taps in fours on int32 lanes; either way every output
    equals the integer emulation's."""
    q, _, lowered, x, _ = depthwise_dot_network
    if not host_has_avx2:
        pytest.skip("this CPU has no AVX2: the tensorized module cannot run here")
    spec, dw = (ICELAKE, "depthwise_dot") if host_has_vbmi else (HERE, "depthwise")
    for d in ("extract", "out"):
        (tmp_path / d).mkdir()
    (tmp_path / "extract" / "lowered.json").write_text(tvm.ir.save_json(lowered))
    assert _commit_samples(lowered, spec, tmp_path / "db", seed, kinds=("dot", dw)) == 5
    build_network(tmp_path / "extract", spec, tmp_path / "out", best_db_dir=tmp_path / "db")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "out" / LIB)), tvm.cpu())
    y_emu, _ = emulate.run(q, [x])
    assert np.abs(y_emu).max() > 0
    assert np.array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), y_emu)


def test_the_depthwise_kernel_is_vpermb_and_vpdpbusd(depthwise_dot_network, tmp_path):
    # only the depthwise task tuned: the module's one dot product is its kernel's (the other
    # int8 convs keep TVM's default lowering), and no int32 multiply is left in it
    _, _, lowered, _, _ = depthwise_dot_network
    assert _commit_samples(lowered, ICELAKE, tmp_path / "db", 3, kinds=("depthwise_dot",)) == 1
    asm = _tuned_asm(lowered, ICELAKE, tmp_path / "db")
    assert asm.count("vpermb") >= 3 and asm.count("vpdpbusd") == asm.count("vpermb") and "vpmulld" not in asm


class SqueezeExcite(nn.Module):
    """mobilenet_v3's gate: a 1x1 conv over the pooled channels, hardsigmoid, multiplied into
    every pixel of the block's output."""

    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(16, 32, 3, padding=1)
        self.gate = nn.Conv2d(32, 32, 1)

    def forward(self, x):
        x = torch.relu(self.body(x))
        g = nn.functional.hardsigmoid(self.gate(nn.functional.adaptive_avg_pool2d(x, 1)))
        return nn.functional.adaptive_avg_pool2d(x * g, 1)


def test_a_squeeze_excitation_gate_is_computed_once_and_its_broadcast_is_vectorized():
    # the gate's activation belongs to the conv's 32 outputs, not to every pixel it multiplies:
    # it stays in the tile's write-back, and the broadcast multiply is its own vectorized loop
    # (it was one scalar loop over the whole tensor, 2-3x the task's time on mobilenet_v3)
    from loop_nests import _blocks

    intrin_registry.load()
    model = randomize(SqueezeExcite(), 0)
    x = np.random.default_rng(0).standard_normal((1, 16, 8, 8)).astype("float32")
    lowered = lower_for_tuning(cpu_layout(to_relax(model, x))[0])  # what a run does by default
    gated = [t for t in _packed_tasks(lowered, HERE) if packed_conv_space.broadcast_epilogue(t.dispatched[0])]
    assert len(gated) == 1, [t.task_name for t in _packed_tasks(lowered, HERE)]
    wl = gated[0].dispatched[0]
    others = [t for t in _packed_tasks(lowered, HERE) if t.task_name != gated[0].task_name]
    assert others  # the body conv
    assert packed_conv_space.version("float", wl) == packed_conv_space.BROADCAST_EPILOGUE_VERSION
    assert all(
        packed_conv_space.version("float", t.dispatched[0]) < packed_conv_space.BROADCAST_EPILOGUE_VERSION
        for t in others
    )
    rng = np.random.default_rng(1)
    args = [rng.standard_normal([int(d) for d in p.shape]).astype(p.dtype) for p in wl["main"].params]

    def run(mod):
        tensors = [tvm.runtime.tensor(a) for a in args]
        tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})).mod(*tensors)
        return tensors[-1].numpy()

    expected = run(wl)
    for sch in _samples(wl, HERE, 2):
        found, _ = _blocks(sch.mod["main"])
        (multiply,) = [(loops, r) for loops, r in found if r.block.name_hint.startswith("T_multiply")]
        assert multiply[0][-1].kind == tvm.tirx.ForKind.VECTORIZED, sch.mod.script()
        assert "hardsigmoid" not in sch.mod.script() and "T.min(T.max(" in sch.mod.script()
        assert not any(r.block.name_hint.startswith(("T_divide", "T_minimum", "T_add")) for _, r in found)
        np.testing.assert_allclose(run(sch.mod), expected, rtol=1e-5, atol=1e-5)
