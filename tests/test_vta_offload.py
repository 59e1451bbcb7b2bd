"""Packed convs offloaded to VTA: each conv and its epilogue becomes one call of the board's
simulator, the rest of the network stays on the CPU, and the output does not change by a bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

from vta_pipeline import steps
from vta_pipeline.config import build_config
from vta_pipeline.passes.pipeline import lower_for_tuning
from vta_pipeline.passes.vta_offload import offload_convs
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.vta import runtime
from vta_pipeline.vta.config import VTAConfig
from vta_pipeline.vta.conv import ConvWorkload, Epilogue, Knobs, knob_space
from vta_pipeline.vta.network import time_on_board
from vta_pipeline.vta.tuner import local_measure

CFG = VTAConfig()


def _big_tiles(wl: ConvWorkload, epi: Epilogue) -> Knobs:
    """A config that fits and simulates quickly (large tiles, few instructions)."""
    return max(knob_space(wl, CFG, epi), key=lambda k: (k.tile_h * k.tile_w * k.tile_co * k.tile_ci, -k.h_nthread))


@pytest.fixture(scope="module")
def tinynet_packed(tmp_path_factory):
    """tinynet quantized and packed as `--vta` does: its module and its input."""
    root = tmp_path_factory.mktemp("store")
    cfg = build_config(
        None,
        {
            "model.source": "builtin",
            "model.name": "tinynet",
            "quantize.enabled": True,
            "pack.enabled": True,
            "store": str(root),
        },
    )
    packed = steps.prepare_model(ArtifactStore(root), cfg)
    mod = tvm.ir.load_json((packed.path / "module.json").read_text())
    return mod, np.load(packed.path / "reference.npz")["input"]


def _run_local(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(lower_for_tuning(mod), target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.slow
def test_tinynets_packed_convs_run_on_vta_and_the_output_is_bit_exact_with_the_cpu_build(tinynet_packed):
    mod, x = tinynet_packed
    offloaded, report = offload_convs(mod, CFG, _big_tiles)
    on_vta = [c for c in report if c.on_vta]
    assert len(report) == 3 and len(on_vta) == 2
    # the second conv adds the block's input after its requantize shift: added before it, shifted left
    plain, residual = (c.epilogue for c in on_vta)
    assert plain.residual_shift is None and plain.clip_min == 0 and plain.shift > 0
    assert residual.residual_shift == residual.shift
    # the last packed conv leaves the packed region as int32 (dequantized on the CPU)
    assert "int32" in report[2].reason or "float32" in report[2].reason
    text = offloaded.script()
    assert text.count(runtime.CONV2D) == 2 and text.count("R.nn.conv2d") == 2  # the stem and the last conv

    runtime.register()
    runtime.counters(reset=True)
    assert np.array_equal(_run_local(offloaded, x), _run_local(mod, x))
    counted = json.loads(runtime.counters())
    assert [c["calls"] for c in counted] == [1, 1]
    # the cycles of a network's call are those the tuner measures for the same config
    for c in on_vta:
        (m,) = local_measure(c.workload, c.epilogue, CFG)([c.knobs])
        (hit,) = [
            k
            for k in counted
            if k["spec"]["workload"] == c.workload.__dict__ and k["spec"]["epilogue"] == c.epilogue.__dict__
        ]
        assert hit["cycles"] == m.cycles > 0


def _chain(relu_before_residual: bool = False, second_reader: bool = False) -> tvm.IRModule:
    """A packed conv 16 -> 16 channels, 8x8, with bias, requantize, residual, clip."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 1, 8, 8, 1, 16], "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(rng.integers(-8, 8, (1, 1, 3, 3, 16, 16)).astype("int8")),
                    padding=[1, 1],
                    data_layout="NCHW1n16c",
                    kernel_layout="OIHW16o16i",
                    out_dtype="int32",
                )
            )
            v = bb.emit(relax.op.add(acc, relax.const(rng.integers(-99, 99, (1, 1, 1, 1, 1, 16)).astype("int32"))))
            if relu_before_residual:
                v = bb.emit(relax.op.nn.relu(v))
            v = bb.emit(relax.op.right_shift(relax.op.add(v, relax.const(4, "int32")), relax.const(3, "int32")))
            v = bb.emit(relax.op.add(v, bb.emit(relax.op.astype(x, "int32"))))
            v = bb.emit(relax.op.maximum(relax.op.minimum(v, relax.const(127, "int32")), relax.const(-127, "int32")))
            out = bb.emit(relax.op.astype(v, "int8"))
            if second_reader:
                out = bb.emit(relax.op.add(out, relax.op.astype(acc, "int8")))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def test_a_conv_is_left_on_the_cpu_when_its_epilogue_is_not_vtas_and_the_reason_is_given():
    _, report = offload_convs(_chain(relu_before_residual=True), CFG, _big_tiles)
    assert not report[0].on_vta and "ReLU before its residual" in report[0].reason
    _, report = offload_convs(_chain(second_reader=True), CFG, _big_tiles)
    assert not report[0].on_vta and "read by 2 operators" in report[0].reason


def test_a_hand_built_chain_is_offloaded_with_its_residual_and_stays_bit_exact():
    mod = _chain()
    offloaded, (conv,) = offload_convs(mod, CFG, _big_tiles)
    assert conv.on_vta and conv.epilogue == Epilogue(
        bias=True, residual_shift=3, round_add=4, shift=3, clip_min=-127, clip_max=127
    )
    runtime.register()
    x = np.random.default_rng(1).integers(-128, 128, (1, 1, 8, 8, 1, 16)).astype("int8")
    assert np.array_equal(_run_local(offloaded, x), _run_local(mod, x))


@pytest.mark.slow
def test_an_offloaded_network_runs_on_a_vta_sim_board_behind_the_tracker(tinynet_packed, tmp_path):
    from tvm import rpc

    from vta_pipeline.boards import LocalBoard

    mod, x = tinynet_packed
    offloaded, report = offload_convs(mod, CFG, _big_tiles)
    lib = tmp_path / "net.so"
    tvm.compile(lower_for_tuning(offloaded), target="llvm").export_library(str(lib))
    with LocalBoard(
        key="vta-sim", server_module="vta_pipeline.vta.rpc_server", threads=1, registry=tmp_path / "boards.json"
    ) as board:
        remote = rpc.connect_tracker(board.host, board.port).request("vta-sim", session_timeout=300)
        remote.upload(str(lib))
        vm = relax.VirtualMachine(remote.load_module(lib.name), remote.cpu(0))
        xr = tvm.runtime.tensor(x, remote.cpu(0))
        y = vm["main"](xr).numpy()
        counted = json.loads(str(remote.get_function(runtime.COUNTERS)(False)))  # the session's process
        timed = time_on_board(vm, remote.cpu(0), remote, [xr], repeat=2)
    runtime.register()
    assert np.array_equal(y, _run_local(mod, x))
    assert sorted(c["calls"] for c in counted) == [1, 1] and all(c["cycles"] > 0 for c in counted)
    # the network's time: its two convs simulated (timing only) at 100 MHz, the rest on the board's CPU
    expected = sum(local_measure(c.workload, c.epilogue, CFG)([c.knobs])[0].ms for c in report if c.on_vta)
    assert len(timed.convs) == 2 and timed.vta_ms == pytest.approx(expected)
    assert 0 < timed.cpu_ms < 1000 and timed.total_ms == timed.vta_ms + timed.cpu_ms


@pytest.mark.slow
def test_the_dag_runs_tinynet_on_a_vta_sim_board_with_its_convs_tuned_by_knobs(prefect_harness, tmp_path):
    """fetch -> quantize -> pack -> extract (convs offloaded) -> MetaSchedule tasks of the rest
    and knob tasks of the convs -> build -> evaluate on a local vta-sim board the flow starts."""
    from vta_pipeline.flows.tune_network import tune_network

    store = ArtifactStore(tmp_path / "store")
    cfg = build_config(None, {
        "model.name": "tinynet", "quantize.enabled": True, "pack.enabled": True, "target": "vta-sim",
        "tune.trials_per_task": 8, "tune.trials_per_batch": 4, "measure.number": 2, "evaluate.repeat": 2,
        "store": str(store.root),
    }).model_dump(mode="json")  # fmt: skip
    assert cfg["board"]["key"] == "vta-sim"
    result = tune_network(cfg)
    assert result["untuned"]["correct"] and result["tuned"]["correct"]
    assert result["tuned"]["max_abs_err"] < 1e-5  # the integer emulation, to float rounding of the dense tail
    v = result["vta"]
    assert [t["count"] for t in v["tasks"]] == [1, 1] and v["peak_gops"] == pytest.approx(51.2)
    for t in v["tasks"]:
        assert t["tuned_ms"] < t["untuned_ms"] and t["trials"] == 8 and 0 < t["of_peak"] <= 1
    net = v["network"]
    # the network's convs take what their tasks' configs took when tuned: the epilogue's numbers change no cycle
    assert net["tuned"]["vta_ms"] == pytest.approx(sum(t["tuned_ms"] * t["count"] for t in v["tasks"]))
    assert net["untuned"]["vta_ms"] == pytest.approx(sum(t["untuned_ms"] * t["count"] for t in v["tasks"]))
    assert result["tuned"]["mean_ms"] == pytest.approx(net["tuned"]["vta_ms"] + net["tuned"]["cpu_ms"])
    computed = {e["step"] for e in store.events() if e["event"] == "computed"}
    assert {"extract", "vta_tune", "tune", "build", "evaluate"} <= computed


@pytest.mark.slow
def test_every_packed_conv_of_resnet18_runs_on_vta_and_the_network_is_bit_exact(tmp_path):
    """With int8 activations (vta-sim's default) every conv but the float stem is offloaded:
    the recipe's ten workloads (three of them also as a block's second conv, with its residual)
    and the downsampling 1x1 convs; the network's output is the CPU build's, bit for bit."""
    root = tmp_path / "store"
    cfg = build_config(
        None,
        {
            "model.source": "torchvision",
            "model.name": "resnet18",
            "quantize.enabled": True,
            "pack.enabled": True,
            "target": "vta-sim",
            "store": str(root),
        },
    )
    assert cfg.quantize.dtype_activation == "int8"
    packed = steps.prepare_model(ArtifactStore(root), cfg)
    mod = tvm.ir.load_json((packed.path / "module.json").read_text())
    offloaded, report = offload_convs(mod, CFG, _big_tiles)
    assert len(report) == 19 and all(c.on_vta for c in report), [c.reason for c in report if not c.on_vta]
    workloads = {tuple(c.workload.__dict__.values())[:11] for c in report}
    assert all(c.workload.groups == 1 for c in report)
    from test_vta_networks import RESNET18_VTA_WORKLOADS

    assert workloads == RESNET18_VTA_WORKLOADS
    assert sum(c.epilogue.residual_shift is not None for c in report) == 8  # each basic block's second conv
    runtime.register()
    x = np.load(packed.path / "reference.npz")["input"]
    assert np.array_equal(_run_local(offloaded, x), _run_local(mod, x))


def test_a_depthwise_conv_with_relu6_before_its_requantize_is_offloaded_and_stays_bit_exact():
    """mobilenet_v2's pattern: a depthwise conv (graph pack's OIHW16o kernel), its bias, ReLU6 at
    the accumulator's scale, then the requantize. The clip folds into the epilogue's final clip
    through the monotone requantize; the depthwise conv runs as GEMMs on diagonal tiles."""
    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 2, 8, 8, 1, 16], "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(rng.integers(-64, 64, (2, 1, 3, 3, 16)).astype("int8")),
                    strides=[2, 2],
                    padding=[1, 1],
                    groups=32,
                    data_layout="NCHW1n16c",
                    kernel_layout="OIHW16o",
                    out_dtype="int32",
                )
            )
            v = bb.emit(relax.op.add(acc, relax.const(rng.integers(-500, 500, (1, 2, 1, 1, 1, 16)).astype("int32"))))
            v = bb.emit(relax.op.maximum(relax.op.minimum(v, relax.const(3000, "int32")), relax.const(0, "int32")))
            v = bb.emit(relax.op.right_shift(relax.op.add(v, relax.const(16, "int32")), relax.const(5, "int32")))
            v = bb.emit(relax.op.maximum(relax.op.minimum(v, relax.const(127, "int32")), relax.const(-127, "int32")))
            gv = bb.emit_output(bb.emit(relax.op.astype(v, "int8")))
        bb.emit_func_output(gv)
    mod = bb.get()
    offloaded, (conv,) = offload_convs(mod, CFG, lambda wl, epi: Knobs(tile_w=4))
    assert conv.on_vta and conv.workload.depthwise and conv.workload.groups == 32
    assert (conv.epilogue.clip_min, conv.epilogue.clip_max) == (0, (3000 + 16) >> 5)
    runtime.register()
    x = rng.integers(-128, 128, (1, 2, 8, 8, 1, 16)).astype("int8")
    assert np.array_equal(_run_local(offloaded, x), _run_local(mod, x))
