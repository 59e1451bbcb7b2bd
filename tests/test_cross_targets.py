"""Targets beyond this CPU: what can be proven without the boards.

Cross builds for the ARM presets are real libraries for the board (checked with `file`);
the Mali build carries OpenCL kernels beside aarch64 host code; the CUDA build carries CUDA
kernels. Task extraction works for every preset, and reads the same conv workloads from the
GPU presets' NHWC lowering as from NCHW. Running on a GPU needs one: those tests skip
without it.

The cross compilers come from Debian (g++-arm-linux-gnueabihf, g++-aarch64-linux-gnu);
`.ci/run` installs them and sets VTA_PIPELINE_REQUIRE_CROSS=1 so that CI fails, not skips,
without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from vta_pipeline import steps
from vta_pipeline.config import ModelConfig, build_config
from vta_pipeline.extract import load_tasks, select_tasks
from vta_pipeline.store.artifacts import ArtifactStore
from vta_pipeline.targets import resolve_target

pytestmark = pytest.mark.slow

CROSS = {"pynq-arm": "ELF 32-bit LSB shared object, ARM", "rk3399-cpu": "ELF 64-bit LSB shared object, ARM aarch64"}
TOOLS = ("arm-linux-gnueabihf-g++", "aarch64-linux-gnu-g++", "file")
missing = [t for t in TOOLS if shutil.which(t) is None]
if missing and os.environ.get("VTA_PIPELINE_REQUIRE_CROSS"):
    raise RuntimeError(
        f"cross toolchain missing: {missing}; apt-get install g++-arm-linux-gnueabihf g++-aarch64-linux-gnu file"
    )
needs_cross = pytest.mark.skipif(bool(missing), reason=f"not installed: {missing}")


def _file(path) -> str:
    return subprocess.run(["file", "-b", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ArtifactStore(tmp_path_factory.mktemp("cross-store"))


def _build(store, model: str, source: str, target: str, int8: bool = False):
    values = {"model.source": source, "model.name": model, "target": target}
    if int8:
        values.update({"quantize.enabled": True, "pack.enabled": True})
    cfg = build_config(None, values)
    tgt = resolve_target(cfg.target)
    steps.check_target(cfg, tgt)
    extracted = steps.extract_step(store, steps.prepare_model(store, cfg), tgt)
    return extracted, steps.build_step(store, extracted, None, tgt).file("model.so")


@needs_cross
@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8-packed"])
@pytest.mark.parametrize("target", list(CROSS))
def test_resnet18_cross_builds_into_a_library_for_the_board(store, target, int8):
    extracted, lib = _build(store, "resnet18", "torchvision", target, int8)
    assert _file(lib).startswith(CROSS[target])
    tasks = load_tasks(extracted.path)
    if int8:  # the VTA recipe's tasks: every conv but the first, packed
        assert len(select_tasks(tasks, "auto")) == len([t for t in tasks if t.op == "packed_conv2d"]) >= 10
    else:
        assert {tuple(t.workload) for t in tasks if t.op == "conv2d"} >= {(1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1)}


@needs_cross
def test_mali_build_carries_opencl_kernels_beside_aarch64_host_code(store):
    _, lib = _build(store, "micronet", "builtin", "rk3399-mali")
    assert _file(lib).startswith(CROSS["rk3399-cpu"])
    data = lib.read_bytes()
    assert b"__kernel void fused_conv2d_add_relu_kernel" in data and b"__kernel void fused_conv2d1_add_relu" in data


def test_cuda_builds_without_a_gpu_and_carries_cuda_kernels(store):
    _, lib = _build(store, "micronet", "builtin", "cuda:sm_86")
    data = lib.read_bytes()
    assert b'extern "C" __global__' in data and b"fused_conv2d_add_relu_kernel" in data


@pytest.mark.parametrize("target", ["pynq-arm", "rk3399-cpu", "rk3399-mali", "cuda"])
def test_task_extraction_reads_the_same_conv_workloads_for_every_preset(store, host_target, target):
    fetched = steps.fetch_step(store, ModelConfig(source="builtin", name="tinynet"))
    ref = sorted(
        tuple(t.workload)
        for t in load_tasks(steps.extract_step(store, fetched, host_target).path)
        if t.op in ("conv2d", "depthwise_conv2d")
    )
    tgt = resolve_target(target)
    extracted = steps.extract_step(store, fetched, tgt)
    tasks = load_tasks(extracted.path)
    got = sorted(tuple(t.workload) for t in tasks if t.op in ("conv2d", "depthwise_conv2d"))
    assert got == ref and len(ref) >= 2  # NHWC on the GPUs, NCHW on the CPUs: same convs
    if tgt.layout == "NHWC":
        convs = [t for t in tasks if t.op == "conv2d"]
        assert all("conv2d_nhwc" in (extracted.path / t.file).read_text() for t in convs)


@needs_cross
def test_tuning_candidates_are_linked_for_the_board(micronet):
    """MetaSchedule's builder links each candidate with the preset's cross compiler, so the
    board needs no compiler of its own."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from vta_pipeline.boards.builder import make_builder

    _, extracted = micronet
    task = select_tasks(load_tasks(extracted.path), "conv2d")[0]
    rk = resolve_target("rk3399-cpu")
    mod = tvm.ir.load_json((extracted.path / task.file).read_text())
    (built,) = make_builder(120, max_workers=1, cross_compiler=rk.cross_compiler).build(
        [ms.builder.BuilderInput(mod, rk.tvm_target())]
    )
    assert built.error_msg is None, built.error_msg
    assert _file(built.artifact_path).startswith(CROSS["rk3399-cpu"])


def test_a_board_without_the_gpu_runtime_is_named_before_tuning(board):
    from vta_pipeline.boards import device_params
    from vta_pipeline.errors import BoardError

    with pytest.raises(BoardError, match=f"{board.key!r}.*no opencl device"):
        device_params(board.host, board.port, board.key, "opencl")


def _has_cuda() -> bool:
    import tvm

    return shutil.which("nvidia-smi") is not None and tvm.cuda(0).exist


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU")
def test_cuda_tunes_builds_and_evaluates_on_a_local_gpu_board(prefect_harness, tmp_path):
    """The whole flow on a CUDA board: a local rpc server on this GPU machine."""
    from vta_pipeline.flows.tune_network import tune_network

    cfg = build_config(
        None,
        {
            "model.source": "builtin",
            "model.name": "micronet",
            "target": "cuda",
            "board.key": "cuda",
            "tune.trials_per_task": 8,
            "tune.trials_per_batch": 8,
            "tune.task_filter": "conv2d",
            "evaluate.repeat": 5,
            "store": str(tmp_path / "store"),
        },
    )
    result = tune_network(cfg.model_dump(mode="json"))
    assert result["tuned"]["correct"] and result["untuned"]["correct"]
    assert all(t["best_gflops"] > 0 for t in result["tasks"])
