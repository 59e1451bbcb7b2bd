"""Step 2: tuning tasks with weights and the VTA recipe's conv2d workload tuples."""

import json

import pytest
from typer.testing import CliRunner

from vta_pipeline import steps
from vta_pipeline.config import ModelConfig
from vta_pipeline.extract import load_tasks, select_tasks


def test_micronet_tasks_and_workloads(micronet):
    _, extracted = micronet
    tasks = load_tasks(extracted.path)
    convs = sorted(t.workload for t in tasks if t.op == "conv2d")
    # (batch, height, width, in_filter, out_filter, kh, kw, pad_h, pad_w, stride_h, stride_w)
    assert convs == [[1, 16, 16, 3, 16, 3, 3, 1, 1, 1, 1], [1, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1]]
    assert all(t.weight >= 1 and (extracted.path / t.file).exists() for t in tasks)
    assert len(select_tasks(tasks, "conv2d")) == 2 < len(select_tasks(tasks, "all"))


def test_auto_tunes_what_runs_on_the_cpu():
    from vta_pipeline.extract import TaskInfo

    def task(name: str, op: str) -> TaskInfo:
        return TaskInfo(index=0, name=name, weight=1, flops=1.0, file=f"{name}.json", workload_hash=name, op=op)

    stem, dense, quant = task("conv2d1", "conv2d"), task("fused_matmul_add", "dense"), task("fused_round_clip", "other")
    vta = [stem, task("fused_conv2d_packed", "packed_conv2d"), dense, quant]
    x86 = [stem, task("fused_conv2d_dot_packed1_add5", "packed_conv2d"), dense, quant]
    # VTA's recipe: only the packed convs (the rest runs on the board's CPU)
    assert [t.name for t in select_tasks(vta, "auto")] == ["fused_conv2d_packed"]
    # the x86 layout runs wholly on the CPU: the classifier and the quantize are tuned too
    assert select_tasks(x86, "auto") == x86 == select_tasks(x86, "all")
    assert select_tasks(vta, "auto", packed_float=True) == vta
    assert [t.name for t in select_tasks(x86, "conv2d")] == ["conv2d1", "fused_conv2d_dot_packed1_add5"]


def test_tinynet_strided_conv_and_batch_norm_folded(session_store, host_target):
    fetched = steps.fetch_step(session_store, ModelConfig(source="builtin", name="tinynet"))
    tasks = load_tasks(steps.extract_step(session_store, fetched, host_target).path)
    wl = {tuple(t.workload) for t in tasks if t.workload}
    assert (1, 32, 32, 32, 64, 3, 3, 1, 1, 2, 2) in wl  # the strided down-sampling conv
    assert not any("batch_norm" in t.name or "divide" in t.name for t in tasks)  # BN folded away


def test_extraction_is_reused_for_the_same_model_and_target(micronet, session_store, host_target):
    fetched, extracted = micronet
    again = steps.extract_step(session_store, fetched, host_target)
    assert again.key == extracted.key and again.id == extracted.id


@pytest.mark.slow
def test_tasks_json_for_torchvision_resnet18(tmp_path):
    from vta_pipeline.cli.main import app

    r = CliRunner().invoke(
        app, ["tasks", "--source", "torchvision", "--model", "resnet18", "--store", str(tmp_path), "--json"]
    )
    assert r.exit_code == 0, r.output
    tasks = json.loads(r.stdout)
    workloads = {tuple(t["workload"]) for t in tasks if "workload" in t}
    # the conv2d workloads of resnet18 at 224x224 (the VTA recipe's table)
    expected = {
        (1, 224, 224, 3, 64, 7, 7, 3, 3, 2, 2),
        (1, 56, 56, 64, 64, 3, 3, 1, 1, 1, 1),
        (1, 56, 56, 64, 128, 3, 3, 1, 1, 2, 2),
        (1, 56, 56, 64, 128, 1, 1, 0, 0, 2, 2),
        (1, 28, 28, 128, 128, 3, 3, 1, 1, 1, 1),
        (1, 28, 28, 128, 256, 3, 3, 1, 1, 2, 2),
        (1, 28, 28, 128, 256, 1, 1, 0, 0, 2, 2),
        (1, 14, 14, 256, 256, 3, 3, 1, 1, 1, 1),
        (1, 14, 14, 256, 512, 3, 3, 1, 1, 2, 2),
        (1, 14, 14, 256, 512, 1, 1, 0, 0, 2, 2),
        (1, 7, 7, 512, 512, 3, 3, 1, 1, 1, 1),
    }
    assert workloads == expected
    assert all(t["weight"] >= 1 and t["name"] for t in tasks)
    assert sum(t["weight"] for t in tasks if "workload" in t) >= 17  # 20 convs, some deduplicated
