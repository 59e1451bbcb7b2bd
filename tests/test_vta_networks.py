"""The int8 VTA path on real networks: quantize + graph pack + task extraction, and the DAG.

Slow: each imports a full-size network (random weights) and runs the numpy integer
emulation of it. The full tune/build/evaluate runs of these networks are documented in
docs/int8-and-vta.md (they take tens of minutes here); the DAG test below tunes tinynet --vta.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from vta_pipeline import steps
from vta_pipeline.config import build_config
from vta_pipeline.extract import load_tasks, select_tasks
from vta_pipeline.store.artifacts import ArtifactStore

pytestmark = pytest.mark.slow

# The packed conv2d workloads the VTA recipe printed for resnet18 (every conv but the first).
RESNET18_VTA_WORKLOADS = {
    (1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1), (1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
    (1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2), (1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
    (1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2), (1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
    (1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1), (1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
    (1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2), (1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
}  # fmt: skip

# Pack points: the recipe's defaults where they work. mobilenet_v2 has no max pool and its
# 24-channel layers cannot be blocked by 16: packing starts after the 10th conv (24 -> 144).
# With random weights global_scale=8 rounds mobilenet_v2's tiny activations (~1e-9) to zero
# and saturates inception_v3's huge ones (~1e12): both are calibrated per activation.
NETWORKS = {
    "torchvision/resnet18": {},
    "gluon/resnet18_v1": {},
    "torchvision/mobilenet_v2": {
        "pack.start_name": "nn.conv2d",
        "pack.start_name_idx": 9,
        "quantize.calibrate_mode": "max",
    },
    "torchvision/inception_v3": {"quantize.calibrate_mode": "max"},
}


def _vta_cfg(store, source, name, extra):
    return build_config(None, {"model.source": source, "model.name": name, "quantize.enabled": True,
                               "pack.enabled": True, "store": str(store), **extra})  # fmt: skip


@pytest.mark.parametrize("net", list(NETWORKS))
def test_network_quantizes_packs_and_yields_packed_conv2d_tasks(net, tmp_path, host_target):
    source, name = net.split("/")
    store = ArtifactStore(tmp_path / "store")
    cfg = _vta_cfg(store.root, source, name, NETWORKS[net])
    packed = steps.prepare_model(store, cfg)
    quantized = store.find("quantize")[0]
    layers = [l for l in json.loads((quantized.path / "layers.json").read_text()) if l["kind"] == "conv2d"]
    assert not layers[0]["quantized"] and all(l["quantized"] for l in layers[1:])  # skip_conv_layers=[0]
    vs_float = quantized.meta["vs_float"]
    print(f"{net}: int8 (emulated) vs float: {vs_float}")
    assert vs_float["cosine"] > 0.999
    assert packed.meta["packed_ops"] > 20
    assert (
        "packed_conv2d" in (packed.path / "packed.py").read_text()
        or "NCHW1n16c" in (packed.path / "packed.py").read_text()
    )
    tasks = select_tasks(load_tasks(steps.extract_step(store, packed, host_target).path), "auto")
    assert tasks and all(t.op.startswith("packed_") for t in tasks)
    workloads = {tuple(t.workload) for t in tasks}
    if name == "resnet18":
        assert workloads == RESNET18_VTA_WORKLOADS
    assert all(w[3] % 16 == 0 and w[4] % 16 == 0 for w in workloads)
    if name == "resnet18":
        _integer_region_is_bit_exact(quantized.path, packed.path)


def _input_of_first(mod, name):
    """The module cut just before the first `name` operator: it returns that op's input."""
    from vta_pipeline.passes.graph import Rebuilder, op_sequence

    target = next(o for o in op_sequence(mod) if o.name == name).call.args[0]

    class Cut(Rebuilder):
        def finish(self, out):
            return self.lookup(target)

    return Cut().run(mod), target


def _integer_region_is_bit_exact(quantized_dir, packed_dir):
    """Up to the global pool (the end of the quantized region) the compiled packed network
    and the numpy emulation of the unpacked one agree bit for bit; after it, only the float
    classifier's rounding differs."""
    from int8_nets import build_run

    from vta_pipeline.fetch import load_module, load_reference
    from vta_pipeline.passes import emulate

    x, _ = load_reference(quantized_dir)
    packed_cut, _ = _input_of_first(load_module(packed_dir), "mean")
    qmod = load_module(quantized_dir)
    _, watched = emulate.run(qmod, [x], watch=[_input_of_first(qmod, "mean")[1]])
    (expected,) = watched.values()
    got = build_run(packed_cut, x)  # the global pool reads the packed blocks: back to NCHW here
    n, cb, h, w, b, c = got.shape
    got = got.transpose(0, 4, 1, 5, 2, 3).reshape(n * b, cb * c, h, w)
    assert got.shape == expected.shape and np.count_nonzero(expected) > expected.size // 10
    assert np.array_equal(got, expected)


def test_vta_dag_end_to_end_on_the_host_board(prefect_harness, board, tmp_path):
    """tinynet through fetch -> quantize -> pack -> extract -> tune -> build -> evaluate; the
    tuned int8 build on the board reproduces the integer emulation."""
    from vta_pipeline.flows.tune_network import tune_network

    store = ArtifactStore(tmp_path / "store")
    cfg = build_config(None, {
        "model.name": "tinynet", "quantize.enabled": True, "pack.enabled": True,
        "board.tracker": board.tracker, "board.key": board.key, "tune.trials_per_task": 4,
        "tune.trials_per_batch": 4, "measure.number": 2, "evaluate.repeat": 3, "store": str(store.root),
    }).model_dump(mode="json")  # fmt: skip
    result = tune_network(cfg)
    assert [t["task"].startswith("fused_conv2d_packed") for t in result["tasks"]] == [True] * 3
    assert result["tuned"]["correct"] and result["untuned"]["correct"]
    assert result["tuned"]["max_abs_err"] < 1e-5  # the emulation, to float rounding of the dense tail
    assert result["tuned"]["vs_float"]["cosine"] > 0.99
    assert set(result["transforms"]) == {"quantize", "pack"}
    computed = {e["step"] for e in store.events() if e["event"] == "computed"}
    assert {"fetch", "quantize", "pack", "extract", "tune", "build", "evaluate"} <= computed
